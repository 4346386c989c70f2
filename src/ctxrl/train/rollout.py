"""The batched multi-turn rollout loop: many episodes at once, one engine call per step.

    result = rollout(engine, tokenizer, tasks, RolloutConfig(group_size=4, mode="file"))
    result.episodes      # one EpisodeRecord per (task, member of its group), see ctxrl.train.trajectory
    result.stats         # wall time, time in the engine, env steps, tokens

Training, evaluation and SFT demonstrations all come from this loop; each episode is assembled by the
episode factory (:class:`ctxrl.env.episode.TaskEpisode`), which also builds the prompt ids (token in, token
out: see :mod:`ctxrl.env.episode` for the rule) and finds the calls that edited the context.

One iteration of the loop (DESIGN data flow, steps 3-5):

1. **Generate.** Every live episode's prompt ids go to the engine in ONE batched ``generate`` call.
2. **Step.** In a thread pool, each episode applies its generated ids (tool calls parsed, harness step,
   receipts, budget readout, rollback), the step's edit mask is computed
   (:func:`ctxrl.rewards.masks.edit_mask`), and the next prompt ids are built.
3. **End.** An episode that submitted or hit a limit is scored by its task's verifier, its prompts are
   replayed through the prefix-cache cost model, and its workspace is removed. This work is submitted to
   the pool and **overlaps the next batched generate call** (the verifier may run a sandboxed test suite).

Steps of different episodes overlap each other in the pool (sandbox commands are subprocesses; the GIL is
released while they run); steps never overlap the generate call they depend on.

**Ends.** Besides the harness's reasons (submit, max_steps, max_lm_calls, overflow), an episode whose
next prompt leaves no room for one new token under ``engine.max_model_len`` ends with ``max_model_len``
before any call (and an engine-aborted generation ends it with ``aborted``); it is scored with an empty
answer. Nothing waits on such an episode: the loop ends when no episode is live.

**One episode never kills the batch.** An unexpected exception while resetting or stepping an episode (a
bug, an environment fault the harness did not turn into a receipt) ends that episode with ``aborted``; an
exception while grading it gives it a failed verdict and the ``aborted`` reason too. Either way the cause
(exception type and message) is logged as a warning with the task id and kept in the record's ``verdict``,
and the other episodes go on.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxrl.env.config import HarnessConfig
from ctxrl.env.episode import PromptBuilder, TaskEpisode, episode_config
from ctxrl.env.modes import DEFAULT_MODE, mode_spec
from ctxrl.env.tasks.base import Task, Verdict
from ctxrl.errors import ConfigError
from ctxrl.rewards.cost import ModelGeometry, episode_cost, replay_episode, step_flops
from ctxrl.rewards.masks import MaskSetting, edit_mask
from ctxrl.train.engines import ENGINES
from ctxrl.train.engines.base import Engine, Generation, SamplingConfig
from ctxrl.train.summarise import SUMMARY_MAX_NEW_TOKENS, engine_generate
from ctxrl.train.trajectory import EpisodeRecord, StepCost, StepRecord, skill_id


@dataclass(frozen=True)
class RolloutConfig:
    """Settings of one rollout: groups, mode, skill, episode limits, workers."""

    group_size: int = 4
    """G: episodes per task (the group the advantages normalise over)."""
    mode: str = DEFAULT_MODE
    """Context-management mode (a name in the mode registry, :data:`ctxrl.env.modes.MODES`)."""
    skill: str | None = None
    """Skill text in the system prompt; None: the mode's default skill."""
    max_steps: int | None = None
    """Override of the task-step limit (e.g. short episodes in tests); None keeps it."""
    workers: int = 8
    """Threads that run environment steps, resets and episode ends."""
    keep_workspaces: bool = False
    """Keep each episode's workspace after it ends (for debugging); by default it is removed."""
    cache_block_size: int | None = None
    """Block size of the prefix-cache cost replay; None: the engine's (vLLM reports its own; engines without
    a prefix cache price as a GPU vLLM would, 16)."""
    mask_setting: MaskSetting = "edit_only_turns"
    """Which tokens the edit mask marks (:func:`ctxrl.rewards.masks.edit_mask`); the reference's
    ``edit_only_turns`` marks the calls of steps whose every call edited the context."""

    def __post_init__(self) -> None:
        mode_spec(self.mode)  # an unknown mode is an error naming the valid ones
        if self.group_size < 1:
            raise ConfigError(f"group_size must be >= 1, got {self.group_size}")
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1 (or null), got {self.max_steps}")
        if self.cache_block_size is not None and self.cache_block_size < 1:
            raise ConfigError(
                f"cache_block_size must be >= 1 (or null: the engine's), got {self.cache_block_size}"
            )


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


log = logging.getLogger(__name__)


class _Episode:
    """One live episode of the loop: the factory's episode, and its steps recorded so far.

    Its :meth:`reset`, :meth:`step` and :meth:`finish` never raise for a fault of this episode: they end it
    with ``aborted`` and keep the cause (see the module docstring).
    """

    def __init__(self, episode: TaskEpisode, group: int, index: int, config: RolloutConfig) -> None:
        self.episode, self.group, self.index = episode, group, index
        self.rollout_config = config
        self.steps: list[dict[str, Any]] = []
        """Per step: everything of its :class:`StepRecord` but the cost (priced when the episode ends)."""
        self.record: EpisodeRecord | None = None
        self.cause: str | None = None
        """Why the episode was aborted by an exception (``Type: message``); None otherwise."""

    def _abort(self, stage: str, exc: BaseException) -> None:
        """End the episode with ``aborted`` after an unexpected exception in ``stage``; log and keep it."""
        self.cause = f"{stage} raised {type(exc).__name__}: {exc}"
        log.warning(
            "episode %s #%d aborted: %s", self.episode.task.task_id, self.index, self.cause, exc_info=exc
        )
        self.episode.end_reason = None  # a harness reason set before the fault does not stand
        self.episode.end("aborted")

    def reset(self) -> None:
        """Reset the episode (an exception aborts it; see the class docstring)."""
        try:
            self.episode.reset()
        except Exception as exc:
            self._abort("reset", exc)

    @property
    def done(self) -> bool:
        return self.episode.done

    @property
    def prompt_ids(self) -> list[int]:
        return self.episode.prompt_ids

    def step(self, gen: Generation) -> int:
        """Apply one generation; returns the environment steps taken (0 for an aborted generation, which
        ends the episode, and for a step that raised, which aborts it and records the generation with no
        harness fields)."""
        try:
            return self._step(gen)
        except Exception as exc:
            self._abort("step", exc)
            self.steps.append(
                {
                    "prompt_ids": list(self.episode.prompt_ids),
                    "token_ids": list(gen.token_ids),
                    "logprobs": list(gen.logprobs),
                    "finish_reason": gen.finish_reason,
                    "num_cached_tokens": gen.num_cached_tokens,
                    "prompt_source": self.episode.prompt_source,
                    "rebuild_reason": self.episode.rebuild_reason,
                    **_NO_ACTION,
                    "text": _lenient_decode(self.episode, gen.token_ids),
                    "context_tokens": 0,
                }
            )
            return 0

    def _step(self, gen: Generation) -> int:
        episode = self.episode
        record: dict[str, Any] = {
            "prompt_ids": list(episode.prompt_ids),
            "token_ids": list(gen.token_ids),
            "logprobs": list(gen.logprobs),
            "finish_reason": gen.finish_reason,
            "num_cached_tokens": gen.num_cached_tokens,
            "prompt_source": episode.prompt_source,
            "rebuild_reason": episode.rebuild_reason,
        }
        if gen.finish_reason == "abort":
            text = episode.builder.decode(gen.token_ids)
            self.steps.append(
                {**record, **_NO_ACTION, "text": text, "context_tokens": episode.live.context.tokens}
            )
            episode.end("aborted")
            return 0
        step = episode.step(gen.token_ids, stopped=gen.finish_reason == "stop")
        result = step.result
        mask = edit_mask(
            gen.token_ids,
            episode.builder.tokenizer,
            edit_calls=step.edit_calls,
            setting=self.rollout_config.mask_setting,
        )
        self.steps.append(
            {
                **record,
                "text": step.text,
                "tool_calls": [c.name for c in step.calls],
                "edit_mask": mask,
                "edit_calls": step.edit_calls,
                "receipts": [r.text for r in result.receipts],
                "receipt_kinds": [str(r.kind) for r in result.receipts],
                "readout": result.readout,
                "nudges": list(result.nudges),
                "context_tokens": result.tokens,
                "edited": result.edited,
                "free_turn": result.free_turn,
                "rolled_back_turns": result.rolled_back_turns,
                "events": [json.dumps(e, sort_keys=True, default=str) for e in result.events],
            }
        )
        return 1

    def finish(self, engine_name: str, geometry: ModelGeometry | None, block_size: int) -> EpisodeRecord:
        """Grade the answer, price the episode by replaying its prompts, remove the workspace.

        An aborted episode is not graded (its verdict is the cause); an exception while grading or
        tearing down aborts it (see the class docstring)."""
        episode = self.episode
        verdict = Verdict(False, 0.0, f"aborted: {self.cause}")
        if self.cause is None:
            try:
                verdict = episode.finish()
            except Exception as exc:
                self._abort("grading", exc)
                verdict = Verdict(False, 0.0, f"aborted: {self.cause}")
        try:
            episode.teardown()
        except Exception as exc:  # the record stands; the leftover workspace is the tmp root's to remove
            log.warning("episode %s #%d: teardown raised %r", episode.task.task_id, self.index, exc)
        replay = replay_episode(
            [(s["prompt_ids"], s["token_ids"]) for s in self.steps], block_size=block_size
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
        task = episode.task
        self.record = EpisodeRecord(
            task_id=task.task_id,
            family=task.family,
            split=task.split,
            seed=task.seed,
            difficulty=task.difficulty,
            mode=episode.mode,
            skill_id=skill_id(episode.skill),
            group=self.group,
            index=self.index,
            engine=engine_name,
            success=verdict.success,
            score=verdict.score,
            reward=1.0 if verdict.success else 0.0,
            end_reason=episode.end_reason or "aborted",
            answer=episode.answer,
            verdict=verdict.detail,
            cost_tokens=episode_cost(replay, "tokens"),
            cost_flops=episode_cost(replay, "flops", geometry=geometry) if geometry is not None else None,
            steps=steps,
        )
        return self.record


def _lenient_decode(episode: TaskEpisode, ids: Sequence[int]) -> str:
    try:
        return episode.builder.decode(ids)
    except Exception:  # the record keeps the ids; the text is only for reading
        return ""


_NO_ACTION: dict[str, Any] = {
    "edit_mask": [],
    "edit_calls": [],
    "receipts": [],
    "receipt_kinds": [],
    "readout": "",
    "nudges": [],
    "edited": False,
    "free_turn": False,
    "tool_calls": [],
    "rolled_back_turns": 0,
    "events": [],
}
"""The harness fields of a step whose generation was aborted (nothing was applied)."""

GPU_BLOCK_SIZE = 16
"""vLLM's KV block size on GPUs: the cost replay's block size for engines without a prefix cache."""


SCRIPTED_SUMMARISER = (
    "harness.modes.pressure.summariser=engine needs a model to write the summaries and the scripted engine has "
    "none: give --model DIR (ctxrl eval and rollout then summarise with it through transformers) or set "
    "harness.modes.pressure.summariser=extractive"
)

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
    harness: HarnessConfig | None = None,
    sampling: SamplingConfig | None = None,
    skills: Sequence[str | None] | None = None,
    generate: Callable[[str], str] | None = None,
) -> RolloutResult:
    """Run ``config.group_size`` episodes of every task in ``tasks``, all at once, until every one ends.

    ``tokenizer`` is the policy's (its chat template builds the prompts). ``harness`` is the base harness
    config of every episode (default: the defaults; see :attr:`HarnessConfig.task_budget`), ``sampling``
    the settings of every generate call (default: :class:`SamplingConfig`'s). ``skills``, one
    per task (None: ``config.skill``), lets the episodes of one batch carry different skills. Workspaces
    live under ``workdir`` (a temporary folder, removed afterwards, when None). ``geometry`` prices the
    episodes in FLOPs too. ``generate(prompt_text) -> text`` writes the fold summaries of the pressure pass
    when ``harness.modes.pressure.summariser`` is ``engine``; None: the policy's own ``engine``
    (:func:`ctxrl.train.summarise.engine_generate`, greedy, at most ``sampling.max_new_tokens`` and
    :data:`~ctxrl.train.summarise.SUMMARY_MAX_NEW_TOKENS` tokens), which a scripted engine cannot be
    (ConfigError). See the
    module docstring for the loop and the end reasons.
    """
    cfg = config or RolloutConfig()
    sampling = sampling or SamplingConfig()
    if not tasks:
        return RolloutResult([], RolloutStats())
    if skills is not None and len(skills) != len(tasks):
        raise ConfigError(f"got {len(skills)} skills for {len(tasks)} tasks; give one per task (or None)")
    block_size = cfg.cache_block_size or getattr(engine, "cache_block_size", None) or GPU_BLOCK_SIZE
    builder = PromptBuilder(tokenizer)
    if generate is None and (harness or HarnessConfig()).modes.pressure.summariser == "engine":
        spec = ENGINES.get(engine.name)  # an engine outside the registry (a test's fake) is taken as a model
        if spec is not None and not spec.has_model:
            raise ConfigError(SCRIPTED_SUMMARISER)
        generate = engine_generate(
            engine, builder, max_new_tokens=min(SUMMARY_MAX_NEW_TOKENS, sampling.max_new_tokens)
        )
    own_dir = workdir is None
    root = Path(tempfile.mkdtemp(prefix="ctxrl-rollout-")) if workdir is None else Path(workdir)
    root.mkdir(parents=True, exist_ok=True)

    def make(g: int, task: Task, i: int) -> _Episode:
        config = episode_config(task, builder.count, harness, max_steps=cfg.max_steps)
        skill = skills[g] if skills is not None and skills[g] is not None else cfg.skill
        episode = TaskEpisode(
            task,
            cfg.mode,
            builder,
            workspace=root / f"task{g:04d}-ep{i:02d}",
            config=config,
            skill=skill,
            keep_workspace=cfg.keep_workspaces,
            generate=generate,
        )
        return _Episode(episode, g, i, cfg)

    episodes = [make(g, task, i) for g, task in enumerate(tasks) for i in range(cfg.group_size)]
    stats = RolloutStats()
    start = time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="ctxrl-env") as pool:
            for done in [pool.submit(e.reset) for e in episodes]:
                done.result()
            ending: list[Future[EpisodeRecord]] = []

            def end(e: _Episode) -> None:
                ending.append(pool.submit(e.finish, engine.name, geometry, block_size))

            for e in episodes:
                if e.done:  # aborted at reset
                    end(e)
            live = [e for e in episodes if not e.done]
            while live:
                too_long = [e for e in live if len(e.prompt_ids) >= engine.max_model_len]
                for e in too_long:
                    e.episode.end("max_model_len")
                    end(e)
                batch = [e for e in live if not e.done]
                taken = 0
                if batch:
                    # 1. generate: one batched call (episodes that just ended are scored meanwhile)
                    t0 = time.perf_counter()
                    gens = engine.generate([e.prompt_ids for e in batch], sampling)
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
