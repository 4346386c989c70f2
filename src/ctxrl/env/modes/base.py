"""What a context-management mode is: the contract between the harness and its modes.

A mode decides which tools the model gets (besides ``submit``, which belongs to the harness) and how a call
is applied. :class:`Mode` declares the required members and the optional hooks with no-op defaults; a mode
class subclasses it explicitly, so the type checker sees the whole contract and the harness never probes
for attributes. The registry of modes is :mod:`ctxrl.env.modes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ctxrl.env.budget import BudgetFeatures, Means
from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import Context, ToolCall
from ctxrl.env.monitor import Flag
from ctxrl.env.receipts import Receipt
from ctxrl.env.sandbox import CommandResult

SUBMIT = "submit"
UNKNOWN_TOOL = "[harness] Unknown tool {name!r}; the tools are: {tools}."
BAD_ARGUMENT = "[harness] The {name} tool needs a string argument {argument!r}."
NO_OUTPUT = "(no output)"


class CommandRunner(Protocol):
    """Runs one shell command in the episode workspace (the :class:`Sandbox` in production)."""

    def run(self, command: str) -> CommandResult: ...


@dataclass
class Episode:
    """What a mode may use to apply a call: the live context, the command runner, workspace and config."""

    context: Context
    runner: CommandRunner
    workspace: Path
    config: HarnessConfig


@dataclass(frozen=True)
class CallOutcome:
    """What applying one tool call produced (before the harness adds readout and notices)."""

    output: str
    """Text for the model: the command's output and exit status, or an error line."""
    receipt: Receipt | None = None
    context_only: bool = False
    """An applied context edit that printed nothing and exited 0 (a candidate free edit turn)."""
    flags: tuple[Flag, ...] = ()


@dataclass(frozen=True)
class StepNotes:
    """What a mode's ``after_step`` hook did: lines for one user note, the step's events, a rewrite flag."""

    notes: tuple[str, ...] = ()
    events: tuple[dict[str, Any], ...] = ()
    edited: bool = False
    """The hook rewrote the editable region (the next prompt does not extend the last one)."""


class Mode(Protocol):
    """A context-management mode: the tools it offers (besides submit) and how a call is applied.

    Required: ``name``, :meth:`tool_schemas` (re-read after every step, so a mode may offer tools as the
    episode goes) and :meth:`run_call`. The hooks below have no-op defaults; a mode overrides what it uses.
    """

    name: str
    budget: BudgetFeatures = BudgetFeatures()
    """The budget machinery the mode's seed uses (readout, nudges, rollback, pressure pass); a run overrides
    the first three with ``HarnessConfig.readout`` / ``nudges`` / ``rollback``."""

    def tool_schemas(self, config: HarnessConfig) -> list[dict[str, Any]]:
        """The mode's tools as OpenAI-style function schemas."""
        ...

    def run_call(self, call: ToolCall, episode: Episode) -> CallOutcome:
        """Apply one tool call (never ``submit``)."""
        ...

    def begin_episode(self, episode: Episode) -> None:
        """At reset, before the first prompt is built."""
        return None

    def after_step(self, episode: Episode, ending: bool) -> StepNotes:
        """After a step's results are appended and before the overflow check: the mode may rewrite the
        context (pressure pass), return lines for one user note, and hand over the step's events."""
        return StepNotes()

    def signal(self, episode: Episode) -> str | None:
        """The text of the signal slot rendered after the conversation (None: no slot)."""
        return None

    def means(self, config: HarnessConfig) -> Means:
        """How nudges and the overflow note name this mode's means of shrinking the context (default: the
        context file's)."""
        return Means.for_file(config.context_file)

    def file_view(self, episode: Episode, call_id: str, key: str, tool: str) -> None:
        """Call ``call_id`` (of the task tool ``tool``, run next through :meth:`run_call` as a ``shell``
        command) reads the document ``key``; a mode that manages file views (usage) treats its result, if the
        command succeeds, as a view of ``key``."""
        return None


def format_command_output(result: CommandResult) -> str:
    """The command's output as the model sees it, with its exit status when it failed."""
    text = result.output.rstrip("\n") if result.output.strip() else NO_OUTPUT
    if result.timed_out:
        text += f"\n[timed out after {result.duration_s:.1f} s; exit code {result.exit_code}]"
    elif result.exit_code != 0:
        text += f"\n[exit code {result.exit_code}]"
    return text
