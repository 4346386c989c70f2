"""Verifiers: hand-made right answers, wrong answers and near misses for every kind."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxrl.env.sandbox import Sandbox, SandboxConfig
from ctxrl.env.tasks import verifiers
from ctxrl.env.tasks.base import VerifierSpec
from ctxrl.errors import SandboxError, TaskError


def test_doctests_of_verifiers_pass() -> None:
    result = doctest.testmod(verifiers)
    assert result.attempted >= 8 and result.failed == 0


# -- exact ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "ok"),
    [
        ("Brightwater", True),
        ("  Brightwater \n", True),  # surrounding whitespace is tolerated
        ("Bright water", False),
        ("brightwater", False),  # case matters by default
        ("Brightwater.", False),
        ("", False),
    ],
)
def test_exact(answer: str, ok: bool) -> None:
    assert VerifierSpec("exact", expected="Brightwater").verify(answer).success is ok


def test_exact_collapses_inner_whitespace_and_can_ignore_case() -> None:
    spec = VerifierSpec("exact", expected="New  Port\tCity", case_sensitive=False)
    assert spec.verify("new port\ncity").success
    assert not spec.verify("new portcity").success


# -- all_values -------------------------------------------------------------------------------------------------

_VALUES = VerifierSpec(
    "all_values", expected=["9f3a2c1b77e0", "14521", "b-d38a4a"], forbidden=["14520", "b-d35a4a"]
)


@pytest.mark.parametrize(
    ("answer", "ok", "score"),
    [
        ("orion-7 vault_key = 9f3a2c1b77e0\nlyra-5 port = 14521\nhydra-7 build = b-d38a4a", True, 1.0),
        ("9f3a2c1b77e0, 14521,   b-d38a4a.", True, 1.0),  # punctuation and spacing around values are fine
        ("9f3a2c1b77e0 14522 b-d38a4a", False, 2 / 3),  # one digit off
        ("9f3a2c1b77e0 145210 b-d38a4a", False, 2 / 3),  # an extra digit is a different value
        ("9f3a2c1b77e 14521 b-d38a4a", False, 2 / 3),  # a truncated hash
        ("9f3a2c1b77e0 b-d38a4a", False, 2 / 3),  # a missing value
        ("9f3a2c1b77e0 14521 b-d38a4a 14520", False, 0.0),  # right values plus a near-duplicate distractor
        ("9F3A2C1B77E0 14521 b-d38a4a", False, 2 / 3),  # verbatim means case too
        ("", False, 0.0),
    ],
)
def test_all_values(answer: str, ok: bool, score: float) -> None:
    verdict = _VALUES.verify(answer)
    assert verdict.success is ok
    assert verdict.score == pytest.approx(score)


def test_all_values_token_boundaries_for_decimals_and_names() -> None:
    assert not VerifierSpec("all_values", expected=["12"]).verify("12.5").success
    assert not VerifierSpec("all_values", expected=["1500"]).verify("21500").success
    assert VerifierSpec("all_values", expected=["1.2.17"]).verify("firmware 1.2.17.").success
    assert not VerifierSpec("all_values", expected=["orion-7"]).verify("orion-71").success
    # A multi-word value may be wrapped or spaced differently.
    assert VerifierSpec("all_values", expected=["Chiara Olsen"]).verify("founder: Chiara\n  Olsen").success


# -- board ----------------------------------------------------------------------------------------------------

_GRID = "A . B\n. C .\nD . ."


@pytest.mark.parametrize(
    "answer",
    [
        "A . B\n. C .\nD . .",
        "The final board:\n\n  A  .  B \n . C . \n D . .  \n\nThat is all.",  # prose and extra spaces
        "| A | . | B |\n| . | C | . |\n| D | . | . |",  # pipes as separators
        "r1 A . B\nr2 . C .\nr3 D . .",  # row labels
        "A . B\n\n. C .\n\nD . .",  # blank lines between rows
        "Before:\nA B .\n. C .\nD . .\nAfter the last event:\nA . B\n. C .\nD . .",  # the last grid counts
    ],
)
def test_board_right_answers(answer: str) -> None:
    verdict = VerifierSpec("board", expected=_GRID).verify(answer)
    assert verdict.success, verdict.detail


@pytest.mark.parametrize(
    ("answer", "score"),
    [
        ("A B .\n. C .\nD . .", 7 / 9),  # stale state: before the last move of B
        ("A . B\n. C .\n. D .", 7 / 9),  # one piece misplaced
        ("A . B\n. C .\nD . .\nA . .\n. . .\n. . .", 6 / 9),  # a later wrong grid overrides the right one
        ("A . B\n. C .", 0.0),  # too few rows
        ("A . B .\n. C . .\nD . . .", 0.0),  # wrong width
        ("a . b\n. c .\nd . .", 5 / 9),  # cells are case-sensitive
        ("no grid here", 0.0),
    ],
)
def test_board_wrong_answers(answer: str, score: float) -> None:
    verdict = VerifierSpec("board", expected=_GRID).verify(answer)
    assert not verdict.success
    assert verdict.score == pytest.approx(score)


# -- json_fields ------------------------------------------------------------------------------------------------


def test_json_fields() -> None:
    spec = VerifierSpec("json_fields", expected={"city": "Calder", "year": 1957})
    assert spec.verify('{"city": "Calder", "year": 1957, "note": "extra fields are fine"}').success
    assert spec.verify('Here you go: {"year": 1957.0, "city": " Calder "} done').success
    assert spec.verify('{"city": "Calder", "year": 1958}').score == pytest.approx(0.5)
    assert not spec.verify('{"city": "Calder", "year": "1957"}').success  # a string is not the number
    assert not spec.verify('{"city": "Calder"').success  # broken JSON
    assert not spec.verify("[1957]").success
    assert not VerifierSpec("json_fields", expected={"ok": True}).verify('{"ok": 1}').success


# -- command --------------------------------------------------------------------------------------------------


def _sandbox(workspace: Path) -> Sandbox:
    try:
        return Sandbox(workspace, SandboxConfig())
    except SandboxError:  # no namespaces on this machine: the only case where running unisolated is allowed
        return Sandbox(workspace, SandboxConfig(backend="none"))


def test_command_success_failure_and_restore(tmp_path: Path) -> None:
    spec = VerifierSpec(
        "command",
        command="python3 check.py",
        restore={
            "check.py": "import pathlib, sys\nsys.exit(0 if pathlib.Path('out.txt').read_text() == 'ok' else 1)\n"
        },
    )
    (tmp_path / "out.txt").write_text("nope")
    # The model "fixed" the check instead of the output: restore puts the original back before running it.
    (tmp_path / "check.py").write_text("print('pass')\n")
    verdict = spec.verify("whatever", tmp_path, _sandbox)
    assert not verdict.success and "exit 1" in verdict.detail
    (tmp_path / "out.txt").write_text("ok")
    assert spec.verify("", tmp_path, _sandbox).success


def test_command_without_workspace_and_on_timeout(tmp_path: Path) -> None:
    spec = VerifierSpec("command", command="sleep 5", timeout_s=0.5)
    assert not spec.verify("x").success
    verdict = spec.verify("x", tmp_path, _sandbox)
    assert not verdict.success and "timed out" in verdict.detail


# -- the spec as data -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kind": "fuzzy", "expected": "x"}, "unknown verifier kind 'fuzzy'; known kinds: exact, all_values"),
        ({"kind": "all_values", "expected": []}, "non-empty list"),
        ({"kind": "all_values", "expected": ["a"], "forbidden": ["a"]}, "both expected and forbidden"),
        ({"kind": "board", "expected": "A .\n. . ."}, "rows|lines of equally many cells"),
        ({"kind": "command"}, "needs field 'command'"),
        ({"kind": "command", "command": "true", "restore": {"../x": ""}}, "not a relative path"),
        ({"kind": "exact", "expected": 3}, "needs field 'expected' to be a string"),
        ({"kind": "exact", "expected": "x", "colour": 1}, "unknown field"),
        ({"expected": "x"}, "missing field 'kind'"),
    ],
)
def test_verifier_spec_errors_name_the_problem(data: dict[str, object], message: str) -> None:
    with pytest.raises(TaskError, match=message):
        VerifierSpec.from_dict(data, "tasks.jsonl:3: verifier")


def test_verifier_spec_round_trips() -> None:
    spec = VerifierSpec("all_values", expected=["a", "b"], forbidden=["c"], case_sensitive=False)
    assert VerifierSpec.from_dict(spec.to_dict()) == spec


_SPECS = [
    VerifierSpec("exact", expected="x"),
    _VALUES,
    VerifierSpec("board", expected=_GRID),
    VerifierSpec("json_fields", expected={"a": 1}),
]


@settings(max_examples=200, deadline=None)
@given(answer=st.text(max_size=400))
def test_verify_never_raises(answer: str) -> None:
    for spec in _SPECS:
        verdict = spec.verify(answer)
        assert 0.0 <= verdict.score <= 1.0
        assert verdict.success == (verdict.score == 1.0)


def test_verify_accepts_non_string_answers() -> None:
    for spec in _SPECS:
        assert not spec.verify(None).success  # type: ignore[arg-type]
    assert VerifierSpec("exact", expected="42").verify(42).success  # type: ignore[arg-type]


def test_command_restore_never_writes_through_a_symlink(tmp_path: Path) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "host"
    workspace.mkdir()
    outside.mkdir()
    # The model replaced the checked folder by a link to a host folder, and the checked file by a link too.
    (workspace / "tests").symlink_to(outside, target_is_directory=True)
    (outside / "keep.txt").write_text("host file")
    spec = VerifierSpec(
        "command", command="cat tests/check.sh", restore={"tests/check.sh": "echo original\n"}
    )
    assert spec.verify("", workspace, _sandbox).success
    assert (workspace / "tests" / "check.sh").read_text() == "echo original\n"
    assert not (workspace / "tests").is_symlink()
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
