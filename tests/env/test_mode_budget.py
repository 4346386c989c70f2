"""Each design on its own terms (issue 11, items 1 and 6): the budget machinery a mode uses is its seed's,
a run may override it, and every nudge or overflow note names the mode's own means, never a file that does
not exist."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ctxrl.env import budget as bud
from ctxrl.env.budget import BudgetFeatures
from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import ChatTemplateCounter, ToolCall
from ctxrl.env.harness import Action, Harness
from ctxrl.env.mode_config import ModesConfig, UsageModeConfig
from ctxrl.env.modes import MODE_NAMES, make_mode
from ctxrl.env.sandbox import SandboxConfig
from ctxrl.env.skills import system_prompt

# name -> (readout, nudges, rollback, pressure), from the seeds: file mode is seed 002's harness (readout on
# every result, tiered and urgent nudges, rollback); seed 000's tools sit on the pressure pass with no
# readout; seed 001 shows only its usage block and has compaction as the backstop; the baselines tell the
# model nothing.
SEED_DEFAULTS = {
    "file": (True, True, True, "optional"),
    "tools": (False, False, False, "default"),
    "usage": (False, False, False, "default"),
    "harness": (False, False, False, "always"),
    "append": (False, False, False, "never"),
}
CFG = HarnessConfig(budget=1000, reserve=100, rollback_margin=100, sandbox=SandboxConfig(backend="none"))


@pytest.mark.parametrize("name", MODE_NAMES)
def test_each_mode_defaults_to_its_seeds_budget_machinery(name: str) -> None:
    budget = make_mode(name, CFG).budget
    assert (budget.readout, budget.nudges, budget.rollback, budget.pressure) == SEED_DEFAULTS[name]


def test_run_overrides_win_and_none_keeps_the_mode_default() -> None:
    tools = BudgetFeatures(readout=False, nudges=False, rollback=False, pressure="default")
    assert tools.resolve(HarnessConfig()) == tools
    on = tools.resolve(HarnessConfig(readout=True, rollback=True))
    assert (on.readout, on.nudges, on.rollback, on.pressure) == (True, False, True, "default")
    off = BudgetFeatures().resolve(HarnessConfig(nudges=False))
    assert (off.readout, off.nudges, off.rollback) == (True, False, True)


def _harness(name: str, counter: ChatTemplateCounter, ws: Path, **fields: Any) -> Harness:
    harness = Harness(HarnessConfig(**{**CFG.__dict__, **fields}), counter, mode=make_mode(name, CFG))
    with pytest.warns(RuntimeWarning, match="unisolated"):
        harness.reset("system", "task", ws)
    return harness


def _shell(command: str) -> Action:
    return Action("", (ToolCall.make("", "shell", {"command": command}),))


@pytest.mark.parametrize("name", ["tools", "usage", "harness", "append"])
def test_without_readout_no_result_shows_the_budget(
    name: str, counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    harness = _harness(name, counter, tmp_path / "ws")
    result = harness.step(_shell("seq 1 40"))
    assert result.observations and "[context: " not in "\n".join(result.observations)
    assert result.readout.startswith("[context: ")  # still measured, for the records
    # and the system prompt does not promise a readout
    assert "shows how full" not in system_prompt("skill", readout=False)
    assert "Every tool result shows how full it is." in system_prompt("skill", readout=True)


def test_file_mode_keeps_the_readout_and_a_run_can_turn_it_on_elsewhere(
    counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    assert "[context: " in _harness("file", counter, tmp_path / "a").step(_shell("echo hi")).observations[0]
    on = _harness("append", counter, tmp_path / "b", readout=True)
    assert "[context: " in on.step(_shell("echo hi")).observations[0]


def test_without_rollback_an_overflow_ends_the_episode(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    harness = _harness("append", counter, tmp_path / "ws")
    result = harness.step(_shell("seq 1 2000"))
    assert (result.reason, result.rolled_back_turns) == ("overflow", 0)
    rolled = _harness("append", counter, tmp_path / "ws2", rollback=True).step(_shell("seq 1 2000"))
    assert rolled.reason is None and rolled.rolled_back_turns > 0


# What each mode's top nudge must name (its own means), and what no mode but file may name.
NAMES_ITS_MEANS = {
    "file": "context.md",
    "tools": "context_note",
    "usage": "evict_file_view",
    "harness": "note the exact values",
    "append": "Nothing can be removed",
}


@pytest.mark.parametrize("name", MODE_NAMES)
def test_nudges_and_overflow_note_name_the_modes_own_means(
    name: str, counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    harness = _harness(name, counter, tmp_path / "ws", nudges=True, rollback=True)
    means = harness.means
    texts = [
        bud.tier_nudge(bud.BudgetState.initial(harness.config), 510, harness.config, means),
        bud.tier_nudge(bud.BudgetState.initial(harness.config), 800, harness.config, means),
        bud.urgent_nudge(880, [10], harness.config, means),
        bud.overflow_note(harness.config, [], [], freed=100, means=means),
    ]
    assert all(t is not None for t in texts)
    joined = "\n".join(t for t in texts if t)
    assert NAMES_ITS_MEANS[name] in texts[1]  # type: ignore[operator]
    if name != "file":
        assert "context.md" not in joined
    # the harness itself nudges in these words when the run turns nudges on
    result = harness.step(_shell("seq 1 180"))
    nudged = "\n".join(result.nudges)
    assert (result.nudges and "context.md" not in nudged) or name == "file"


def test_usage_means_follow_the_grants() -> None:
    only_archive = make_mode("usage", ModesConfig(usage=UsageModeConfig(evict=False)))
    text = only_archive.means(CFG).compact
    assert "archive_thread" in text and "evict_file_view" not in text


def test_usage_modes_backstop_is_a_fold_when_the_window_is_full() -> None:
    mode = make_mode("usage", CFG)
    assert mode.pressure is not None  # type: ignore[attr-defined]
    backstop = mode.pressure.config  # type: ignore[attr-defined]
    assert (backstop.spill, backstop.compact_pct) == (False, 1.0)  # folds only; eviction stays the model's
    off = make_mode("usage", ModesConfig(usage=UsageModeConfig(compaction=False)))
    assert off.pressure is None  # type: ignore[attr-defined]
    assert "read_overflow" not in [t["function"]["name"] for t in off.tool_schemas(CFG)]
