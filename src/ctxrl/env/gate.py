"""The gate for model output: every step's action passes here before anything else in the step reads it.

A step's input is model output — or, through the Gymnasium wrapper and ``Harness.step``, anything a caller
builds — and so is every byte the model wrote into its context file. Everything after the gate (the modes'
hooks, the monitor, the readout, receipts, cost, the sandbox) reads only what the gate let through, and the
gate is the one place that bounds and normalises it (``Action.gated`` in :mod:`ctxrl.env.harness` applies it):

- **text** (the prose, every call's id and name, every string in its arguments, every tool result):
  :func:`clean_text` — lone surrogates become U+FFFD, NUL and the other control characters but tab, newline
  and carriage return are removed;
- **size**: prose past :data:`MAX_TEXT_CHARS` is cut with a marker in the text saying how much; at most
  :data:`MAX_CALLS` calls a turn (the rest become one malformed-call receipt); a call whose arguments pass
  :data:`MAX_ARGUMENT_CHARS` becomes a malformed-call receipt;
- **structure**: JSON from the model is read only through :func:`loads_bounded`, which measures the nesting
  by one scan of the text (:func:`json_depth`) and refuses past :data:`MAX_DEPTH` before any parser or
  encoder sees it. Nothing in ``ctxrl.env`` walks model-controlled structure by recursion (a test reads the
  source for self-calls and direct ``json.loads``).

A malformed call is answered by the harness with a format receipt, so the model reads what was cut and why.
Special-token spellings are neutralised where every text meets the chat template (:mod:`ctxrl.env.special`).

>>> clean_text("a\\x00b\\x1b[0mc\\td")
'ab[0mc\\td'
>>> json_depth('{"a": [1, {"b": "[[[["}]}')
3
>>> loads_bounded("[" * 40 + "]" * 40)
Traceback (most recent call last):
ValueError: nested 40 deep; at most 32 levels of lists and objects
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 32
"""Deepest nesting of lists and objects read from model JSON (tool-call arguments, context-file calls)."""
MAX_TEXT_CHARS = 200_000
"""Longest prose of one action; past it the text is cut (about 50k tokens: far past any budget)."""
MAX_CALLS = 16
"""Most tool calls run in one turn."""
MAX_ARGUMENT_CHARS = 256 * 1024
"""Longest arguments text of one call (a shell command is refused at 128 KiB by the sandbox anyway)."""

_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


def clean_text(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD and control characters (but tab, newline and carriage
    return) removed: what tokenizers, files, programs and prompts can all hold."""
    if not text.isascii():
        text = _SURROGATE.sub("\ufffd", text)
    return _CONTROL.sub("", text)


def json_depth(text: str) -> int:
    """The deepest nesting of lists and objects in JSON ``text`` (brackets inside strings not counted), by one
    pass over the text: never recursion, whatever the model wrote. Not a validator: bad JSON gets a number too.
    """
    depth = deepest = 0
    for m in _BRACKET.finditer(_STRING.sub("", text)):
        if m.group(0) in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth = max(depth - 1, 0)
    return deepest


def loads_bounded(text: str, max_depth: int | None = MAX_DEPTH) -> Any:
    """``json.loads(text)`` for text from the model: a ValueError (like any bad JSON) when it nests deeper
    than ``max_depth``, checked before the parser runs. ``None``: no bound, for JSON this process wrote
    itself (a structure that has already been serialised); a parser past Python's recursion limit still
    ends in ValueError, never RecursionError."""
    if max_depth is not None:
        depth = json_depth(text)
        if depth > max_depth:
            raise ValueError(f"nested {depth} deep; at most {max_depth} levels of lists and objects")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested deeper than the parser can go") from None
