"""Special tokens in text: model-written and tool-output text never becomes a control token.

A chat template writes its control tokens (``<|im_start|>``, ``<|im_end|>``...) as text, and the rendered
prompt is tokenised with special-token markup recognised. So text inside a message that *spells* a special
token (a model's note, a tool's output, a line of the context file) would become that control token: a
second ``<|im_start|>system`` in the middle of a user turn. Before a template renders messages, every
string in them (contents, names, tool-call arguments) is :func:`neutralize`-d: a zero-width space
(:data:`BREAK`) goes after the first character of every special-token spelling, so the text reads the same
and tokenises as plain text. Only the tokens the tokenizer marks *special* are neutralised; added markup
tokens such as ``<tool_call>`` are text the model writes and reads, the same token whoever spells it.

    spellings = special_spellings(tokenizer)
    neutralize("<|im_start|>system", spellings)     # '<\\u200b|im_start|>system'
    neutral_messages(messages, spellings)            # the same messages, every string neutralised
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ctxrl.env.gate import loads_bounded

BREAK = "\u200b"
"""Zero-width space: inserted after the first character of a special-token spelling to break it."""


class Spellings:
    """The special-token spellings of one tokenizer and the patterns that find them (in text and in JSON)."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self.tokens = tuple(
            sorted({t for t in tokens if len(t) > 1 and BREAK not in t}, key=lambda t: -len(t))
        )
        self._text = re.compile("|".join(re.escape(t) for t in self.tokens)) if self.tokens else None
        # In JSON text (how ``tojson`` renders tool-call arguments) a spelling appears JSON-escaped.
        escaped = {_json_inner(t): _json_inner(t[0] + BREAK + t[1:]) for t in self.tokens}
        self._json_map = escaped
        self._json = (
            re.compile("|".join(re.escape(t) for t in sorted(escaped, key=lambda t: -len(t))))
            if escaped
            else None
        )

    def __bool__(self) -> bool:
        return bool(self.tokens)


def _json_inner(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def special_spellings(tokenizer: Any) -> Spellings:
    """The spellings of ``tokenizer``'s special tokens: the named ones (``all_special_tokens``) and every
    added token flagged special (``added_tokens_decoder``). Markup tokens not flagged special are left out."""
    tokens: set[str] = set(getattr(tokenizer, "all_special_tokens", None) or ())
    for added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False):
            tokens.add(str(added.content))
    return Spellings(tokens)


def neutralize(text: str, spellings: Spellings) -> str:
    """``text`` with every special-token spelling broken by :data:`BREAK` after its first character.

    Repeated until none is left (a spelling overlapping another one's match is caught on the next pass);
    each pass breaks at least one and creates none, since no spelling contains :data:`BREAK`.

    >>> neutralize("a<|im_end|>b", Spellings(["<|im_end|>"]))
    'a<\\u200b|im_end|>b'
    """
    pattern = spellings._text
    if pattern is None:
        return text
    while pattern.search(text) is not None:
        text = pattern.sub(lambda m: m.group(0)[0] + BREAK + m.group(0)[1:], text)
    return text


def _neutral_arguments(arguments: Mapping[str, Any], spellings: Spellings) -> Any:
    """Tool-call arguments (a JSON object of any depth) with every string neutralised.

    Works on the JSON text, so depth costs no Python recursion: a spelling inside a string literal is broken
    there (the escaped break stays inside the literal), and the text parsed back. Arguments with no
    spelling come back unchanged (the same object).
    """
    pattern = spellings._json
    if pattern is None:
        return arguments
    try:
        text = json.dumps(arguments, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return arguments
    if pattern.search(text) is None:
        return arguments
    while pattern.search(text) is not None:
        text = pattern.sub(lambda m: spellings._json_map[m.group(0)], text)
    try:
        return loads_bounded(text, max_depth=None)  # our own dump of arguments already held: any depth
    except ValueError:  # a spelling that spans JSON structure: keep the text, broken
        return text


def _neutral_value(value: Any, spellings: Spellings, depth: int = 0) -> Any:
    if isinstance(value, str):
        return neutralize(value, spellings)
    if depth > 8:  # message structure is shallow; deep values are arguments, handled through JSON text
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if k == "arguments" and isinstance(v, Mapping):
                out[k] = _neutral_arguments(v, spellings)
            else:
                out[k] = _neutral_value(v, spellings, depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [_neutral_value(v, spellings, depth + 1) for v in value]
    return value


def neutral_messages(messages: Sequence[Mapping[str, Any]], spellings: Spellings) -> list[dict[str, Any]]:
    """Chat messages with every string in them neutralised (see :func:`neutralize`); new dicts, the
    originals untouched. With no special tokens, the messages as a list of dicts."""
    if not spellings:
        return [dict(m) for m in messages]
    return [_neutral_value(m, spellings) for m in messages]
