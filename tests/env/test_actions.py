"""Parsing generated text into tool calls: well-formed calls, and a format error for each malformed kind."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxrl.env.actions import FORMAT_ERROR_TOOL, parse_tool_calls


def test_prose_and_calls_in_order() -> None:
    text = (
        'I will look. <tool_call>{"name": "shell", "arguments": {"command": "ls"}}</tool_call>'
        ' then <tool_call>{"name": "submit", "arguments": {"answer": "42"}}</tool_call><|im_end|>'
    )
    prose, calls = parse_tool_calls(text)
    assert prose == "I will look.  then"
    assert [(c.name, c.args()) for c in calls] == [("shell", {"command": "ls"}), ("submit", {"answer": "42"})]


def test_double_encoded_arguments_accepted() -> None:
    _, calls = parse_tool_calls(
        '<tool_call>{"name": "shell", "arguments": "{\\"command\\": \\"pwd\\"}"}</tool_call>'
    )
    assert calls[0].args() == {"command": "pwd"}


def test_each_malformed_kind_is_a_format_error() -> None:
    cases = {
        "<tool_call>{oops</tool_call>": "not valid JSON",
        "<tool_call>[1, 2]</tool_call>": "JSON object",
        '<tool_call>{"arguments": {}}</tool_call>': 'no "name"',
        '<tool_call>{"name": "shell", "arguments": [1]}</tool_call>': '"arguments" must be',
        '<tool_call>{"name": "shell", "arguments": {}}': "unclosed",
        "text </tool_call> more": "without a matching",
    }
    for text, needle in cases.items():
        _, calls = parse_tool_calls(text)
        assert len(calls) == 1, text
        assert calls[0].name == FORMAT_ERROR_TOOL
        assert needle in calls[0].args()["error"], (text, calls[0].args())


def test_no_call_is_just_prose() -> None:
    assert parse_tool_calls("  just thinking  ") == ("just thinking", ())


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([*'<>/{}[]":, abtool_cl\n', "<tool_call>", "</tool_call>", '"name"'])).map(
        "".join
    )
)
def test_never_raises(text: str) -> None:
    prose, calls = parse_tool_calls(text)
    assert isinstance(prose, str)
    assert all(c.name for c in calls)
