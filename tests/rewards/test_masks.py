"""Edit masks on the tiny model's real tokenizer output."""

from __future__ import annotations

from typing import Any

import pytest

from ctxrl.errors import ConfigError
from ctxrl.rewards.masks import edit_mask, parse_tool_calls, token_char_spans

DROP = '<tool_call>{"name": "context_drop", "arguments": {"handle": "h3"}}</tool_call>'
SHELL = '<tool_call>{"name": "shell", "arguments": {"command": "grep -n → café"}}</tool_call>'
ACTION = f"The old view is stale, drop it. {DROP} Then search → again: {SHELL} done."


def _ids(tokenizer: Any, text: str) -> list[int]:
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    return ids


def _marked_text(tokenizer: Any, ids: list[int], mask: list[int]) -> str:
    return str(tokenizer.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False))


def test_char_spans_cover_the_text_and_split_characters(tiny_tokenizer: Any) -> None:
    ids = _ids(tiny_tokenizer, ACTION)
    text, spans = token_char_spans(ids, tiny_tokenizer)
    assert text == ACTION and len(spans) == len(ids)
    assert spans[0][0] == 0 and spans[-1][1] == len(ACTION)
    assert all(a <= b for a, b in spans)
    assert all(spans[i][1] <= spans[i + 1][0] or spans[i] == spans[i + 1] for i in range(len(spans) - 1))
    # "→" is 3 bytes; the byte-level tokens that carry it share its one-character range.
    arrow = ACTION.index("→")
    sharing = [s for s in spans if s[0] <= arrow < s[1]]
    assert len(sharing) >= 2 and len(set(sharing)) == 1


def test_edit_tokens_marks_only_the_edit_call(tiny_tokenizer: Any) -> None:
    ids = _ids(tiny_tokenizer, ACTION)
    calls = parse_tool_calls(ACTION)
    assert [c.name for c in calls] == ["context_drop", "shell"]
    assert ACTION[calls[0].start : calls[0].end] == DROP

    mask = edit_mask(ids, tiny_tokenizer, edit_calls=[0], setting="edit_tokens")
    assert len(mask) == len(ids)
    assert _marked_text(tiny_tokenizer, ids, mask) == DROP  # the call, no prose, nothing of the shell call
    first = mask.index(1)
    assert mask[first : first + sum(mask)] == [1] * sum(mask)  # one contiguous run

    by_span = edit_mask(ids, tiny_tokenizer, edit_spans=[(ACTION.index("h3"), ACTION.index("h3") + 2)])
    assert by_span == mask


def test_edit_only_turns_needs_every_call_to_edit(tiny_tokenizer: Any) -> None:
    ids = _ids(tiny_tokenizer, ACTION)
    mixed = edit_mask(ids, tiny_tokenizer, edit_calls=[0], setting="edit_only_turns")
    assert mixed == [0] * len(ids)
    both = edit_mask(ids, tiny_tokenizer, edit_calls=[0, 1], setting="edit_only_turns")
    assert _marked_text(tiny_tokenizer, ids, both) == DROP + SHELL  # prose between and around unmarked

    edit_only = _ids(tiny_tokenizer, f"Trim it. {DROP}")
    only = edit_mask(edit_only, tiny_tokenizer, edit_calls=[0], setting="edit_only_turns")
    assert only == edit_mask(edit_only, tiny_tokenizer, edit_calls=[0], setting="edit_tokens")
    assert _marked_text(tiny_tokenizer, edit_only, only) == DROP

    no_calls = _ids(tiny_tokenizer, "Nothing to do.")
    for setting in ("edit_only_turns", "edit_tokens"):
        assert edit_mask(no_calls, tiny_tokenizer, setting=setting) == [0] * len(no_calls)


def test_mask_on_chat_template_output_and_truncated_call(tiny_tokenizer: Any) -> None:
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "Dropping. ",
            "tool_calls": [{"function": {"name": "context_drop", "arguments": {"handle": "h3"}}}],
        },
    ]
    rendered = tiny_tokenizer.apply_chat_template(messages, tokenize=False)
    head = tiny_tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    action_ids = _ids(tiny_tokenizer, rendered[len(head) :])  # what the model generated, <|im_end|> included
    mask = edit_mask(action_ids, tiny_tokenizer, edit_calls=[0])
    assert _marked_text(tiny_tokenizer, action_ids, mask) == DROP
    assert mask[-2:] == [0, 0] and mask[-3] == 1  # </tool_call> is marked; <|im_end|> and the newline are not

    cut = action_ids[: len(action_ids) - 6]  # generation stopped inside the call: it runs to the end
    truncated = edit_mask(cut, tiny_tokenizer, edit_calls=[0])
    assert truncated[-1] == 1 and truncated[0] == 0


def test_bad_edit_references_are_clear(tiny_tokenizer: Any) -> None:
    ids = _ids(tiny_tokenizer, ACTION)
    with pytest.raises(ConfigError, match="out of range"):
        edit_mask(ids, tiny_tokenizer, edit_calls=[2])
    with pytest.raises(ConfigError, match="covers no tool call"):
        edit_mask(ids, tiny_tokenizer, edit_spans=[(0, 5)])
    with pytest.raises(ConfigError, match="mask setting"):
        edit_mask(ids, tiny_tokenizer, setting="all")  # type: ignore[arg-type]
