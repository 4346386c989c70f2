"""The context file: the editable region rendered as text, and the tolerant parser that reads it back.

File format (one block per turn, numbered from 1 in file order)::

    [[CTX_TURN 1 role=user]]
    text of the turn
    [[CTX_TURN 2 role=assistant]]
    the model's words
    [[CTX_CALL id=call_1_0 name=shell]] {"command": "ls"}
    [[CTX_TURN 3 role=tool id=call_1_0 name=shell]]
    output of ls

- A header starts a line; the text up to the next header is the turn's content. Tool calls of an
  assistant turn are ``[[CTX_CALL id=… name=…]] {json arguments}`` lines; a tool turn's header names the
  call it answers. The pinned prefix (system prompt, task) is never in the file.
- Content lines that themselves start with ``[[CTX_`` (say, a tool output that printed this file) are
  written with one extra leading backslash and read back without it, so they never become headers.

Parse-back contract (:func:`parse_context`), whatever the file holds (any bytes):

- it never raises; bytes that are not UTF-8 are decoded with replacement characters;
- headers are matched leniently (any case, spaces inside the brackets, any attribute order, the number is
  ignored); text after ``]]`` on a header line becomes the first line of the turn;
- role folding: ``assistant`` stays, ``tool`` stays only with an ``id=`` (and only if a call with that id
  precedes it, see below); every other role (``system`` included), or none, becomes ``user``. Text before
  the first header becomes a user note. No edit can mint ``system`` authority;
- a ``[[CTX_CALL …]]`` line counts as a call only in an assistant turn, with an id and a JSON object of
  arguments; otherwise it stays text;
- the result goes through :func:`ctxrl.env.context.normalize_turns`: emptied turns are dropped, a call
  whose result was deleted keeps a stub result, a result whose call was deleted becomes a user note (its
  text kept), results are moved back next to their call, and adjacent same-role turns are merged.

Rendering an unedited (normalised) region and parsing it back gives the same turns.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ctxrl.env.context import ToolCall, Turn, canonical_json, normalize_turns
from ctxrl.env.gate import loads_bounded

_HEADER = re.compile(r"^\[\[[ \t]*CTX_TURN\b([^\]\n]*)\]\]([^\n]*)$", re.IGNORECASE | re.MULTILINE)
_CALL = re.compile(r"^\[\[[ \t]*CTX_CALL\b([^\]\n]*)\]\][ \t]?(.*)$", re.IGNORECASE)
# Starts only at a word start: from inside a word, every start re-scanned the rest of it (quadratic).
_ATTR = re.compile(r"(?<!\w)(\w+)[ \t]*=[ \t]*[\"']?([^\s\"']*)")
# A content line that the parser would take for markup, possibly already escaped with backslashes.
_NEEDS_ESCAPE = re.compile(r"^(\\*\[\[[ \t]*CTX_)", re.IGNORECASE | re.MULTILINE)
_ESCAPED = re.compile(r"^\\(\\*\[\[[ \t]*CTX_)", re.IGNORECASE | re.MULTILINE)


def _escape(text: str) -> str:
    # Fast path: most turns hold no markup at all.
    if "[[" not in text:
        return text
    return _NEEDS_ESCAPE.sub(r"\\\1", text)


def _unescape(text: str) -> str:
    if "[[" not in text:
        return text
    return _ESCAPED.sub(r"\1", text)


def render_turn(number: int, turn: Turn) -> str:
    """One turn's block: header line, escaped content, call lines; ends with a newline."""
    header = f"[[CTX_TURN {number} role={turn.role}"
    if turn.role == "tool":
        header += f" id={turn.tool_call_id} name={turn.name}"
    lines = [_escape(turn.content)] if turn.content or not turn.tool_calls else []
    lines += [f"[[CTX_CALL id={c.id} name={c.name}]] {c.arguments}" for c in turn.tool_calls]
    return header + "]]\n" + "\n".join(lines) + "\n"


def render_context(turns: Sequence[Turn]) -> str:
    """The context file's text for the editable region ``turns``."""
    return "".join(render_turn(i, t) for i, t in enumerate(turns, start=1))


def _attrs(text: str) -> dict[str, str]:
    return {k.lower(): v for k, v in _ATTR.findall(text)}


def _split_calls(body: str) -> tuple[str, tuple[ToolCall, ...]]:
    """Separate well-formed call lines from the text of an assistant block."""
    if "[[" not in body:
        return body, ()
    text_lines: list[str] = []
    calls: list[ToolCall] = []
    for line in body.split("\n"):
        call = _parse_call_line(line)
        if call is None:
            text_lines.append(line)
        else:
            calls.append(call)
    return "\n".join(text_lines), tuple(calls)


def _parse_call_line(line: str) -> ToolCall | None:
    m = _CALL.match(line)
    if m is None:
        return None
    attrs = _attrs(m.group(1))
    call_id, name = attrs.get("id", ""), attrs.get("name", "")
    if not call_id or not name:
        return None
    try:
        arguments = loads_bounded(m.group(2))
    except ValueError:
        return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(id=call_id, name=name, arguments=canonical_json(arguments))


def _block_turn(attrs: dict[str, str], body: str) -> Turn:
    role = attrs.get("role", "").lower()
    if role == "assistant":
        text, calls = _split_calls(body)
        return Turn("assistant", _unescape(text), tool_calls=calls)
    if role == "tool" and attrs.get("id"):
        return Turn("tool", _unescape(body), tool_call_id=attrs["id"], name=attrs.get("name") or "tool")
    return Turn("user", _unescape(body))


def _strip_one_newline(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text


def parse_context(data: str | bytes) -> list[Turn]:
    """Parse a context file back into a legal editable region; never raises (see the module docstring)."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    headers = list(_HEADER.finditer(text))
    stray_end = headers[0].start() if headers else len(text)
    turns: list[Turn] = []
    stray = _strip_one_newline(text[:stray_end])
    if stray.strip():
        turns.append(Turn("user", _unescape(stray)))
    for k, m in enumerate(headers):
        end = headers[k + 1].start() if k + 1 < len(headers) else len(text)
        body = _strip_one_newline(text[m.end() + 1 : end])
        trailing = m.group(2).strip()
        if trailing:
            body = f"{trailing}\n{body}" if body else trailing
        turns.append(_block_turn(_attrs(m.group(1)), body))
    return normalize_turns(turns)
