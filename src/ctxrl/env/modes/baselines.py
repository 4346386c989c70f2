"""The two baselines every comparison needs.

- :class:`AppendMode`: nothing is managed. ``shell`` and ``submit`` only, no context file, no pressure
  pass; an overflow ends the episode (truncated, reason ``overflow``) instead of rolling back.
- :class:`HarnessMode`: the harness decides everything. ``shell`` (and ``read_overflow`` for spilled
  bodies); the pressure pass spills and folds after every step.
"""

from __future__ import annotations

from typing import Any

from ctxrl.env.budget import BudgetFeatures, Means
from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import ToolCall
from ctxrl.env.mode_config import ModesConfig
from ctxrl.env.modes.base import CallOutcome, Episode, Mode, StepNotes
from ctxrl.env.modes.common import (
    READ_OVERFLOW_TOOL,
    SHELL_TOOL,
    read_overflow,
    run_shell,
    unknown_tool,
)
from ctxrl.env.modes.pressure import PressureHooks, PressurePass


class AppendMode(Mode):
    """Append-only: the context only grows; overflowing it ends the episode."""

    name = "append"
    budget = BudgetFeatures(readout=False, nudges=False, rollback=False, pressure="never")
    """A plain agent: no readout, no nudges, and an overflow fails the episode."""

    def tool_schemas(self, config: HarnessConfig) -> list[dict[str, Any]]:
        return [SHELL_TOOL]

    def run_call(self, call: ToolCall, episode: Episode) -> CallOutcome:
        if call.name != "shell":
            return unknown_tool(call, self.tool_schemas(episode.config), episode.context)
        return run_shell(call, episode)

    def means(self, config: HarnessConfig) -> Means:
        return Means(
            tidy="keep outputs short (head, grep, wc)",
            compact="Nothing can be removed from this context: keep outputs short (head, grep, wc) and submit "
            "before it is full.",
            compact_now="Nothing can be removed from this context: submit your answer soon.",
            condense="Cut the output you need to what matters",
        )


class HarnessMode(Mode):
    """Harness-scheduled: the pressure pass manages the context, the model only works."""

    name = "harness"
    budget = BudgetFeatures(readout=False, nudges=False, rollback=False, pressure="always")
    """Seed 000's pressure pass alone: it is the backstop; the model is told nothing about its budget."""

    def __init__(self, config: ModesConfig, pressure: PressurePass) -> None:
        self.hooks = PressureHooks(config, pressure)

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

    def means(self, config: HarnessConfig) -> Means:
        return Means(
            tidy="note in your own message the exact values you still need",
            compact="The harness moves old and large results out of your context: note the exact values you "
            "still need in your own message and keep outputs short (head, grep, wc).",
            compact_now="Keep the next outputs short (head, grep, wc) and note the values you need.",
            condense="Note the values you need in your own message",
        )
