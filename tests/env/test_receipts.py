"""The edit gate and receipts: every kind with its exact text, pure and through real file edits."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from ctxrl.env.context import ChatTemplateCounter, ToolCall, Turn
from ctxrl.env.harness import Action, Harness, StepResult
from ctxrl.env.receipts import ReceiptKind, gate_allows, judge_file_edit


def shell(command: str) -> Action:
    return Action("", (ToolCall.make("", "shell", {"command": command}),))


def _judge(**kw: object) -> tuple[ReceiptKind, str] | None:
    args: dict[str, object] = dict(
        gate="fit", file="context.md", limit=1000, before=500, after=None, targeted=True,
        file_changed=False, context_changed=False, exit_code=0,
    )  # fmt: skip
    args.update(kw)
    r = judge_file_edit(**args)  # type: ignore[arg-type]
    return None if r is None else (r.kind, r.text)


def test_gate_rules() -> None:
    assert gate_allows("fit", 500, 400, 1000) and gate_allows("shrink", 500, 400, 1000)
    assert gate_allows("fit", 500, 1000, 1000) and not gate_allows("fit", 500, 1001, 1000)
    assert not gate_allows("shrink", 500, 501, 1000) and gate_allows("shrink", 500, 500, 1000)


def test_each_receipt_kind_exact_text() -> None:
    changed = dict(file_changed=True, context_changed=True)
    assert _judge(**changed, after=300) == (ReceiptKind.APPLIED, "[context] applied: 500 → 300 tokens")
    assert _judge(**changed, after=600) == (
        ReceiptKind.GREW,
        "[context] applied but grew: 500 → 600 tokens (+100)",
    )
    assert _judge(**changed, after=1200) == (
        ReceiptKind.REJECTED,
        "[context] rejected by rule fit: 500 → 1200 tokens would pass the limit of 1000; "
        "context.md restored, context unchanged",
    )
    assert _judge(**changed, after=600, gate="shrink") == (
        ReceiptKind.REJECTED,
        "[context] rejected by rule shrink: the edit grew the context 500 → 600 tokens; "
        "context.md restored, context unchanged",
    )
    assert _judge(**changed, after=300, exit_code=2) == (
        ReceiptKind.FAILED,
        "[context] failed: the command exited 2; context.md restored, context unchanged (500 tokens)",
    )
    assert _judge(exit_code=1) == (
        ReceiptKind.FAILED,
        "[context] failed: the command exited 1; context.md restored, context unchanged (500 tokens)",
    )
    assert _judge(file_changed=True, file_problem="is missing", targeted=False) == (
        ReceiptKind.FAILED,
        "[context] failed: context.md is missing; context.md restored, context unchanged (500 tokens)",
    )
    assert _judge() == (
        ReceiptKind.MATCHED_NOTHING,
        "[context] matched nothing: context.md unchanged (500 tokens)",
    )
    assert _judge(file_changed=True, targeted=False) == (
        ReceiptKind.MATCHED_NOTHING,
        "[context] matched nothing: context.md unchanged (500 tokens)",
    )
    assert _judge(targeted=False) is None


# --- the same kinds through the harness, with real commands on the real file ---------------------------

DROP_FIRST_TOOL = (
    "python3 -c \"import re; p='context.md'; s=open(p).read(); "
    "b=re.split(r'(?m)^(?=\\[\\[CTX_TURN)', s); i=[k for k,x in enumerate(b) if 'role=tool' in x.split(chr(10))[0]][0]; "
    "b[i]=b[i].split(chr(10))[0]+chr(10)+'summary: 40 lines, key=42'+chr(10); open(p,'w').write(''.join(b))\""
)


WARM_TOKENS = 564
"""The prompt after :func:`_warm` (system, task, the ``seq 1 40`` call and its result, generation prompt), in
the tiny tokenizer's tokens. Written down, not read from the harness; :func:`_warm` checks it against the
chat template tokenised by transformers directly, independently of the harness's per-turn counting."""


def _warm(h: Harness) -> None:
    h.step(shell("seq 1 40"))
    counter = h.counter
    assert isinstance(counter, ChatTemplateCounter)
    tokenizer = counter.tokenizer
    text = tokenizer.apply_chat_template(
        h.context.to_messages(), tools=h.context.tools, add_generation_prompt=True, tokenize=False
    )
    assert h.context.tokens == len(tokenizer.encode(text, add_special_tokens=False)) == WARM_TOKENS


def _only_receipt(r: StepResult) -> str:
    assert len(r.receipts) == 1, r.receipts
    assert r.receipts[0].text in r.observations[0]
    return r.receipts[0].text


def test_applied_through_the_file(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(budget=4000, reserve=500, rollback_margin=300)
    _warm(h)
    r = h.step(shell(DROP_FIRST_TOOL))
    assert _only_receipt(r) == "[context] applied: 564 → 478 tokens"
    assert r.receipts[0].after == 478 and "summary: 40 lines, key=42" in h.context.turns[1].content


def test_grew_and_rejected_fit(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(budget=4000, reserve=500, rollback_margin=300)
    _warm(h)
    r = h.step(shell("printf '[[CTX_TURN 99 role=user]]\\nremember: key is 42\\n' >> context.md"))
    assert _only_receipt(r) == "[context] applied but grew: 564 → 577 tokens (+13)"
    assert h.context.turns[-3].content == "remember: key is 42"
    assert h.context.tokens == 694  # + this step's own call, its result (with the receipt) and the readout
    kept = h.context.turns
    r = h.step(shell("seq 1 3000 >> context.md"))
    assert _only_receipt(r) == (
        "[context] rejected by rule fit: 694 → 9143 tokens would pass the limit of 3500; "
        "context.md restored, context unchanged"
    )
    assert h.context.turns[: len(kept)] == kept  # not applied: only this step's turns were added


def test_a_file_of_more_turns_than_fit_is_rejected_without_counting_each(
    make_harness: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of one-line turns cannot fit whatever they hold: the receipt says so from a lower bound
    (each turn at least its template's tokens), without rendering every turn through the chat template."""
    h = make_harness(budget=4000, reserve=500, rollback_margin=300)
    _warm(h)
    kept = h.context.turns
    counter = h.context.counter
    rendered: list[int] = []
    real = counter.count_turn

    def counted(turn: Any) -> int:
        rendered.append(1)
        return real(turn)

    monkeypatch.setattr(counter, "count_turn", counted)
    many = 'awk \'BEGIN{for(i=0;i<3000;i++) printf "[[CTX_TURN %d role=%s]]\\nx%d\\n", 100+i, (i%2?"assistant":"user"), i}\' >> context.md'
    r = h.step(shell(many))
    text = _only_receipt(r)
    match = re.fullmatch(
        r"\[context\] rejected by rule fit: 564 → at least (\d+) tokens would pass the limit of 3500; "
        r"context.md restored, context unchanged",
        text,
    )
    assert match and int(match.group(1)) > 3500 and r.receipts[0].after == int(match.group(1)), text
    assert len(rendered) < 100  # this step's own turns and the three empty ones, not 3,000
    assert h.context.turns[: len(kept)] == kept
    # the bound is one: the same turns counted one by one take more
    turns = h.context.counted([Turn("user" if i % 2 == 0 else "assistant", f"x{i}") for i in range(3000)])
    assert h.context.fewest_tokens(3000) <= h.context.tokens_of(turns)


def test_rejected_shrink(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(budget=4000, reserve=500, rollback_margin=300, gate="shrink")
    _warm(h)
    r = h.step(shell("echo 'one more line' >> context.md"))
    assert _only_receipt(r) == (
        "[context] rejected by rule shrink: the edit grew the context 564 → 575 tokens; "
        "context.md restored, context unchanged"
    )
    assert "one more line" not in h.context.turns[1].content
    assert "one more line" not in (h.context.turns[0].content)


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("sed -i 's/1/X/' context.md; exit 3", "[context] failed: the command exited 3; context.md restored, context unchanged (564 tokens)"),
        ("rm context.md", "[context] failed: context.md is missing; context.md restored, context unchanged (564 tokens)"),
        ("rm context.md && ln -s /etc/passwd context.md", "[context] failed: context.md is a symbolic link; context.md restored, context unchanged (564 tokens)"),
        ("rm context.md && mkdir context.md", "[context] failed: context.md is not a regular file; context.md restored, context unchanged (564 tokens)"),
        ("cat context.md > /dev/null", "[context] matched nothing: context.md unchanged (564 tokens)"),
        ("sed -i 's/^nothing-matches-this$/x/' context.md", "[context] matched nothing: context.md unchanged (564 tokens)"),
        ("sed -i 's/CTX_TURN 1 /CTX_TURN 7 /' context.md", "[context] matched nothing: context.md unchanged (564 tokens)"),
    ],
)  # fmt: skip
def test_failed_and_matched_nothing(
    make_harness: Callable[..., Harness], command: str, expected: str
) -> None:
    h = make_harness(budget=4000, reserve=500, rollback_margin=300)
    _warm(h)
    kept = h.context.turns
    r = h.step(shell(command))
    assert _only_receipt(r) == expected
    assert h.context.turns[: len(kept)] == kept
    # The file is restored before the next command: the model sees the live context again.
    r = h.step(shell("head -n 1 context.md"))
    assert r.observations[0].startswith("[[CTX_TURN 1 role=assistant]]")


def test_commands_that_do_not_touch_the_file_get_no_receipt(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(budget=4000, reserve=500, rollback_margin=300)
    r = h.step(shell("echo hello > notes.txt; cat notes.txt"))
    assert r.receipts == () and "[context]" not in r.observations[0].split("\n")[0]
