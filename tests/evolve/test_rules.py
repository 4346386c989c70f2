"""Skills as itemised rules, edits that touch only what they name, and proposals read from JSON."""

from __future__ import annotations

import json

import pytest

from ctxrl.evolve.proposal import MALFORMED, proposal_schema, read_proposal, well_formed
from ctxrl.evolve.rules import Edit, EditError, apply_edits, itemise, removed_share, rule_id
from ctxrl.evolve.skill import Dropped, Skill, seed_skill

PARENT = seed_skill("file")
RULES = itemise(PARENT.body)
CITES = frozenset({"[n1.B.s2]", "[n2.B.s5]"})


def test_rules_are_the_lines_with_ids_that_follow_their_text() -> None:
    assert [r.text for r in RULES] == PARENT.body.split("\n")
    assert all(r.id == rule_id(r.text) for r in RULES)
    # an id does not depend on what is around the rule
    shifted = itemise("- A new first rule.\n" + PARENT.body)
    assert [r.id for r in shifted[1:]] == [r.id for r in RULES]
    # the same text twice: two distinct ids
    twice = itemise("- Same.\n- Same.")
    assert twice[0].id != twice[1].id and twice[1].id == twice[0].id + ".2"


def test_an_edit_cannot_drop_or_move_the_rules_it_does_not_name() -> None:
    target = RULES[2]
    body = apply_edits(
        RULES,
        [
            Edit("revise", target.id, "- Batch your edits: one edit per ten steps at most."),
            Edit("add", None, "Compact when the context reaches 70% of the limit."),
        ],
    )
    lines = body.split("\n")
    assert lines[:2] == [r.text for r in RULES[:2]] and lines[3:-1] == [r.text for r in RULES[3:]]
    assert lines[2] == "- Batch your edits: one edit per ten steps at most."
    assert lines[-1] == "Compact when the context reaches 70% of the limit."
    removed = apply_edits(RULES, [Edit("remove", target.id)])
    assert removed.split("\n") == [r.text for r in RULES if r.id != target.id]
    assert removed_share(PARENT.body, removed) == pytest.approx(
        len(target.text) / sum(len(r.text) for r in RULES)
    )


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        ([], "no edit"),
        ([Edit("revise", "r0000", "x")], "which the skill does not have"),
        ([Edit("remove", RULES[1].id), Edit("revise", RULES[1].id, "x")], "edited twice"),
        ([Edit("add", None, "  ")], "add without text"),
        ([Edit("swap", RULES[1].id, "x")], "unknown op"),  # type: ignore[arg-type]
    ],
)
def test_edits_that_cannot_apply_say_why(edits: list[Edit], message: str) -> None:
    with pytest.raises(EditError, match=message):
        apply_edits(RULES, edits)


def test_removed_share_measures_a_collapsing_rewrite() -> None:
    assert removed_share(PARENT.body, PARENT.body) == 0.0
    assert removed_share(PARENT.body, "## Managing your context\nBe brief.") > 0.9
    assert removed_share(PARENT.body, PARENT.body + "\n- One more rule.") == 0.0


def proposal(**over: object) -> str:
    data: dict[str, object] = {
        "targets": ["[n1.B.s2]", "[n1.B.s2]"],
        "predicts": "fewer overflows;\n cost about the same",
        "edits": [{"op": "remove", "rule": RULES[-1].id}],
    }
    data.update(over)
    return json.dumps({k: v for k, v in data.items() if v is not None})


def test_a_json_edit_proposal_becomes_a_candidate_of_its_parent() -> None:
    got = read_proposal(proposal(), parent=PARENT, round=3, known_steps=CITES)
    assert isinstance(got, Skill)
    assert got.body.split("\n") == [r.text for r in RULES[:-1]]
    assert (got.parent, got.round, got.mode) == (PARENT.id, 3, "file")
    assert got.targets == ("[n1.B.s2]",)  # a repeated citation counts once
    assert got.predicts == "fewer overflows; cost about the same"
    rewrite = read_proposal(proposal(edits=None, body="## Context\nBe brief."), parent=PARENT, round=3)
    assert isinstance(rewrite, Skill) and rewrite.body == "## Context\nBe brief."


@pytest.mark.parametrize(
    ("text", "reason", "malformed"),
    [
        ("```json\n" + proposal() + "\n```", "not a JSON object or skill document", True),
        ("[1, 2]", "a proposal is a JSON object", True),
        (proposal(targets=[]), "'targets' must be a non-empty list", True),
        (proposal(predicts=""), "'predicts' must be a non-empty string", True),
        (proposal(body="x"), "either 'edits' or 'body'", True),
        (proposal(edits=[{"op": "revise", "rule": "r9999", "text": "x"}]), "does not have", True),
        (proposal(edits=[{"op": 3}]), "string 'op'", True),
        (proposal(targets=["[n7.B.s1]"]), "cites steps no note shows", False),
        (proposal(edits=None, body=PARENT.body), "identical to the parent", False),
        (proposal(edits=[{"op": "add", "text": "y" * 5000}]), "exceeds the cap", False),
    ],
)
def test_a_bad_proposal_is_dropped_with_its_reason_and_kind(text: str, reason: str, malformed: bool) -> None:
    got = read_proposal(text, parent=PARENT, round=1, known_steps=CITES)
    assert isinstance(got, Dropped)
    assert reason in got.reason and got.text == text
    assert well_formed(got.reason) is not malformed
    assert got.reason.startswith(MALFORMED) is malformed


def test_the_schema_allows_only_the_parents_rules_and_the_notes_citations() -> None:
    schema = proposal_schema(PARENT, CITES, style="edits")
    props = schema["properties"]
    assert props["targets"]["items"]["enum"] == sorted(CITES)
    add, revise, remove = props["edits"]["items"]["anyOf"]
    assert props["edits"]["maxItems"] == 1  # one edit a proposal by default: no rule can be named twice
    assert proposal_schema(PARENT, CITES, style="edits", max_edits=3)["properties"]["edits"]["maxItems"] == 3
    assert revise["properties"]["rule"]["enum"] == [r.id for r in RULES]
    assert remove["required"] == ["op", "rule"] and add["required"] == ["op", "text"]
    assert all(s["additionalProperties"] is False for s in (schema, add, revise, remove))
    rewrite = proposal_schema(PARENT, (), style="rewrite", max_chars=99)
    assert rewrite["properties"]["body"]["maxLength"] == 99 and "edits" not in rewrite["properties"]
    assert "pattern" in rewrite["properties"]["targets"]["items"]  # no notes: any citation-shaped string
