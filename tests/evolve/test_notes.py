"""Contrastive notes from trajectory records, and the offline proposer acting on them."""

from __future__ import annotations

import json

from ctxrl.evolve.notes import build_notes, known_steps, render_notes
from ctxrl.evolve.proposal import read_proposal
from ctxrl.evolve.proposers import OfflineProposer, compact_percent, with_compact_percent
from ctxrl.evolve.rules import itemise
from ctxrl.evolve.skill import Skill, seed_skill
from ctxrl.train.trajectory import EpisodeRecord, StepCost, StepRecord

URGENT = "[context] URGENT: 120 tokens left before the limit of 2000; the next large output may overflow."
OVERFLOW = "[context] Overflow: the context passed the limit of 2000 tokens, so the newest 1 turn(s) were rolled back"


def step(ctx: int, calls: list[str], *, edit: bool = False, receipts: list[str] | None = None,
         nudges: list[str] | None = None) -> StepRecord:  # fmt: skip
    return StepRecord(
        prompt_ids=[1, 2], token_ids=[3], logprobs=[0.0], edit_mask=[int(edit)], finish_reason="stop",
        num_cached_tokens=0, prompt_source="extend", rebuild_reason=None, text="", tool_calls=calls,
        edit_calls=[0] if edit else [], receipts=receipts or [], receipt_kinds=["applied"] if receipts else [],
        readout="", nudges=nudges or [], context_tokens=ctx, edited=edit, free_turn=edit,
        cost=StepCost(2, 0, 1, None),
    )  # fmt: skip


def episode(task: str, index: int, success: bool, cost: float, steps: list[StepRecord], end: str = "submit",
            skill: str = "s") -> EpisodeRecord:  # fmt: skip
    return EpisodeRecord(
        task_id=task, family="retention", split="train", seed=7, difficulty="easy", mode="file", skill_id=skill,
        group=0, index=index, engine="scripted", success=success, score=float(success), reward=float(success),
        end_reason=end, answer="x", verdict="wrong value" if not success else "ok", cost_tokens=cost,
        cost_flops=None, steps=steps,
    )  # fmt: skip


def overflow_failure(task: str, index: int) -> EpisodeRecord:
    return episode(
        task, index, False, 900.0,
        [step(800, ["run"]), step(1880, ["read_file"], nudges=[URGENT]), step(1500, ["run"], nudges=[OVERFLOW])],
        end="overflow",
    )  # fmt: skip


def quick_success(task: str, index: int, cost: float = 500.0) -> EpisodeRecord:
    applied = "[context] applied: 1500 → 600 tokens"
    return episode(
        task, index, True, cost,
        [step(800, ["run"]), step(600, ["run"], edit=True, receipts=[applied]), step(700, ["submit"])],
    )  # fmt: skip


def test_success_vs_failure_note_with_step_digests() -> None:
    eps = [overflow_failure("t1", 0), quick_success("t1", 1, 700.0), quick_success("t1", 2, 500.0)]
    (note,) = build_notes(eps)
    assert (note.label, note.kind, note.task_id) == ("n1", "success_vs_failure", "t1")
    assert note.better.episode_index == 2  # the cheapest success
    assert note.worse.episode_index == 0 and note.worse.overflowed
    assert note.worse.urgent_steps == (1, 2)
    assert note.better.edit_steps == (1,)
    text = render_notes([note])
    assert "### note n1: task t1 (retention), a success and a failure" in text
    assert (
        "run B (episode 0): failure, score 0, 3 steps, cost 900 tokens, peak context 1880, ended by overflow"
        in text
    )
    assert "  s1 | ctx 1880 | read_file | nudge: urgent" in text
    assert "  s1 | ctx 600 | run | receipt: [context] applied: 1500 → 600 tokens" in text
    assert known_steps([note]) == {f"[n1.{r}.s{i}]" for r in "AB" for i in range(3)}


def test_cost_note_no_note_and_labels_in_task_order() -> None:
    eps = [
        quick_success("b", 0, 500.0), quick_success("b", 1, 1000.0),  # dearer by 2x: a cost note
        quick_success("c", 0, 500.0), quick_success("c", 1, 550.0),  # within 1.2x: no note
        overflow_failure("d", 0), overflow_failure("d", 1),  # no success: no note
        overflow_failure("a", 0), quick_success("a", 1),
    ]  # fmt: skip
    notes = build_notes(eps)
    assert [(n.label, n.task_id, n.kind) for n in notes] == [
        ("n1", "a", "success_vs_failure"),
        ("n2", "b", "cost"),
    ]
    # the order episodes arrive in does not matter
    assert build_notes(list(reversed(eps))) == notes
    # max_notes keeps success-vs-failure notes first
    assert [n.task_id for n in build_notes(eps, max_notes=1)] == ["a"]


def test_long_runs_show_head_and_tail_only() -> None:
    long = episode("t", 0, False, 1.0, [step(100 + i, ["run"]) for i in range(50)])
    (note,) = build_notes([long, quick_success("t", 1)])
    assert "... 10 steps not shown ..." in note.worse.render()
    assert "[n1.B.s12]" not in note.citations() and "[n1.B.s49]" in note.citations()


def test_compact_sentence_edit() -> None:
    assert compact_percent("x") is None
    body = with_compact_percent("## Ctx\nKeep values.", 45)
    assert body == "## Ctx\nKeep values.\nCompact when the context reaches 45% of the limit."
    assert compact_percent(body) == 45
    assert compact_percent(with_compact_percent(body, 30)) == 30


def test_offline_proposer_lowers_the_threshold_on_overflow_and_cites_steps() -> None:
    inc = seed_skill("file")
    notes = build_notes([overflow_failure("t1", 0), quick_success("t1", 1)])
    texts = OfflineProposer().propose(inc, notes, 3, round=1)
    assert len(texts) == 3
    skills = [read_proposal(t, parent=inc, round=1, known_steps=known_steps(notes)) for t in texts]
    assert all(isinstance(s, Skill) for s in skills)
    # an edit: the default skill's rules all stay, in order, and the threshold is one added rule
    for s in skills:
        assert isinstance(s, Skill)
        assert [r.text for r in itemise(s.body)][:-1] == [r.text for r in itemise(inc.body)]
    # the default skill states no threshold: taken as 60%; steps 10, 20, 5 lower it
    assert [compact_percent(s.body) for s in skills if isinstance(s, Skill)] == [50, 40, 55]
    first = skills[0]
    assert isinstance(first, Skill)
    assert first.targets == ("[n1.B.s1]", "[n1.B.s2]")
    assert first.predicts.startswith("threshold 60% -> 50%")
    # deterministic, and the rewrite style proposes the same bodies whole
    assert OfflineProposer().propose(inc, notes, 3, round=1) == texts
    rewrites = OfflineProposer("rewrite").propose(inc, notes, 3, round=1)
    assert [read_proposal(t, parent=inc, round=1) for t in rewrites] == skills


def test_offline_proposer_raises_the_threshold_for_over_editing_and_stays_in_bounds() -> None:
    inc = seed_skill("file")
    cheap = episode("t", 0, True, 300.0, [step(500, ["run"]), step(600, ["submit"])])
    dear = episode(
        "t", 1, True, 900.0,
        [step(500, ["run"], edit=True), step(400, ["run"], edit=True), step(600, ["submit"])],
    )  # fmt: skip
    notes = build_notes([cheap, dear])
    texts = OfflineProposer().propose(inc, notes, 2, round=1)
    assert [compact_percent(t) for t in texts] == [70, 65]
    assert '"targets": ["[n1.B.s0]", "[n1.B.s1]"]' in texts[0]
    # a skill that states a threshold gets that rule revised, not a second one added
    stated = Skill(with_compact_percent(inc.body, 60), "file", None, 0)
    (edit,) = json.loads(OfflineProposer().propose(stated, notes, 1, round=1)[0])["edits"]
    assert edit["op"] == "revise" and edit["rule"] == itemise(stated.body)[-1].id
    # nothing to act on: no candidates
    assert OfflineProposer().propose(inc, build_notes([quick_success("t", 0)]), 3, round=1) == []
    # at the lower bound the proposer offers only thresholds that move
    low = Skill(with_compact_percent(inc.body, 20), "file", None, 0)
    over = build_notes([overflow_failure("t", 0), quick_success("t", 1)])
    assert OfflineProposer().propose(low, over, 3, round=1) == []


def test_a_chat_proposer_leaves_out_the_last_notes_until_the_answer_fits() -> None:
    from ctxrl.evolve.proposers import ChatProposer

    inc = seed_skill("file")
    notes = build_notes(
        [e for t in ("t1", "t2", "t3") for e in (overflow_failure(t, 0), quick_success(t, 1))]
    )
    assert [n.label for n in notes] == ["n1", "n2", "n3"]
    asked: list[tuple[str, dict]] = []

    def complete(conversations: list, schema: dict | None) -> list[str]:
        asked.extend((c[1]["content"], schema) for c in conversations)
        return ["{}"] * len(conversations)

    def fits(messages: list) -> bool:  # room for two notes only
        return "note n3" not in messages[1]["content"]

    proposer = ChatProposer(complete, fits=fits)
    assert len(proposer.propose(inc, notes, 2, round=1)) == 2 and proposer.notes_shown == 2
    content, schema = asked[0]
    assert "note n2" in content and "note n3" not in content
    assert all(c.startswith(("[n1.", "[n2.")) for c in schema["properties"]["targets"]["items"]["enum"])
    # nothing fits: nothing is asked
    asked.clear()
    never = ChatProposer(complete, fits=lambda m: False)
    assert never.propose(inc, notes, 2, round=1) == [] and asked == [] and never.notes_shown == 0
