"""The context model: exact token counts against the chat template, calibration, merging, the pinned prefix."""

from __future__ import annotations

from typing import Any

from ctxrl.env.context import ChatTemplateCounter, Context, ToolCall, Turn

TOOLS = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]


def _template_tokens(tokenizer: Any, ctx: Context) -> int:
    text = tokenizer.apply_chat_template(
        ctx.to_messages(), tools=ctx.tools, add_generation_prompt=True, tokenize=False
    )
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _region() -> list[Turn]:
    call = ToolCall.make("c1", "shell", {"command": "grep -n key data.txt"})
    return [
        Turn("assistant", "I will search.", tool_calls=(call,)),
        Turn("tool", "3: key = 42\n9: key_b = 7\n", tool_call_id="c1", name="shell"),
        Turn("user", "[context] 30% used."),
        Turn("assistant", "The key is 42."),
    ]


def test_counts_equal_what_the_engine_sees(tiny_tokenizer: Any) -> None:
    ctx = Context("system with skill", "the task", ChatTemplateCounter(tiny_tokenizer), TOOLS)
    assert ctx.tokens == _template_tokens(tiny_tokenizer, ctx)
    for turn in _region():
        ctx.append(turn)
        assert ctx.tokens == _template_tokens(tiny_tokenizer, ctx)
    assert all(t.tokens > 0 for t in ctx.turns)
    ctx.replace_turns(ctx.turns[:2])
    assert ctx.tokens == _template_tokens(tiny_tokenizer, ctx)


def test_messages_are_prefix_then_region(counter: ChatTemplateCounter) -> None:
    ctx = Context("sys", "task", counter)
    ctx.replace_turns(_region())
    messages = ctx.to_messages()
    assert messages[:2] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    assert messages[2]["tool_calls"][0] == {
        "id": "c1",
        "type": "function",
        "function": {"name": "shell", "arguments": {"command": "grep -n key data.txt"}},
    }
    assert messages[3] == {
        "role": "tool",
        "tool_call_id": "c1",
        "name": "shell",
        "content": "3: key = 42\n9: key_b = 7\n",
    }


def test_append_merges_same_role_and_skips_empty(counter: ChatTemplateCounter) -> None:
    ctx = Context("sys", "task", counter)
    ctx.append(Turn("user", "a"))
    ctx.append(Turn("user", "b"))
    ctx.append(Turn("assistant", "  "))
    assert ctx.turns == (Turn("user", "a\nb"),)
    assert ctx.turns[0].tokens == counter.count_turn(Turn("user", "a\nb"))


def test_calibration_is_clamped(counter: ChatTemplateCounter) -> None:
    ctx = Context("sys", "task", counter, calibration=(0.8, 1.25))
    raw = ctx.raw_tokens
    assert ctx.calibrate(round(raw * 1.1)) == round(raw * 1.1) / raw
    assert ctx.tokens == round(raw * ctx.calibration_ratio)
    assert ctx.calibrate(raw * 100) == 1.25  # a gateway anomaly cannot blow up the budget
    assert ctx.calibrate(1) == 0.8
    assert ctx.raw_tokens == raw


def test_the_counter_cache_is_safe_across_threads(tiny_tokenizer: Any) -> None:
    """The rollout loop steps many episodes in threads with one counter: evicting from its small cache
    concurrently must not lose a key under another thread (a KeyError killed a whole eval batch once)."""
    from concurrent.futures import ThreadPoolExecutor

    counter = ChatTemplateCounter(tiny_tokenizer, cache_size=8)
    turns = [Turn("user", f"note {i} " * (i % 7 + 1)) for i in range(400)]
    expected = [ChatTemplateCounter(tiny_tokenizer).count_turn(t) for t in turns]
    with ThreadPoolExecutor(8) as pool:
        for _ in range(5):
            assert list(pool.map(counter.count_turn, turns)) == expected
    assert len(counter._cache) <= 8
