"""The Gymnasium environment: one task family, in one context-management mode, over the harness.

    env = gymnasium.make("ctxrl/Retention-v0", mode="file")   # ids registered by `import ctxrl.env`
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step('<tool_call>{"name": "shell", ...}</tool_call>')

- **Observation**: the prompt the policy sees — the chat template rendered over the live context with the
  episode's tools and the generation prompt (text; ``info["messages"]`` has the structured messages).
- **Action**: the model's generated text; tool calls are parsed from it in the chat-template format
  (:mod:`ctxrl.env.actions`); a malformed call gets a format receipt and the episode goes on.
- **Reward**: 0 on every step but the last; on the last, the verifier's success (1.0 or 0.0).
  ``terminated`` means the model submitted; ``truncated`` means a limit ended the episode (steps, LM calls,
  overflow) — the answer is then graded as empty.
- **Info**: structured messages, the prompt ids the observation tokenises to (token in, token out),
  receipts, budget readout, step counters, monitor flags, and on the last step the verdict.

Every episode is assembled by the episode factory (:class:`ctxrl.env.episode.TaskEpisode`), the same one the
rollout loop of training and evaluation uses: for the same actions this environment and the rollout loop
produce the same episode. An action given as text becomes the ids ``encode(text)`` plus the stop token.

Task tools (``next_chunk``, ``search``, ...) are offered as function tools in every mode and run as their
workspace scripts in the episode sandbox; in file mode the shell can run them too.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import gymnasium as gym

from ctxrl.env.config import HarnessConfig
from ctxrl.env.episode import PromptBuilder, TaskEpisode, episode_config
from ctxrl.env.modes import DEFAULT_MODE, mode_spec
from ctxrl.env.sandbox import remove_tree
from ctxrl.env.tasks.base import Task, TaskSource
from ctxrl.env.tokenizer import load_tokenizer
from ctxrl.errors import UsageError


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


class ContextEnv(gym.Env[str, str]):
    """A task family in a context-management mode. See the module docstring for the contract."""

    metadata = {"render_modes": ["ansi"]}  # noqa: RUF012 (Gymnasium declares it an instance attribute)

    def __init__(
        self,
        family: str = "retention",
        mode: str = DEFAULT_MODE,
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

        mode_spec(mode)  # validates the mode name
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
        self.builder = PromptBuilder(self.tokenizer)
        self.base_config = harness_config
        self.skill = skill
        self.render_mode = render_mode
        self.observation_space = PromptSpace()
        self.action_space = PromptSpace()
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="ctxrl-env-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._episodes = 0
        self._episode: TaskEpisode | None = None
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

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        task = self._choose_task(options)
        if self._episode is not None:
            self._episode.teardown()
        self._episodes += 1
        self._episode = TaskEpisode(
            task,
            self.mode_name,
            self.builder,
            workspace=self.workdir / f"episode-{self._episodes:06d}",
            config=episode_config(task, self.builder.count, self.base_config),
            skill=options.get("skill", self.skill),
        )
        self._episode.reset()
        return self._observe(), self._info(None)

    # --- stepping -----------------------------------------------------------------------------------------

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        episode = self._episode
        if episode is None:
            raise UsageError("call reset() before step()")
        text = action if isinstance(action, str) else str(action)
        step = episode.step(self.builder.action_ids(text))
        result = step.result
        reward = 0.0
        extra: dict[str, Any] = {"step": step}
        if result.done:
            verdict = episode.finish()
            reward = 1.0 if verdict.success else 0.0
            extra["verdict"] = verdict
        obs = self._observe()
        return obs, reward, result.terminated, result.truncated, self._info(extra)

    def _observe(self) -> str:
        assert self._episode is not None
        self._last_obs = self._episode.prompt_text()
        return self._last_obs

    def _info(self, extra: dict[str, Any] | None) -> dict[str, Any]:
        episode = self._episode
        assert episode is not None and episode.harness is not None
        ctx = episode.harness.context
        info: dict[str, Any] = {
            "task_id": episode.task.task_id,
            "family": episode.task.family,
            "mode": self.mode_name,
            "messages": ctx.to_messages(),
            "tools": episode.harness.tools,
            "task_tools": [t.name for t in episode.task.tools],
            "tokens": ctx.tokens,
            "limit": episode.config.limit,
            "prompt_ids": list(episode.prompt_ids),
        }
        if extra:
            step = extra["step"]
            result = step.result
            info.update(
                action_ids=list(self.builder.action_ids(step.text)),
                receipts=[r.text for r in result.receipts],
                receipt_kinds=[r.kind for r in result.receipts],
                readout=result.readout,
                nudges=list(result.nudges),
                flags=[f.text for f in result.flags] if result.flags else [],
                free_turn=result.free_turn,
                edited=result.edited,
                edit_calls=list(step.edit_calls),
                rolled_back_turns=result.rolled_back_turns,
                steps=result.steps,
                lm_calls=result.lm_calls,
                reason=result.reason,
                answer=result.answer,
                metrics=result.metrics(),
            )
            if "verdict" in extra:
                verdict = extra["verdict"]
                info.update(success=verdict.success, score=verdict.score, verdict=verdict.detail)
        return info

    @property
    def workspace(self) -> Path | None:
        """The current episode's workspace folder (removed at the next reset and at close)."""
        return self._episode.workspace if self._episode is not None else None

    def render(self) -> str | None:
        return self._last_obs if self.render_mode == "ansi" else None

    def close(self) -> None:
        if self._episode is not None:
            self._episode.teardown()
            self._episode = None
        if self._own_workdir:
            remove_tree(self.workdir)
        super().close()
