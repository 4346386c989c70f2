"""The two baselines every comparison needs, and file mode with the pressure pass underneath.

- :class:`AppendMode`: nothing is managed. ``shell`` and ``submit`` only, no context file, no pressure
  pass; an overflow ends the episode (truncated, reason ``overflow``) instead of rolling back.
- :class:`HarnessMode`: the harness decides everything. ``shell`` (and ``read_overflow`` for spilled
  bodies); the pressure pass spills and folds after every step.
- :class:`ManagedFileMode`: file mode (:class:`ctxrl.env.harness.FileMode`) with format receipts for
  malformed calls and, when configured, the pressure pass after every step.
"""

from __future__ import annotations

from typing import Any

from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import ToolCall
from ctxrl.env.harness import CallOutcome, Episode, FileMode
from ctxrl.env.mode_config import ModesConfig
from ctxrl.env.modes.common import (
    READ_OVERFLOW_TOOL,
    SHELL_TOOL,
    Shared,
    StepNotes,
    format_outcome,
    never_pinned,
    parse_arguments,
    read_overflow,
    run_shell,
    unknown_tool,
)
from ctxrl.env.modes.pressure import PressurePass


class AppendMode:
    """Append-only: the context only grows; overflowing it ends the episode."""

    name = "append"
    rolls_back = False

    def tool_schemas(self, config: HarnessConfig) -> list[dict[str, Any]]:
        return [SHELL_TOOL]

    def run_call(self, call: ToolCall, episode: Episode) -> CallOutcome:
        if call.name != "shell":
            return unknown_tool(call, self.tool_schemas(episode.config), episode.context)
        return run_shell(call, episode)


class _PressureHooks:
    """The per-episode state and ``after_step`` of a mode whose only management is the pressure pass."""

    def __init__(self, config: ModesConfig, pressure: PressurePass | None) -> None:
        self.config = config
        self.pressure = pressure
        self._shared: Shared | None = None

    def begin_episode(self, episode: Episode) -> None:
        self._shared = Shared.begin(episode, self.config)

    def shared(self, episode: Episode) -> Shared:
        if self._shared is None or self._shared.episode is not episode:
            self.begin_episode(episode)
        assert self._shared is not None
        return self._shared

    def after_step(self, episode: Episode, ending: bool) -> StepNotes:
        shared = self.shared(episode)
        shared.rounds.advance()
        if self.pressure is None or ending:
            return StepNotes((), shared.drain_events())
        result = self.pressure.apply(episode, shared.store, never_pinned)
        if result.changed:
            shared.events.append(result.event(shared.rounds.current - 1))
        return StepNotes((), shared.drain_events(), result.changed)


class HarnessMode:
    """Harness-scheduled: the pressure pass manages the context, the model only works."""

    name = "harness"
    rolls_back = True

    def __init__(self, config: ModesConfig, pressure: PressurePass) -> None:
        self.hooks = _PressureHooks(config, pressure)

    def begin_episode(self, episode: Episode) -> None:
        self.hooks.begin_episode(episode)

    def after_step(self, episode: Episode, ending: bool) -> StepNotes:
        return self.hooks.after_step(episode, ending)

    def tool_schemas(self, config: HarnessConfig) -> list[dict[str, Any]]:
        return [SHELL_TOOL, READ_OVERFLOW_TOOL]

    def run_call(self, call: ToolCall, episode: Episode) -> CallOutcome:
        shared = self.hooks.shared(episode)
        shared.rounds.record(call.id)
        if call.name == "shell":
            return run_shell(call, episode)
        if call.name == "read_overflow":
            return read_overflow(call, shared)
        return unknown_tool(call, self.tool_schemas(episode.config), episode.context)


class ManagedFileMode:
    """File mode, plus format receipts for malformed calls and the optional pressure pass."""

    name = "file"
    rolls_back = True

    def __init__(self, config: ModesConfig, pressure: PressurePass | None = None) -> None:
        self.inner = FileMode()
        self.hooks = _PressureHooks(config, pressure)

    def begin_episode(self, episode: Episode) -> None:
        self.hooks.begin_episode(episode)

    def after_step(self, episode: Episode, ending: bool) -> StepNotes:
        return self.hooks.after_step(episode, ending)

    def tool_schemas(self, config: HarnessConfig) -> list[dict[str, Any]]:
        tools = self.inner.tool_schemas(config)
        return [*tools, READ_OVERFLOW_TOOL] if self.hooks.pressure is not None else tools

    def run_call(self, call: ToolCall, episode: Episode) -> CallOutcome:
        shared = self.hooks.shared(episode)
        shared.rounds.record(call.id)
        tools = self.tool_schemas(episode.config)
        if call.name == "read_overflow" and self.hooks.pressure is not None:
            return read_overflow(call, shared)
        if call.name != "shell":
            return unknown_tool(call, tools, episode.context)
        _, problem = parse_arguments(call, tools[0])
        if problem:
            return format_outcome(call.name, problem, episode.context)
        return self.inner.run_call(call, episode)
