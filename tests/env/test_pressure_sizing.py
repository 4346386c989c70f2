"""The pressure pass's thresholds sized to the episode's limit, and explicit values winning.

A counter with a fixed density (4 characters per token, 2 tokens of overhead per message) makes every
threshold computable by hand: the limit is ``budget - reserve`` (reserve 2048).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import ToolCall, Turn
from ctxrl.env.harness import Action, Harness, StepResult
from ctxrl.env.mode_config import ModesConfig, PressureConfig, PressureSizing
from ctxrl.env.modes import make_mode
from ctxrl.env.modes.pressure import recent_start
from ctxrl.env.overflow import STUB_RE
from ctxrl.env.sandbox import CommandResult, SandboxConfig
from ctxrl.errors import ConfigError

SYSTEM, TASK = "You are an agent", "Do the task now"
"""16 + 1 (the joining newline) + 15 = 32 characters: 8 tokens at 4 characters per token."""


class FourCharCounter:
    """4 characters per token, 2 tokens per message, the tools' JSON counted the same way."""

    def count_prefix(self, system_prompt: str, task: str, tools: Sequence[Mapping[str, Any]] | None) -> int:
        return (len(system_prompt) + len(task) + len(str(tools or ""))) // 4 + 6

    def count_turn(self, turn: Turn) -> int:
        calls = sum(len(c.name) + len(c.arguments) for c in turn.tool_calls)
        return (len(turn.content) + calls) // 4 + 2


class Emitter:
    """``emit N`` prints N characters; anything else echoes the command."""

    def __init__(self, workspace: Path, config: SandboxConfig) -> None:
        pass

    def run(self, command: str) -> CommandResult:
        parts = command.split()
        text = ("abcdefghi\n" * 10_000)[: int(parts[1])] if parts[0] == "emit" else command
        return CommandResult(command, 0, text, False, 0, 0.0)


def harness(tmp_path: Path, budget: int, **pressure: Any) -> Harness:
    modes = ModesConfig(pressure=PressureConfig(**pressure))
    cfg = HarnessConfig(budget=budget, modes=modes, sandbox=SandboxConfig(backend="none"))
    h = Harness(cfg, FourCharCounter(), make_mode("harness", cfg), runner_factory=Emitter)
    h.reset(SYSTEM, TASK, tmp_path / f"ws{budget}")
    return h


def shell(h: Harness, command: str) -> StepResult:
    return h.step(Action("", (ToolCall.make("", "shell", {"command": command}),)))


def result_spilled(h: Harness) -> bool:
    last = [t for t in h.context.turns if t.role == "tool"][-1]
    return STUB_RE.search(last.content) is not None


def test_the_rule_on_two_limits() -> None:
    cfg = PressureConfig()
    # limit 3,952 tokens at 4 chars/token: spill 0.4 * 3952 * 4, keep 0.4 * 3952, summary 0.1 * 3952 * 4
    assert cfg.sizing(3952, 4.0) == PressureSizing(
        spill_chars=6323, keep_rounds=None, keep_tokens=1581, summary_chars=1581
    )
    # limit 29,952 tokens at 1.6 chars/token (the tiny tokenizer's density)
    assert cfg.sizing(29952, 1.6) == PressureSizing(19169, None, 11981, 4792)
    # a tiny limit: the floors (results under 600 characters are never spilled; summaries get 200)
    assert cfg.sizing(500, 1.0) == PressureSizing(600, None, 200, 200)


def test_explicit_values_win_over_the_rule() -> None:
    cfg = PressureConfig(spill_chars=1000, keep_rounds=3, summary_chars=500)
    assert cfg.sizing(3952, 4.0) == PressureSizing(1000, 3, 1581, 500)
    assert PressureConfig(spill_pct=0.25, keep_pct=0.5, summary_pct=0.05).sizing(4000, 2.0) == PressureSizing(
        2000, None, 2000, 400
    )
    for bad in ({"spill_pct": 0.0}, {"keep_pct": 1.5}, {"spill_chars": 599}, {"keep_rounds": -1}):
        with pytest.raises(ConfigError):
            PressureConfig(**bad)


@pytest.mark.parametrize(("budget", "spill_chars"), [(6000, 6323), (16000, 22323)])
def test_a_harness_spills_at_the_size_its_limit_gives(tmp_path: Path, budget: int, spill_chars: int) -> None:
    """limit = budget - 2048; the counter measures 32 chars / 8 tokens on the prompt: spill at 0.4 * limit * 4 characters.
    The stored result is the output and its exit line (harness mode shows no readout), so the margins are 200
    characters either side."""
    under = harness(tmp_path / "under", budget)
    shell(under, f"emit {spill_chars - 200}")
    assert not result_spilled(under)
    over = harness(tmp_path / "over", budget)
    event = shell(over, f"emit {spill_chars + 200}").events[0]
    assert result_spilled(over) and event["spill_chars"] == spill_chars
    explicit = harness(tmp_path / "explicit", budget, spill_chars=1000)
    shell(explicit, "emit 1200")
    assert result_spilled(explicit)


def test_kept_rounds_are_the_newest_that_fit_in_the_window() -> None:
    def round_(tokens: int, i: int) -> list[Turn]:
        call = ToolCall(f"c{i}", "shell", "{}")
        return [
            Turn("assistant", "", (call,), tokens=10),
            Turn("tool", "r", tool_call_id=f"c{i}", tokens=tokens),
        ]

    turns = [Turn("user", "note", tokens=50), *round_(300, 1), *round_(500, 2), *round_(700, 3)]
    # rounds from the end: 710, then 510 (1,220 in all), then 310 (1,530), then the note (1,580)
    assert recent_start(turns, None, 1000) == 5  # only the newest round fits
    assert recent_start(turns, None, 1300) == 3  # the newest two
    assert recent_start(turns, None, 1600) == 1  # every round; the lone note before them is not a round
    assert recent_start(turns, None, 100) == 5  # the newest round stays even when it alone is too big
    assert recent_start(turns, 2, 0) == 3 and recent_start(turns, 0, 10**6) == len(turns)
    assert recent_start(turns, 9, 0) == 0


def test_old_results_spill_once_they_leave_the_window(tmp_path: Path) -> None:
    """limit 3,952: the window is 1,581 tokens. Results of 1,800 characters (about 470 tokens with the
    readout and the call) fit three to the window: the fourth step pushes the first out, and only it."""
    h = harness(tmp_path, 6000)
    for _ in range(3):
        shell(h, "emit 1800")
    assert not any(STUB_RE.search(t.content) for t in h.context.turns)
    event = shell(h, "emit 1800").events[0]
    stubs = [bool(STUB_RE.search(t.content)) for t in h.context.turns if t.role == "tool"]
    assert stubs == [True, False, False, False] and event["kept_rounds"] == 3


def test_a_body_asked_back_is_shown_once_before_it_spills_again(tmp_path: Path) -> None:
    """An oversized result is spilled at once; read_overflow brings it back for the round it arrives in."""
    h = harness(tmp_path, 6000, spill_chars=1000)
    shell(h, "emit 1500")
    assert result_spilled(h)
    stub = STUB_RE.search([t for t in h.context.turns if t.role == "tool"][-1].content)
    assert stub is not None
    h.step(Action("", (ToolCall.make("", "read_overflow", {"id": stub["id"]}),)))
    assert not result_spilled(h)  # the model sees the body
    shell(h, "echo next")
    bodies = [t.content for t in h.context.turns if t.role == "tool"]
    assert STUB_RE.search(bodies[1])  # once it is not the newest round, size spills it again
