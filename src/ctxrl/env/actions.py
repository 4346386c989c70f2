"""Parse a model's generated text into an :class:`~ctxrl.env.harness.Action`.

The tiny model's chat template (and Qwen-style templates) write a tool call as

    <tool_call>{"name": "shell", "arguments": {"command": "ls"}}</tool_call>

Everything outside the tags is the message's prose. Parsing never raises: a call that cannot be read (bad
JSON, no name, arguments that are not an object, an unclosed tag) becomes a call of the reserved tool
:data:`FORMAT_ERROR_TOOL` whose ``error`` argument says what is wrong; the harness answers it with a format
receipt instead of running anything, so the model sees its mistake and the episode goes on.
"""

from __future__ import annotations

import re
from typing import Any

from ctxrl.env.context import ToolCall
from ctxrl.env.gate import loads_bounded

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALL_SYNTAX = 'write each call as <tool_call>{"name": ..., "arguments": {...}}</tool_call>'
"""How a format receipt says to write a call."""
FORMAT_ERROR_TOOL = "invalid_tool_call"
"""Reserved tool name carrying a malformed call; its arguments are ``{"error": ..., "text": ...}``."""

_EOS_MARKERS = ("<|im_end|>", "<|endoftext|>")
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|\Z)", re.DOTALL)


def _drop_markers(text: str) -> str:
    """``text`` without end-of-turn markers, including ones that removing another one would join up
    (``<|im_<|im_end|>end|>``): a marker is cut as soon as the text kept so far ends with one, so what is
    kept never holds one. Linear in the text: a few passes of ``str.replace`` (enough unless markers nest
    deeper), then one scan of the characters."""
    if not any(m in text for m in _EOS_MARKERS):
        return text
    for _ in range(4):  # the common case at C speed: markers that removing others does not join up
        for marker in _EOS_MARKERS:
            text = text.replace(marker, "")
        if not any(m in text for m in _EOS_MARKERS):
            return text
    kept: list[str] = []
    tail = ""  # the last characters kept, enough to see a marker end
    width = max(len(m) for m in _EOS_MARKERS)
    for ch in text:
        kept.append(ch)
        tail = (tail + ch)[-width:]
        for marker in _EOS_MARKERS:
            if tail.endswith(marker):
                del kept[-len(marker) :]
                tail = "".join(kept[-width:])
                break
    return "".join(kept)


def call_blocks(text: str) -> list[tuple[int, int, str, bool]]:
    """``(start, end, body, closed)`` of every ``<tool_call>`` block of ``text``, in order; an unclosed last
    block runs to the end of the text. The one reader of tool-call markup (edit masks use it too)."""
    return [(m.start(), m.end(), m.group(1), m.group(0).endswith(CLOSE)) for m in _BLOCK.finditer(text)]


def format_error_call(error: str, text: str) -> ToolCall:
    """A call of :data:`FORMAT_ERROR_TOOL`: the harness answers it with a format receipt saying ``error``."""
    return ToolCall.make("", FORMAT_ERROR_TOOL, {"error": error, "text": text[:200]})


def _parse_call(body: str, closed: bool) -> ToolCall:
    if not closed:
        return format_error_call(f"unclosed {OPEN}: end the call with {CLOSE}", body)
    try:
        value: Any = loads_bounded(body)
    except ValueError as exc:
        return format_error_call(f"the call is not valid JSON ({exc})", body)
    if not isinstance(value, dict):
        return format_error_call('the call must be a JSON object {"name": ..., "arguments": {...}}', body)
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return format_error_call('the call has no "name" string', body)
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some templates double-encode arguments
        try:
            arguments = loads_bounded(arguments)
        except ValueError:
            return format_error_call('"arguments" is a string that is not a JSON object', body)
    if not isinstance(arguments, dict):
        return format_error_call('"arguments" must be a JSON object', body)
    return ToolCall.make(str(value.get("id") or ""), name, arguments)


def parse_tool_calls(text: str) -> tuple[str, tuple[ToolCall, ...]]:
    """Split generated ``text`` into (prose, tool calls in order). Never raises.

    End-of-turn markers the engine may have kept are dropped (none is left, however they nest). Malformed
    calls come back as :data:`FORMAT_ERROR_TOOL` calls.

    >>> prose, calls = parse_tool_calls('ok <tool_call>{"name": "shell", "arguments": {"command": "ls"}}</tool_call>')
    >>> prose, calls[0].name, calls[0].args()
    ('ok', 'shell', {'command': 'ls'})
    >>> parse_tool_calls("<tool_call>{oops</tool_call>")[1][0].name
    'invalid_tool_call'
    >>> parse_tool_calls("<|im_<|im_end|>end|>ok")[0]
    'ok'
    """
    text = _drop_markers(text)
    calls: list[ToolCall] = []
    prose: list[str] = []
    pos = 0
    for start, end, body, closed in call_blocks(text):
        prose.append(text[pos:start])
        calls.append(_parse_call(body.strip(), closed))
        pos = end
    prose.append(text[pos:])
    stray_close = "".join(prose).count(CLOSE)
    if stray_close:
        calls.append(format_error_call(f"{CLOSE} without a matching {OPEN}", text))
    return "".join(prose).replace(CLOSE, "").strip(), tuple(calls)
