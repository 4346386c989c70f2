"""The Gymnasium environment: one task family, in one context-management mode, over the harness.

    env = gymnasium.make("ctxrl/Retention-v0", mode="file")
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step('<tool_call>{"name": "shell", ...}</tool_call>')

- **Observation**: the prompt the policy sees — the chat template rendered over the live context with the
  episode's tools and the generation prompt (text; ``info["messages"]`` has the structured messages).
- **Action**: the model's generated text; tool calls are parsed from it in the chat-template format
  (:mod:`ctxrl.env.actions`); a malformed call gets a format receipt and the episode goes on.
- **Reward**: 0 on every step but the last; on the last, the verifier's success (1.0 or 0.0).
  ``terminated`` means the model submitted; ``truncated`` means a limit ended the episode (steps, LM calls,
  overflow) — the answer is then graded as empty.
- **Info**: structured messages, receipts, budget readout, step counters, monitor flags, and on the last
  step the verdict and the episode's cost components.

Task tools (``next_chunk``, ``search``, ...) are offered as function tools in every mode and run as their
workspace scripts in the episode sandbox; in file mode the shell can run them too.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import gymnasium as gym

from ctxrl.env.actions import FORMAT_ERROR_TOOL, parse_tool_calls
from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import ChatTemplateCounter, ToolCall, canonical_json
from ctxrl.env.harness import Action, CallOutcome, Episode, Harness, Mode
from ctxrl.env.modes.common import format_outcome
from ctxrl.env.sandbox import Sandbox, remove_tree
from ctxrl.env.skills import DEFAULT_SKILLS, system_prompt
from ctxrl.env.tasks.base import Task, TaskSource
from ctxrl.errors import UsageError

MODES = ("file", "tools", "usage", "harness", "append")
CALL_SYNTAX = 'write each call as <tool_call>{"name": ..., "arguments": {...}}</tool_call>'


class PromptSpace(gym.spaces.Space[str]):
    """Any text of at most ``max_length`` characters (prompts and generated actions are free text)."""

    def __init__(self, max_length: int = 1_000_000, seed: int | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_length = max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        n = int(self.np_random.integers(0, 64))
        return "".join(chr(int(c)) for c in self.np_random.integers(32, 127, size=n))

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"PromptSpace(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PromptSpace) and other.max_length == self.max_length


class TaskToolsMode:
    """Wraps a mode: adds the task's tools (run as workspace scripts) and answers malformed calls.

    A task tool call runs through the inner mode as the ``shell`` command it stands for, so the mode treats
    it like any command (rounds, turn headers, the context file sync). The inner mode's optional hooks
    (``begin_episode``, ``after_step``, ``signal``, ``rolls_back``) are forwarded, so the harness sees them.
    """

    def __init__(self, inner: Mode, task: Task) -> None:
        self.inner = inner
        self.name = inner.name
        self._task_tools = {t.name: t for t in task.tools}

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes this wrapper lacks: the inner mode's optional hooks.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def tool_schemas(self, config: HarnessConfig) -> list[dict[str, Any]]:
        return [*self.inner.tool_schemas(config), *(t.to_openai() for t in self._task_tools.values())]

    def run_call(self, call: ToolCall, episode: Episode) -> CallOutcome:
        if call.name == FORMAT_ERROR_TOOL:
            error = call.args().get("error", "malformed tool call")
            return format_outcome("a tool", f"{error}; {CALL_SYNTAX}", episode.context)
        spec = self._task_tools.get(call.name)
        if spec is None:
            return self.inner.run_call(call, episode)
        shell = replace(call, name="shell", arguments=canonical_json({"command": spec.to_shell(call.args())}))
        return self.inner.run_call(shell, episode)


@lru_cache(maxsize=4)
def load_tokenizer(source: str | None) -> Any:
    """The policy tokenizer: a model folder's, or the tiny model's (built in memory) when ``source`` is None."""
    if source is None:
        from ctxrl.train.tiny_model import build_tokenizer

        return build_tokenizer()
    from ctxrl.train.engines.model_dir import load_tokenizer as load_dir_tokenizer

    return load_dir_tokenizer(source)


def make_mode(name: str, config: HarnessConfig) -> Mode:
    """The harness mode called ``name`` (one of :data:`MODES`), set up from ``config.modes``."""
    from ctxrl.env.modes import make_mode as make_configured_mode

    mode: Mode = make_configured_mode(name, config)
    return mode


def task_harness_config(
    task: Task, count_tokens: Callable[[str], int], base: HarnessConfig | None = None
) -> HarnessConfig:
    """The harness config of an episode of ``task``: ``base`` (default: the defaults) with the task's budget
    converted to the policy tokenizer's tokens (``count_tokens``: text -> tokens; see ``Task.budget_for``),
    its step limit, and reserve and rollback margin at most an eighth of the budget, so one large
    observation still fits under a small budget."""
    base = base or HarnessConfig()
    budget = task.budget_for(count_tokens)
    return replace(
        base,
        budget=budget,
        reserve=min(base.reserve, budget // 8),
        rollback_margin=min(base.rollback_margin, budget // 8),
        max_steps=task.max_steps,
    )


class ContextEnv(gym.Env[str, str]):
    """A task family in a context-management mode. See the module docstring for the contract."""

    metadata = {"render_modes": ["ansi"]}  # noqa: RUF012 (Gymnasium declares it an instance attribute)

    def __init__(
        self,
        family: str = "retention",
        mode: str = "file",
        *,
        split: str = "train",
        difficulty: str = "default",
        tokenizer: Any = None,
        skill: str | None = None,
        harness_config: HarnessConfig | None = None,
        task_source: TaskSource | None = None,
        workdir: str | Path | None = None,
        render_mode: str | None = None,
    ) -> None:
        from ctxrl.env.tasks.registry import FAMILIES
        from ctxrl.env.tasks.splits import split_seeds

        if mode not in MODES:
            raise UsageError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
        if task_source is None and family not in FAMILIES:
            raise UsageError(f"unknown task family {family!r}; families: {', '.join(FAMILIES)}")
        split_seeds(split, 0)  # validates the split name
        self.family, self.mode_name, self.split, self.difficulty = family, mode, split, difficulty
        self.task_source = task_source
        self.tokenizer = (
            tokenizer
            if tokenizer is not None and not isinstance(tokenizer, str | Path)
            else (load_tokenizer(None if tokenizer is None else str(tokenizer)))
        )
        self.counter = ChatTemplateCounter(self.tokenizer)
        self.base_config = harness_config
        self.skill = skill if skill is not None else DEFAULT_SKILLS[mode]
        self.render_mode = render_mode
        self.observation_space = PromptSpace()
        self.action_space = PromptSpace()
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="ctxrl-env-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._episodes = 0
        self._harness: Harness | None = None
        self._task: Task | None = None
        self._workspace: Path | None = None
        self._last_obs = ""

    # --- episode set-up -----------------------------------------------------------------------------------

    def _choose_task(self, options: dict[str, Any]) -> Task:
        from ctxrl.env.tasks.registry import make_task
        from ctxrl.env.tasks.splits import split_seeds

        if isinstance(options.get("task"), Task):
            task: Task = options["task"]
            return task
        if self.task_source is not None:
            tasks = list(self.task_source.tasks(self.split))
            if not tasks:
                raise UsageError(f"the task source has no {self.split} tasks")
            return tasks[int(options.get("task_index", self.np_random.integers(len(tasks)))) % len(tasks)]
        seeds = split_seeds(self.split)
        task_seed = options.get("task_seed")
        if task_seed is None:
            task_seed = seeds[int(self.np_random.integers(len(seeds)))]
        return make_task(self.family, int(task_seed), self.difficulty, split=self.split)

    def _config_for(self, task: Task) -> HarnessConfig:
        """The user's harness config if given, else :func:`task_harness_config` for this tokenizer."""
        if self.base_config is not None:
            return self.base_config
        return task_harness_config(task, self.counter.count_text)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        task = self._choose_task(options)
        self._remove_workspace()
        self._episodes += 1
        workspace = self.workdir / f"episode-{self._episodes:06d}"
        task.materialize(workspace)
        config = self._config_for(task)
        mode = TaskToolsMode(make_mode(self.mode_name, config), task)
        self._harness = Harness(config, self.counter, mode=mode)
        self._task, self._workspace = task, workspace
        skill = options.get("skill", self.skill)
        self._harness.reset(system_prompt(skill, config.context_file), task.prompt, workspace)
        self._prompt_tokens: list[int] = []
        obs = self._observe()
        info = self._info(None)
        return obs, info

    # --- stepping -----------------------------------------------------------------------------------------

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._harness is None or self._task is None:
            raise UsageError("call reset() before step()")
        prose, calls = parse_tool_calls(action if isinstance(action, str) else str(action))
        result = self._harness.step(Action(prose, calls))
        reward = 0.0
        extra: dict[str, Any] = {"step": result}
        if result.done:
            verdict = self._task.verifier.verify(result.answer or "", self._workspace, self._sandbox_factory)
            reward = 1.0 if verdict.success else 0.0
            extra["verdict"] = verdict
        obs = self._observe()
        return obs, reward, result.terminated, result.truncated, self._info(extra)

    def _sandbox_factory(self, workspace: Path) -> Sandbox:
        assert self._harness is not None
        return Sandbox(workspace, self._harness.config.sandbox)

    def _observe(self) -> str:
        assert self._harness is not None
        text: str = self.tokenizer.apply_chat_template(
            self._harness.context.to_messages(),
            tools=self._harness.tools,
            add_generation_prompt=True,
            tokenize=False,
        )
        self._prompt_tokens.append(self._harness.context.tokens)
        self._last_obs = text
        return text

    def _info(self, extra: dict[str, Any] | None) -> dict[str, Any]:
        assert self._harness is not None and self._task is not None
        ctx = self._harness.context
        info: dict[str, Any] = {
            "task_id": self._task.task_id,
            "family": self._task.family,
            "mode": self.mode_name,
            "messages": ctx.to_messages(),
            "tools": self._harness.tools,
            "task_tools": [t.name for t in self._task.tools],
            "tokens": ctx.tokens,
            "limit": self._harness.config.limit,
        }
        if extra:
            step = extra["step"]
            info.update(
                receipts=[r.text for r in step.receipts],
                receipt_kinds=[r.kind for r in step.receipts],
                readout=step.readout,
                nudges=list(step.nudges),
                flags=[f.text for f in step.flags] if step.flags else [],
                free_turn=step.free_turn,
                edited=step.edited,
                rolled_back_turns=step.rolled_back_turns,
                steps=step.steps,
                lm_calls=step.lm_calls,
                reason=step.reason,
                answer=step.answer,
                metrics=step.metrics(),
            )
            if "verdict" in extra:
                verdict = extra["verdict"]
                info.update(success=verdict.success, score=verdict.score, verdict=verdict.detail)
                info["cost"] = {
                    "prompt_tokens_per_step": list(self._prompt_tokens),
                    "prompt_tokens_total": int(sum(self._prompt_tokens)),
                }
        return info

    @property
    def workspace(self) -> Path | None:
        """The current episode's workspace folder (removed at the next reset and at close)."""
        return self._workspace

    def render(self) -> str | None:
        return self._last_obs if self.render_mode == "ansi" else None

    def _remove_workspace(self) -> None:
        """Remove the finished episode's workspace and its overflow store (kept beside it, out of reach)."""
        from ctxrl.env.modes.common import store_root

        if self._workspace is not None:
            remove_tree(self._workspace)
            if self._harness is not None:
                store = store_root(self._workspace, self._harness.config.modes)
                if store is not None:
                    remove_tree(store)
            self._workspace = None

    def close(self) -> None:
        self._remove_workspace()
        if self._own_workdir:
            remove_tree(self.workdir)
        super().close()


def register_envs(families: Sequence[str] | None = None) -> list[str]:
    """Register ``ctxrl/<Family>-v0`` for every built-in family (idempotent); return the ids."""
    from ctxrl.env.tasks.registry import FAMILIES

    ids = []
    for family in families or FAMILIES:
        env_id = f"ctxrl/{family.capitalize()}-v0"
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point="ctxrl.env.gym_env:ContextEnv", kwargs={"family": family})
        ids.append(env_id)
    return ids
