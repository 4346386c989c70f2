"""Edit masks over action tokens: 1 on the tokens of the tool call(s) that targeted the context.

A step's action is text the model generated, with tool calls written as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (the chat template in
:mod:`ctxrl.train.tiny_model`). Which calls targeted the context is the environment's knowledge (file mode:
the command whose receipt shows it changed or targeted the file; tool modes: the context tools), passed in
as call indices or character spans of the decoded action. Characters map to tokens by incremental
decoding, so any tokenizer works (no offset mapping needed) and byte-level tokens that split a character
are handled.

Settings:

- ``"edit_only_turns"`` (the reference): the tool-call tokens of steps whose every tool call is an edit;
  zero for a step that also does something else.
- ``"edit_tokens"``: the tokens of the edit calls in any step; other calls and the prose stay 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ctxrl.env.actions import call_blocks
from ctxrl.errors import ConfigError

__all__ = ["MaskSetting", "ToolCallSpan", "edit_mask", "parse_tool_calls", "token_char_spans"]

MaskSetting = Literal["edit_only_turns", "edit_tokens"]


@dataclass(frozen=True)
class ToolCallSpan:
    """One tool call in an action: ``text[start:end]`` runs from ``<tool_call>`` through ``</tool_call>``."""

    start: int
    end: int
    name: str | None
    """The call's ``name``, or None when its body is not a JSON object with a string name."""


def parse_tool_calls(text: str) -> list[ToolCallSpan]:
    """Every ``<tool_call>…</tool_call>`` in ``text``, in order; an unclosed last call runs to the end.

    >>> parse_tool_calls('ok <tool_call>{"name": "context_drop", "arguments": {}}</tool_call>')
    [ToolCallSpan(start=3, end=67, name='context_drop')]
    """
    calls = []
    for start, end, raw, _ in call_blocks(text):
        name = None
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("name"), str):
            name = body["name"]
        calls.append(ToolCallSpan(start, end, name))
    return calls


def token_char_spans(token_ids: Sequence[int], tokenizer: Any) -> tuple[str, list[tuple[int, int]]]:
    """Decode ``token_ids`` and give each token its ``[start, end)`` character range in the decoded text.

    Incremental: token ``t`` owns the characters that decoding ``ids[:t+1]`` adds to ``ids[:t]``. A token
    that ends inside a multi-byte character (the decode ends in U+FFFD) owns nothing yet; the token that
    completes the character owns it, and so do the pending tokens before it (they share its range).
    Special tokens are kept (``skip_special_tokens=False``).
    """

    def decode(ids: Sequence[int]) -> str:
        return str(tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False))

    spans: list[tuple[int, int]] = []
    pending: list[int] = []
    done = 0
    text = ""
    for t in range(len(token_ids)):
        text = decode(token_ids[: t + 1])
        pending.append(t)
        if text.endswith("\ufffd") and t + 1 < len(token_ids):
            continue
        spans.extend((done, len(text)) for _ in pending)
        pending.clear()
        done = len(text)
    return text, spans


def _resolve_edit_calls(
    calls: Sequence[ToolCallSpan], edit_calls: Iterable[int], edit_spans: Iterable[tuple[int, int]]
) -> set[int]:
    chosen = set()
    for i in edit_calls:
        if not 0 <= i < len(calls):
            raise ConfigError(
                f"edit call index {i} is out of range: the action has {len(calls)} tool call(s)"
            )
        chosen.add(i)
    for a, b in edit_spans:
        hits = [i for i, c in enumerate(calls) if c.start < b and a < c.end]
        if not hits:
            raise ConfigError(f"edit span [{a}, {b}) covers no tool call of the action")
        chosen.update(hits)
    return chosen


def edit_mask(
    token_ids: Sequence[int],
    tokenizer: Any,
    *,
    edit_calls: Iterable[int] = (),
    edit_spans: Iterable[tuple[int, int]] = (),
    setting: MaskSetting = "edit_tokens",
) -> list[int]:
    """The edit mask (0/1 per token) of one step's generated ``token_ids``.

    Edit calls are named by index among the action's tool calls (:func:`parse_tool_calls` on the decoded
    text) and/or by character spans of the decoded text (every call a span overlaps is an edit call). A
    token is marked when its characters overlap a marked call. ``setting="edit_tokens"`` marks the edit
    calls of any step; ``"edit_only_turns"`` marks all tool calls of a step whose every call is an edit,
    and nothing otherwise. Prose outside the calls is never marked.
    """
    if setting not in ("edit_only_turns", "edit_tokens"):
        raise ConfigError(f"mask setting must be 'edit_only_turns' or 'edit_tokens', got {setting!r}")
    text, spans = token_char_spans(token_ids, tokenizer)
    calls = parse_tool_calls(text)
    chosen = _resolve_edit_calls(calls, edit_calls, edit_spans)
    if setting == "edit_only_turns" and len(chosen) != len(calls):
        chosen = set()
    marked = [(calls[i].start, calls[i].end) for i in sorted(chosen)]
    mask = []
    for a, b in spans:
        if a == b:
            hit = any(s <= a < e for s, e in marked)
        else:
            hit = any(a < e and s < b for s, e in marked)
        mask.append(int(hit))
    return mask
