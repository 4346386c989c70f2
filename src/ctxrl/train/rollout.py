"""The batched multi-turn rollout loop: many episodes of the harness at once, one engine call per step.

    result = rollout(engine, tokenizer, tasks, RolloutConfig(group_size=4, mode="file"))
    result.episodes      # one EpisodeRecord per (task, member of its group), see ctxrl.train.trajectory
    result.stats         # wall time, time in the engine, env steps, tokens

One iteration of the loop (DESIGN data flow, steps 3-5):

1. **Generate.** Every live episode's prompt ids go to the engine in ONE batched ``generate`` call.
2. **Step.** In a thread pool, each episode decodes its generated ids (special tokens kept), parses the tool
   calls (:func:`ctxrl.env.actions.parse_tool_calls`; a malformed call becomes ``invalid_tool_call`` and gets
   a format receipt), lets the harness apply the action (sandbox commands, edits, receipts, budget readout,
   rollback), computes the step's edit mask, and builds its next prompt ids.
3. **End.** An episode that submitted or hit a limit is scored by its task's verifier, its prompts are
   replayed through the prefix-cache cost model, and its workspace is removed. This work is submitted to
   the pool and **overlaps the next batched generate call** (the verifier may run a sandboxed test suite).

Steps of different episodes overlap each other in the pool (sandbox commands are subprocesses; the GIL is
released while they run); steps never overlap the generate call they depend on.

**Prompt ids (token in, token out).** The first prompt is the chat template rendered over the reset
messages (system prompt with the skill, the task, the tools) with the generation prompt, tokenised. After
a step that only appended turns, the next prompt is built *incrementally*:

    next = prompt + generated + encode(close + tail)

where ``generated`` are the ids exactly as sampled (the stop token included); ``close`` is the text the
chat template writes after an assistant message's content (``<|im_end|>\\n`` for ChatML), less the stop
token when the model produced it (so ``\\n``), all of it when generation was cut by the token budget;
and ``tail`` is ``render(messages, generation_prompt=True)`` minus ``render(messages[:k+1])``, the text the
template adds for the turns after the assistant turn (tool results, notes) and the generation prompt,
where ``messages[:k]`` is the previous prompt's messages. So an append-only stretch is an exact token
prefix of every later prompt in it, and what the model sampled is never re-rendered or re-tokenised.
The prompt is **rebuilt** from ``render(messages, generation_prompt=True)`` when the step edited the
context or rolled it back (``edit``), when the messages before the new assistant turn changed (``history``,
e.g. the harness merged a note into an earlier turn, or dropped an empty assistant turn), or when the
template does not render the messages append-only (``template``). Every step records which it was.

**Edit mask.** A tool call targeted the context when the harness wrote a receipt for it (file mode: the
shell command changed or named the context file; tool modes: a context tool), or when it called one of
the mode's own context tools (tool and usage modes). The mask marks those calls' generated tokens
(:func:`ctxrl.rewards.masks.edit_mask`).

**Ends.** Besides the harness's reasons (submit, max_steps, max_lm_calls, overflow), an episode whose
next prompt leaves no room for one new token under ``engine.max_model_len`` ends with ``max_model_len``
before any call (and an engine-aborted generation ends it with ``aborted``); it is scored with an empty
answer. Nothing waits on such an episode: the loop ends when no episode is live.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ctxrl.env.actions import FORMAT_ERROR_TOOL, parse_tool_calls
from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import ChatTemplateCounter, ToolCall
from ctxrl.env.gym_env import MODES, TaskToolsMode, make_mode, task_harness_config
from ctxrl.env.harness import Action, Harness, StepResult
from ctxrl.env.modes.common import store_root
from ctxrl.env.sandbox import Sandbox, SandboxConfig
from ctxrl.env.skills import DEFAULT_SKILLS, system_prompt
from ctxrl.env.tasks.base import Task
from ctxrl.errors import ConfigError
from ctxrl.rewards.cost import ModelGeometry, episode_cost, replay_episode, step_flops
from ctxrl.rewards.masks import MaskSetting, edit_mask
from ctxrl.train.engines.base import Engine, Generation, SamplingConfig
from ctxrl.train.trajectory import EpisodeRecord, StepCost, StepRecord, skill_id

Messages = list[dict[str, Any]]


@dataclass(frozen=True)
class RolloutConfig:
    """Settings of one rollout: groups, mode, sampling, harness limits, workers."""

    group_size: int = 4
    """G: episodes per task (the group the advantages normalise over)."""
    mode: str = "file"
    """Context-management mode (``file``, ``tools``, ``usage``, ``harness``, ``append``)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling settings of every generate call."""
    harness: HarnessConfig | None = None
    """Harness config of every episode; None: the defaults with each task's budget and step limit."""
    max_steps: int | None = None
    """Override of the harness's task-step limit (e.g. short episodes in tests); None keeps it."""
    sandbox: SandboxConfig | None = None
    """Override of the harness's sandbox settings; None keeps them."""
    skill: str | None = None
    """Skill text in the system prompt; None: the mode's default skill."""
    workers: int = 8
    """Threads that run environment steps, resets and episode ends."""
    keep_workspaces: bool = False
    """Keep each episode's workspace after it ends (for debugging); by default it is removed."""
    cache_block_size: int = 16
    """Block size of the prefix-cache cost replay (16 on GPUs; vLLM's CPU backend uses 128)."""
    mask_setting: MaskSetting = "edit_tokens"
    """Which tokens the edit mask marks (:func:`ctxrl.rewards.masks.edit_mask`)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"unknown mode {self.mode!r}; modes: {', '.join(MODES)}")
        if self.group_size < 1:
            raise ConfigError(f"group_size must be >= 1, got {self.group_size}")
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1 (or None), got {self.max_steps}")
        if self.cache_block_size < 1:
            raise ConfigError(f"cache_block_size must be >= 1, got {self.cache_block_size}")

    def episode_config(self, task: Task, count_tokens: Callable[[str], int]) -> HarnessConfig:
        """The harness config of an episode of ``task``: ``harness`` if set, else
        :func:`ctxrl.env.gym_env.task_harness_config` (the task's budget in the policy tokenizer's tokens,
        counted by ``count_tokens``) — the rule :class:`~ctxrl.env.gym_env.ContextEnv` applies too.
        ``max_steps`` and ``sandbox`` then override."""
        cfg = self.harness if self.harness is not None else task_harness_config(task, count_tokens)
        if self.max_steps is not None:
            cfg = replace(cfg, max_steps=self.max_steps, max_lm_calls=None)
        if self.sandbox is not None:
            cfg = replace(cfg, sandbox=self.sandbox)
        return cfg


@dataclass
class RolloutStats:
    """Counters of one rollout: time in the engine and the environment, calls, steps and tokens."""

    wall_s: float = 0.0
    generate_s: float = 0.0
    """Seconds inside ``engine.generate``."""
    env_s: float = 0.0
    """Seconds of the batched environment steps (the pool's wall time, not the sum over threads)."""
    generate_calls: int = 0
    env_steps: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens the engine reported as served from its prefix cache."""

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of engine time."""
        return self.generated_tokens / self.generate_s if self.generate_s > 0 else 0.0

    @property
    def env_steps_per_s(self) -> float:
        """Environment steps per second of wall time (generation included)."""
        return self.env_steps / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def cached_share(self) -> float:
        """Share of prompt tokens the engine served from its prefix cache."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def metrics(self) -> dict[str, float]:
        """Namespaced metrics of the rollout."""
        return {
            "rollout/wall_s": self.wall_s,
            "rollout/generate_s": self.generate_s,
            "rollout/env_s": self.env_s,
            "rollout/generate_calls": float(self.generate_calls),
            "rollout/env_steps": float(self.env_steps),
            "rollout/env_steps_per_s": self.env_steps_per_s,
            "rollout/prompt_tokens": float(self.prompt_tokens),
            "rollout/generated_tokens": float(self.generated_tokens),
            "rollout/tokens_per_s": self.tokens_per_s,
            "rollout/cached_share": self.cached_share,
        }


@dataclass
class RolloutResult:
    """The episodes (grouped by task, in task order, then by index) and the rollout's counters."""

    episodes: list[EpisodeRecord]
    stats: RolloutStats


_MARK = "\u2063ctxrl-mark\u2063"
"""A string no template writes on its own: finds where an assistant message's content ends in a render."""


class PromptBuilder:
    """Prompt ids from chat messages with a tokenizer's chat template; exact prefixes over append-only steps.

    See the module docstring for the rule. Thread-safe: encoding goes through the Rust tokenizer directly
    (``PreTrainedTokenizerFast.__call__`` mutates padding state and is not safe across threads).
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        probe = self.render([{"role": "user", "content": "."}, {"role": "assistant", "content": _MARK}])
        if _MARK not in probe:
            raise ConfigError("the tokenizer's chat template does not render assistant message content")
        self.turn_close = probe[probe.rindex(_MARK) + len(_MARK) :]
        """Text the template writes after an assistant message's content (``<|im_end|>\\n`` for ChatML)."""

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        generation_prompt: bool = False,
    ) -> str:
        text: str = self.tokenizer.apply_chat_template(
            list(messages),
            tools=list(tools) if tools else None,
            add_generation_prompt=generation_prompt,
            tokenize=False,
        )
        return text

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, special-token markup recognised, nothing added (no BOS)."""
        if self._backend is not None:
            return list(self._backend.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens kept."""
        if self._backend is not None:
            return str(self._backend.decode(list(ids), skip_special_tokens=False))
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def full(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> list[int]:
        """The prompt ids of ``messages`` rendered whole, with the generation prompt."""
        return self.encode(self.render(messages, tools, generation_prompt=True))

    def extend(
        self,
        prompt: list[int],
        generation: Generation,
        before: Sequence[Mapping[str, Any]],
        after: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
    ) -> tuple[list[int] | None, str | None]:
        """The next prompt built on ``prompt`` + the generated ids, or ``(None, reason)`` when it cannot be.

        ``before`` are the messages ``prompt`` was rendered from; ``after`` the messages after the step (the
        new assistant turn at ``len(before)``, then the appended turns). Reasons: ``history`` (the messages
        before the assistant turn changed), ``template`` (the template does not render append-only).
        """
        k = len(before)
        if len(after) <= k or list(after[:k]) != list(before) or after[k].get("role") != "assistant":
            return None, "history"
        head = self.render(before, tools, generation_prompt=True)
        upto = self.render(after[: k + 1], tools)
        whole = self.render(after, tools, generation_prompt=True)
        if not upto.startswith(head) or not whole.startswith(upto) or not upto.endswith(self.turn_close):
            return None, "template"
        close = self.turn_close
        ids = list(generation.token_ids)
        if generation.finish_reason == "stop" and ids:
            stop_text = self.decode(ids[-1:])
            if stop_text and close.startswith(stop_text):
                close = close[len(stop_text) :]  # the model already wrote the stop token: keep it as sampled
        return [*prompt, *ids, *self.encode(close + whole[len(upto) :])], None


def context_edit_tools(mode: str) -> frozenset[str]:
    """The mode's own tools that edit the context (their calls are edit calls whatever their receipt says)."""
    if mode == "tools":
        from ctxrl.env.modes.tools import CONTEXT_TOOLS

        return frozenset(CONTEXT_TOOLS) - {"context_status"}
    if mode == "usage":
        return frozenset({"evict_file_view", "archive_thread"})
    return frozenset()


def edit_call_indices(calls: Sequence[ToolCall], result: StepResult, edit_tools: frozenset[str]) -> list[int]:
    """Indices of the action's calls that targeted the context: a mode's context-editing tool, or a shell
    command whose result carries one of the step's context receipts (it changed or named the context file).

    The harness appends one result per call, in order, so ``result.observations[i]`` is call ``i``'s result.
    """
    receipts = [r.text for r in result.receipts]
    chosen = []
    for i, call in enumerate(calls):
        if call.name == FORMAT_ERROR_TOOL:
            continue
        shown = result.observations[i] if i < len(result.observations) else ""
        if call.name in edit_tools or (call.name == "shell" and any(r in shown for r in receipts)):
            chosen.append(i)
    return chosen


class _Episode:
    """One live episode: its harness, its current prompt ids and messages, the steps so far."""

    def __init__(
        self,
        task: Task,
        group: int,
        index: int,
        config: RolloutConfig,
        workspace: Path,
        builder: PromptBuilder,
    ) -> None:
        self.task, self.group, self.index = task, group, index
        self.rollout_config = config
        self.config = config.episode_config(task, lambda text: len(builder.encode(text)))
        self.workspace = workspace
        self.builder = builder
        self.skill = config.skill if config.skill is not None else DEFAULT_SKILLS[config.mode]
        self.edit_tools = context_edit_tools(config.mode)
        self.harness: Harness | None = None
        self.messages: Messages = []
        self.tools: list[dict[str, Any]] = []
        self.prompt_ids: list[int] = []
        self.source = "reset"
        self.rebuild_reason: str | None = None
        self.steps: list[dict[str, Any]] = []
        """Per step: everything of its :class:`StepRecord` but the cost (priced when the episode ends)."""
        self.end_reason: str | None = None
        self.answer: str | None = None
        self.record: EpisodeRecord | None = None

    @property
    def done(self) -> bool:
        return self.end_reason is not None

    def reset(self) -> None:
        """Materialise the task and start the harness; build the first prompt."""
        self.task.materialize(self.workspace)
        mode = TaskToolsMode(make_mode(self.rollout_config.mode, self.config), self.task)
        self.harness = Harness(self.config, ChatTemplateCounter(self.builder.tokenizer), mode=mode)
        prompt = system_prompt(self.skill, self.config.context_file)
        self.messages = self.harness.reset(prompt, self.task.prompt, self.workspace)
        self.tools = self.harness.tools
        self.prompt_ids = self.builder.full(self.messages, self.tools)

    def step(self, gen: Generation) -> int:
        """Apply one generation: parse its tool calls, step the harness, record, build the next prompt.

        Returns the number of environment steps taken (0 for an aborted generation, which ends the episode).
        """
        assert self.harness is not None
        text = self.builder.decode(gen.token_ids)
        prose, calls = parse_tool_calls(text)
        record: dict[str, Any] = {
            "prompt_ids": list(self.prompt_ids),
            "token_ids": list(gen.token_ids),
            "logprobs": list(gen.logprobs),
            "finish_reason": gen.finish_reason,
            "num_cached_tokens": gen.num_cached_tokens,
            "prompt_source": self.source,
            "rebuild_reason": self.rebuild_reason,
            "text": text,
            "tool_calls": [c.name for c in calls],
        }
        if gen.finish_reason == "abort":
            self.steps.append({**record, **_NO_ACTION, "context_tokens": self.harness.context.tokens})
            self.end_reason = "aborted"
            return 0
        # Count the budget in the engine's tokens: the prompt ids are exactly what the engine saw.
        self.harness.context.calibrate(len(self.prompt_ids))
        result = self.harness.step(Action(prose, calls))
        edits = edit_call_indices(calls, result, self.edit_tools)
        mask = edit_mask(
            gen.token_ids, self.builder.tokenizer, edit_calls=edits, setting=self.rollout_config.mask_setting
        )
        self.steps.append(
            {
                **record,
                "edit_mask": mask,
                "edit_calls": edits,
                "receipts": [r.text for r in result.receipts],
                "receipt_kinds": [str(r.kind) for r in result.receipts],
                "readout": result.readout,
                "nudges": list(result.nudges),
                "context_tokens": result.tokens,
                "edited": result.edited,
                "free_turn": result.free_turn,
            }
        )
        if result.done:
            self.end_reason, self.answer = result.reason, result.answer
            return 1
        self._next_prompt(gen, result)
        return 1

    def _next_prompt(self, gen: Generation, result: StepResult) -> None:
        assert self.harness is not None
        messages, tools = self.harness.context.to_messages(), self.harness.tools
        ids: list[int] | None = None
        reason: str | None = "edit" if result.edited else "history" if tools != self.tools else None
        if reason is None:
            ids, reason = self.builder.extend(self.prompt_ids, gen, self.messages, messages, tools)
        if ids is None:
            ids = self.builder.full(messages, tools)
        self.source = "extend" if reason is None else "rebuild"
        self.rebuild_reason = reason
        self.prompt_ids, self.messages, self.tools = ids, messages, tools

    def finish(self, engine_name: str, geometry: ModelGeometry | None) -> EpisodeRecord:
        """Grade the answer, price the episode by replaying its prompts, remove the workspace."""
        cfg = self.config
        verdict = self.task.verifier.verify(
            self.answer or "", self.workspace, lambda ws: Sandbox(ws, cfg.sandbox)
        )
        replay = replay_episode(
            [(s["prompt_ids"], s["token_ids"]) for s in self.steps],
            block_size=self.rollout_config.cache_block_size,
        )
        steps = [
            StepRecord(
                **s,
                cost=StepCost(
                    prompt_tokens=r.prompt,
                    cached_tokens=r.cached,
                    generated_tokens=r.generated,
                    flops=step_flops(r, geometry) if geometry is not None else None,
                ),
            )
            for s, r in zip(self.steps, replay)
        ]
        self.record = EpisodeRecord(
            task_id=self.task.task_id,
            family=self.task.family,
            split=self.task.split,
            seed=self.task.seed,
            difficulty=self.task.difficulty,
            mode=self.rollout_config.mode,
            skill_id=skill_id(self.skill),
            group=self.group,
            index=self.index,
            engine=engine_name,
            success=verdict.success,
            score=verdict.score,
            reward=1.0 if verdict.success else 0.0,
            end_reason=self.end_reason or "aborted",
            answer=self.answer,
            verdict=verdict.detail,
            cost_tokens=episode_cost(replay, "tokens"),
            cost_flops=episode_cost(replay, "flops", geometry=geometry) if geometry is not None else None,
            steps=steps,
        )
        if not self.rollout_config.keep_workspaces:
            shutil.rmtree(self.workspace, ignore_errors=True)
            store = store_root(self.workspace, cfg.modes)
            if store is not None:
                shutil.rmtree(store, ignore_errors=True)
        return self.record


_NO_ACTION: dict[str, Any] = {
    "edit_mask": [],
    "edit_calls": [],
    "receipts": [],
    "receipt_kinds": [],
    "readout": "",
    "nudges": [],
    "edited": False,
    "free_turn": False,
}
"""The harness fields of a step whose generation was aborted (nothing was applied)."""


StepCallback = Callable[[int, int], None]
"""``on_step(env_steps, episodes_ended)``: called after every batched step with that step's counts."""


def rollout(
    engine: Engine,
    tokenizer: Any,
    tasks: Sequence[Task],
    config: RolloutConfig | None = None,
    *,
    workdir: str | Path | None = None,
    geometry: ModelGeometry | None = None,
    on_step: StepCallback | None = None,
) -> RolloutResult:
    """Run ``config.group_size`` episodes of every task in ``tasks``, all at once, until every one ends.

    ``tokenizer`` is the policy's (its chat template builds the prompts). Workspaces live under ``workdir``
    (a temporary folder, removed afterwards, when None). ``geometry`` prices the episodes in FLOPs too. See
    the module docstring for the loop, the prompt-id rule, the edit mask and the end reasons.
    """
    cfg = config or RolloutConfig()
    if not tasks:
        return RolloutResult([], RolloutStats())
    builder = PromptBuilder(tokenizer)
    own_dir = workdir is None
    root = Path(tempfile.mkdtemp(prefix="ctxrl-rollout-")) if workdir is None else Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    episodes = [
        _Episode(task, g, i, cfg, root / f"task{g:04d}-ep{i:02d}", builder)
        for g, task in enumerate(tasks)
        for i in range(cfg.group_size)
    ]
    stats = RolloutStats()
    start = time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="ctxrl-env") as pool:
            for done in [pool.submit(e.reset) for e in episodes]:
                done.result()
            ending: list[Future[EpisodeRecord]] = []

            def end(e: _Episode) -> None:
                ending.append(pool.submit(e.finish, engine.name, geometry))

            live = episodes
            while live:
                too_long = [e for e in live if len(e.prompt_ids) >= engine.max_model_len]
                for e in too_long:
                    e.end_reason = "max_model_len"
                    end(e)
                batch = [e for e in live if not e.done]
                taken = 0
                if batch:
                    # 1. generate: one batched call (episodes that just ended are scored meanwhile)
                    t0 = time.perf_counter()
                    gens = engine.generate([e.prompt_ids for e in batch], cfg.sampling)
                    stats.generate_s += time.perf_counter() - t0
                    stats.generate_calls += 1
                    for e, g in zip(batch, gens):
                        stats.prompt_tokens += len(e.prompt_ids)
                        stats.generated_tokens += len(g.token_ids)
                        stats.cached_tokens += g.num_cached_tokens
                    # 2. step every episode in the pool
                    t0 = time.perf_counter()
                    taken = sum(f.result() for f in [pool.submit(e.step, g) for e, g in zip(batch, gens)])
                    stats.env_s += time.perf_counter() - t0
                    stats.env_steps += taken
                # 3. end: score and price finished episodes in the pool, overlapping the next generate
                ended = [e for e in batch if e.done]
                for e in ended:
                    end(e)
                live = [e for e in batch if not e.done]
                if on_step is not None:
                    on_step(taken, len(too_long) + len(ended))
            for fut in ending:
                fut.result()
    finally:
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)
    stats.wall_s = time.perf_counter() - start
    records = [e.record for e in episodes]
    assert all(r is not None for r in records)
    return RolloutResult([r for r in records if r is not None], stats)
