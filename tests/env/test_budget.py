"""Budget: readout, nudge tiers firing once and re-arming, the urgent band, rollback, final turn and stop."""

from __future__ import annotations

from collections.abc import Callable

from ctxrl.env import budget as bud
from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import ToolCall, Turn
from ctxrl.env.harness import Action, Harness

CFG = HarnessConfig(budget=1000, reserve=100, rollback_margin=100)  # limit 900, tiers at 250/500/750
# Deletes every tool-result block from the context file (their calls keep stub results): a big shrink.
DROP_TOOL_OUTPUTS = (
    "python3 -c \"import re; p='context.md'; s=open(p).read(); "
    "b=re.split(r'(?m)^(?=\\[\\[CTX_TURN)', s); "
    "open(p,'w').write(''.join(x for x in b if 'role=tool' not in x.split(chr(10))[0]))\""
)


def shell(command: str) -> Action:
    return Action("", (ToolCall.make("", "shell", {"command": command}),))


def test_readout() -> None:
    assert bud.readout(450, 900) == "[context: 450/900 tokens (50% of the limit)]"


def test_tiers_fire_once_and_rearm_below() -> None:
    state = bud.BudgetState.initial(CFG)
    seq = [100, 260, 300, 520, 530, 200, 260, 800, 810, 240, 990]
    fired = [bud.tier_nudge(state, t, CFG) for t in seq]
    assert fired == [
        None,
        "[context] 28% of the limit is in use (260/900 tokens).",
        None,
        "[context] 57% of the limit is in use (520/900 tokens). Finish the unit of work in flight, then tidy context.md once.",
        None,
        None,  # dropped below 25 %: every tier re-arms
        "[context] 28% of the limit is in use (260/900 tokens).",
        "[context] 88% of the limit is in use (800/900 tokens). Compact settled spans of context.md "
        "(finished work, outputs already used) in one batched edit, without wiping what you still need.",
        None,
        None,
        "[context] 110% of the limit is in use (990/900 tokens). Compact settled spans of context.md "
        "(finished work, outputs already used) in one batched edit, without wiping what you still need.",
    ]  # fmt: skip


def test_readout_and_nudge_in_one_tool_result_state_one_figure(make_harness: Callable[..., Harness]) -> None:
    """Issue 24: the readout said 2221/5763 and the nudge under it 2221/6586 on the same result."""
    import re

    h = make_harness(budget=6000, reserve=600, rollback_margin=300)
    for _ in range(60):
        r = h.step(shell("seq 1 150"))
        nudges = _tier_nudges(r)
        if nudges:
            break
    assert nudges, "no tier nudge fired"
    readout = re.search(r"\[context: (\d+)/(\d+) tokens \((\d+)% of the limit\)\]", r.readout)
    nudge = re.search(r"\[context\] (\d+)% of the limit is in use \((\d+)/(\d+) tokens\)", nudges[0])
    assert readout and nudge, (r.readout, nudges[0])
    assert (nudge.group(2), nudge.group(3), nudge.group(1)) == readout.groups()


def test_lowest_tier_has_no_how_to() -> None:
    text = bud.tier_nudge(bud.BudgetState.initial(CFG), 260, CFG)
    assert text is not None
    assert not any(w in text.lower() for w in ("compact", "tidy", "edit", "delete", "context.md", "summar"))


def test_urgent_band_from_recent_outputs() -> None:
    # Band = max(10 % of 900, 2 × largest recent output); never below 50 % of the limit.
    assert bud.urgent_band(900, [10, 20], CFG) == 90
    assert bud.urgent_band(900, [10, 200, 30], CFG) == 400
    assert bud.urgent_nudge(449, [400], CFG) is None  # under 50 % of the limit
    assert bud.urgent_nudge(600, [200], CFG) == (
        "[context] URGENT: 300 tokens left before the limit of 900; the next large output may overflow. Compact context.md now."
    )
    assert bud.urgent_nudge(600, [100], CFG) is None  # room 300 >= band 200
    assert bud.urgent_nudge(820, [10], CFG) is not None  # room 80 < 10 % of the limit


def test_rollback_cut_never_orphans_a_result() -> None:
    call = ToolCall.make("c1", "shell", {"command": "cat big"})
    turns = [
        Turn("user", "u", tokens=10),
        Turn("assistant", "a", tool_calls=(call,), tokens=10),
        Turn("tool", "big", tool_call_id="c1", name="shell", tokens=500),
    ]

    def size(ts: object) -> int:
        return 100 + sum(t.tokens for t in ts)  # type: ignore[attr-defined]

    assert bud.rollback_cut(turns, size, 200) == 1  # not 2: that would keep the call without its result
    assert bud.rollback_cut(turns, size, 1000) == 3
    assert bud.rollback_cut(turns, size, 50) == 0


def test_rollback_margin_deepens_only_after_ignored_rollbacks() -> None:
    cfg = HarnessConfig(budget=10000, reserve=100, rollback_margin=500, rollback_deepen_after=2)
    assert [bud.rollback_margin(cfg, k) for k in range(6)] == [500, 500, 1000, 1000, 2000, 2000]


# --- scripted episodes ----------------------------------------------------------------------------------


def _tier_nudges(result: object) -> list[str]:
    return [n for n in result.nudges if "% of the limit is in use" in n]  # type: ignore[attr-defined]


def test_tiers_on_a_scripted_episode(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(
        budget=6000, reserve=600, rollback_margin=300, urgent_limit_fraction=0.0, urgent_output_factor=0.0
    )
    seen: list[str] = []
    while not any("Compact settled spans" in n for n in seen):
        seen += _tier_nudges(h.step(shell("seq 1 150")))
    percents = [int(n.split("] ")[1].split("%")[0]) for n in seen]
    assert 25 <= percents[0] < 50 <= percents[1] < 75 <= percents[2]
    kinds = [
        "info" if "Finish" not in n and "Compact" not in n else "mid" if "Finish" in n else "high"
        for n in seen
    ]
    assert kinds == ["info", "mid", "high"]  # each tier exactly once
    r = h.step(shell(DROP_TOOL_OUTPUTS))  # shrink well below 25 %: all tiers re-arm
    assert r.receipts[0].applied and r.tokens < 0.25 * 6000
    again: list[str] = []
    while not again:
        again = _tier_nudges(h.step(shell("seq 1 150")))
    assert "Finish" not in again[0] and "Compact" not in again[0]  # the lowest tier fired again


def test_urgent_nudge_every_turn_in_the_band(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(budget=3000, reserve=300, rollback_margin=300)
    urgent: list[bool] = []
    while True:
        r = h.step(shell("seq 1 10"))
        assert len(urgent) < 80
        if r.rolled_back_turns:
            break
        urgent.append(any(n.startswith("[context] URGENT") for n in r.nudges))
        assert not urgent[-1] or r.tokens >= 0.5 * 2700
    first = urgent.index(True)
    assert first > 0 and all(urgent[first:]) and len(urgent[first:]) >= 2


def test_overflow_rolls_back_frees_margin_and_names_command(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(budget=3000, reserve=300, rollback_margin=400)
    h.step(shell("seq 1 50"))
    kept = h.context.turns
    r = h.step(shell("seq 1 5000"))
    assert r.rolled_back_turns == 2 and r.overflow_commands == ("seq 1 5000",) and r.edited
    assert h.context.turns[: len(kept)] == kept
    note = h.context.turns[-1]
    assert note.role == "user" and "Output that did not fit came from: `seq 1 5000`." in note.content
    assert h.context.tokens - note.tokens <= 2700 - 400  # the margin is free (before the note itself)
    assert not r.done


def test_ignored_rollbacks_lead_to_final_turn_then_stop(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(
        budget=3000, reserve=300, rollback_margin=300, rollback_retries=2, rollback_deepen_after=1
    )
    h.step(shell("seq 1 50"))
    results = [h.step(shell("seq 1 5000")) for _ in range(3)]
    assert [r.rolled_back_turns > 0 for r in results] == [True, True, True]
    assert not any("Final turn" in o for r in results[:2] for o in r.observations)
    assert (
        "[context] Final turn: the context overflowed 3 times without being condensed."
        in results[2].observations[-1]
    )
    assert not results[2].done
    last = h.step(shell("echo bye"))
    assert last.truncated and last.reason == "overflow"


def test_shrinking_edit_resets_ignored_rollbacks(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(budget=3000, reserve=300, rollback_margin=300, rollback_retries=1)
    h.step(shell("seq 1 50"))
    h.step(shell("seq 1 5000"))
    assert h.step(shell(DROP_TOOL_OUTPUTS)).receipts[0].applied
    r = h.step(shell("seq 1 5000"))
    assert r.rolled_back_turns and not any("Final turn" in o for o in r.observations)
    r = h.step(shell("seq 1 5000"))  # second rollback in a row, without a shrinking edit: final turn
    assert any("Final turn" in o for o in r.observations)
    assert h.step(Action("", (ToolCall.make("", "submit", {"answer": "42"}),))).reason == "submit"
