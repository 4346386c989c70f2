"""The mode registry is the one description of a mode: its entries agree with the modes they build."""

from __future__ import annotations

import pytest

from ctxrl.env.config import HarnessConfig
from ctxrl.env.modes import EDIT_TOOLS, MODE_NAMES, MODES, default_skill, make_mode, mode_spec
from ctxrl.env.modes.tools import CONTEXT_TOOLS
from ctxrl.env.policies import POLICY_MODES
from ctxrl.errors import ConfigError


def _tool_names(mode_name: str, config: HarnessConfig) -> set[str]:
    return {t["function"]["name"] for t in make_mode(mode_name, config).tool_schemas(config)}


def test_the_registry_names_every_mode_once() -> None:
    assert MODE_NAMES == ("file", "tools", "usage", "harness", "append")
    assert all(MODES[name].name == name and make_mode(name, HarnessConfig()).name == name for name in MODES)
    assert POLICY_MODES == {
        "file-manager": "file",
        "tools-manager": "tools",
        "usage-manager": "usage",
        "harness": "harness",
        "append": "append",
    }


@pytest.mark.parametrize("name", MODE_NAMES)
def test_entry_agrees_with_the_mode_it_builds(name: str) -> None:
    spec = mode_spec(name)
    mode = make_mode(name, HarnessConfig())
    assert mode.budget == spec.budget == type(mode).budget
    assert default_skill(name) == spec.skill and spec.skill.strip()
    # the edit tools are tools the mode really offers (tools mode offers its context tools during an episode)
    offers = _tool_names(name, HarnessConfig()) | (set(CONTEXT_TOOLS) if name == "tools" else set())
    assert spec.edit_tools <= offers


def test_edit_tools_are_what_the_issue_and_the_seeds_call_edits() -> None:
    assert mode_spec("tools").edit_tools == {"context_pin", "context_unpin", "context_drop", "context_note"}
    assert mode_spec("usage").edit_tools == {"evict_file_view", "archive_thread"}
    assert mode_spec("file").edit_tools == frozenset()  # shell commands, recognised by their receipts
    assert mode_spec("tools").edit_tools | mode_spec("usage").edit_tools == EDIT_TOOLS


def test_only_file_mode_rolls_back_and_only_harness_always_runs_the_pressure_pass() -> None:
    assert [n for n in MODES if MODES[n].budget.rollback] == ["file"]
    assert [n for n in MODES if MODES[n].budget.pressure == "always"] == ["harness"]


def test_unknown_mode_names_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="unknown mode 'notes'; modes: file, tools, usage, harness, append"):
        mode_spec("notes")
