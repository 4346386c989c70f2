"""The gate for model output (issue 24, item 1): one place bounds and cleans every action before the step
reads it, and nothing in ``ctxrl.env`` reads model JSON or walks model structure any other way."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from ctxrl.env.actions import FORMAT_ERROR_TOOL, parse_tool_calls
from ctxrl.env.context import ToolCall
from ctxrl.env.gate import MAX_CALLS, MAX_DEPTH, MAX_TEXT_CHARS, clean_text, json_depth, loads_bounded
from ctxrl.env.harness import Action, Harness
from ctxrl.errors import UsageError

ENV = Path(__file__).parents[2] / "src" / "ctxrl" / "env"
RECURSION_ALLOWED = {
    ("harness.py", "close"),  # the runner's own close, not a walk
    ("special.py", "_neutral_value"),  # message structure, capped at depth 8 (arguments go through JSON text)
    ("modes/common.py", "_check_value"),  # follows our tool schemas, not the model's nesting
}


def _sources() -> list[tuple[str, ast.Module]]:
    return [
        (str(p.relative_to(ENV)), ast.parse(p.read_text(encoding="utf-8")))
        for p in sorted(ENV.rglob("*.py"))
        if "tasks" not in p.relative_to(ENV).parts  # task generators read their own data files
    ]


def test_no_env_module_recurses_or_parses_json_outside_the_gate() -> None:
    """By construction: a self-calling function or a bare ``json.loads`` in ``ctxrl.env`` is a place where
    model-controlled nesting could raise RecursionError again (the regression this issue found)."""
    recursive, loads = [], []
    for name, tree in _sources():
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Call):
                        f = node.func
                        called = (
                            f.id
                            if isinstance(f, ast.Name)
                            else f.attr
                            if isinstance(f, ast.Attribute)
                            and isinstance(f.value, ast.Name)
                            and f.value.id in ("self", "cls")
                            else ""
                        )
                        if called == fn.name and (name, fn.name) not in RECURSION_ALLOWED:
                            recursive.append(f"{name}:{fn.lineno} {fn.name}")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "loads"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "json"
                and name != "gate.py"
            ):
                loads.append(f"{name}:{node.lineno}")
    assert not recursive, f"recursive functions in ctxrl.env: {recursive}"
    assert not loads, f"json.loads outside ctxrl.env.gate (use loads_bounded): {loads}"


def test_the_scan_sees_through_strings_and_bounds_before_parsing() -> None:
    assert json_depth(json.dumps({"a": 'x\\"[[{', "b": [[{"c": "]]]"}]]})) == 4
    assert json_depth("[" * 100_000) == 100_000  # linear, no recursion
    assert loads_bounded("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    with pytest.raises(ValueError, match=f"nested {MAX_DEPTH + 1} deep"):
        loads_bounded("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    assert clean_text("a\x00b\x07c\td\ne\x9f\ud800") == "abc\td\ne\ufffd"


def test_parsed_calls_nested_past_the_bound_are_format_errors() -> None:
    deep = "[" * 5000 + "]" * 5000
    _, calls = parse_tool_calls(f'<tool_call>{{"name": "shell", "arguments": {{"x": {deep}}}}}</tool_call>')
    assert calls[0].name == FORMAT_ERROR_TOOL and "nested 5002 deep" in calls[0].args()["error"]


def _call(arguments: str, name: str = "shell") -> ToolCall:
    return ToolCall("", name, arguments)


def test_the_harness_gates_every_action(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(budget=200_000, reserve=500)
    deep = '{"command": ' + "[" * 200 + "]" * 200 + "}"
    r = h.step(Action("", (_call(deep),)))
    assert "the arguments nest 201 deep; at most 32 levels" in r.observations[0]
    # a control character escaped in the arguments: refused with its name, not stripped into another command
    r = h.step(Action("", (_call('{"command": "echo a\\u0007b"}'),)))
    assert "U+0007" in r.observations[0] and "nothing ran" in r.observations[0]
    # an escaped backslash followed by the letters u0000 is just text
    r = h.step(Action("", (ToolCall.make("", "shell", {"command": "echo '\\u0000'"}),)))
    assert r.observations[0].startswith("\\u0000\n")
    # too many calls: the first MAX_CALLS run, one receipt says how many did not
    many = tuple(ToolCall.make("", "shell", {"command": f"echo {i}"}) for i in range(MAX_CALLS + 4))
    r = h.step(Action("", many))
    assert len(r.observations) == MAX_CALLS + 1
    assert r.observations[MAX_CALLS - 1].startswith(f"{MAX_CALLS - 1}\n")
    assert f"4 more calls were not run: at most {MAX_CALLS} a turn" in r.observations[MAX_CALLS]
    # prose: control characters gone before the context holds it
    h.step(Action("ok\x00\x1b[1m done", (ToolCall.make("", "shell", {"command": "true"}),)))
    assert [t.content for t in h.context.turns if t.role == "assistant"][-1] == "ok[1m done"
    # tool results: a NUL a program printed does not reach the prompt
    r = h.step(Action("", (ToolCall.make("", "shell", {"command": "printf 'a\\000b'"}),)))
    assert r.observations[0].startswith("ab\n")


def test_a_message_whose_calls_are_not_objects_gets_receipts(make_harness: Callable[..., Harness]) -> None:
    """OpenAI-style messages through ``Harness.step``: a call or a ``function`` that is not an object is a
    malformed-call receipt, one call not in a list is read as that call; anything but a message is refused."""
    h = make_harness(budget=200_000, reserve=500)
    for calls in (["shell"], [{"function": "shell"}], [{"function": ["shell"]}], "shell", [7]):
        r = h.step({"tool_calls": calls})
        assert len(r.observations) == 1 and "a tool call must be an object" in r.observations[0], calls
    r = h.step({"tool_calls": {"function": {"name": "shell", "arguments": {"command": "echo one"}}}})
    assert r.observations[0].startswith("one\n")
    r = h.step(
        {
            "content": "",
            "tool_calls": [
                {"id": "c1", "function": {"name": "shell", "arguments": '{"command": "echo two"}'}}
            ],
        }
    )
    assert r.observations[0].startswith("two\n")
    with pytest.raises(UsageError, match="an Action or an OpenAI-style message dict, got str"):
        h.step("<tool_call>{}</tool_call>")  # type: ignore[arg-type]


def test_a_turn_past_the_bound_is_cut_with_a_marker() -> None:
    gated = Action("x" * (MAX_TEXT_CHARS + 12)).gated()
    assert gated.content.endswith(f"x\n[cut: 12 more characters; a turn holds {MAX_TEXT_CHARS:,}]")
    assert len(gated.content) < MAX_TEXT_CHARS + 60
    assert Action("short").gated().content == "short"
