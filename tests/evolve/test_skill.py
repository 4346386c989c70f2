"""Skill files: round trip, strict parsing, and validation that drops (never repairs) a bad candidate."""

from __future__ import annotations

import pytest

from ctxrl.env.modes import default_skill
from ctxrl.evolve.skill import (
    MALFORMED,
    Dropped,
    Skill,
    SkillFormatError,
    parse_skill,
    seed_skill,
    validate_candidate,
)
from ctxrl.train.trajectory import skill_id

INC = seed_skill("file")
KNOWN = frozenset({"[n1.B.s3]", "[n1.A.s0]", "[n2.B.s7]"})


def doc(**over: str) -> str:
    keys = {
        "mode": "file",
        "parent": INC.id,
        "round": "1",
        "targets": "[n1.B.s3] [n2.B.s7]",
        "predicts": "fewer overflows",
    }
    keys.update(over)
    body = keys.pop("body", "## Managing your context\nCompact early.")
    head = "".join(f"{k}: {v}\n" for k, v in keys.items() if v != "<omit>")
    return f"---\n{head}---\n{body}\n"


def test_seed_skill_is_the_default_text_with_the_trajectory_id() -> None:
    assert INC.body == default_skill("file").strip()
    assert INC.id == skill_id(default_skill("file").strip())
    assert (INC.parent, INC.round, INC.targets) == (None, 0, ())


def test_round_trip() -> None:
    skill = Skill("## Ctx\nbody line", "tools", "0123456789abcdef", 3, ("[n1.B.s2]",), "success up")
    text = skill.to_markdown()
    assert text == (
        f"---\nid: {skill.id}\nmode: tools\nparent: 0123456789abcdef\nround: 3\n"
        "targets: [n1.B.s2]\npredicts: success up\n---\n## Ctx\nbody line\n"
    )
    assert parse_skill(text) == skill
    assert parse_skill(INC.to_markdown()) == INC


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no frontmatter", "no frontmatter"),
        ("---\nmode: file\n", "not closed"),
        ("---\nmode file\n---\nx", "not 'key: value'"),
        ("---\ncolour: red\n---\nx", "unknown frontmatter key 'colour'"),
        ("---\nmode: a\nmode: b\n---\nx", "given twice"),
        ("---\nmode: file\nparent: none\nround: 1\n---\n", "empty body"),
        ("---\nmode: file\nparent: none\nround: x\n---\nb", "non-negative integer"),
        ("---\nmode: file\nparent: none\nround: 0\nid: 0000000000000000\n---\nb", "is not the id"),
    ],
)
def test_parse_rejects_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(SkillFormatError, match=message):
        parse_skill(text)


def test_valid_candidate_gets_its_parent_and_round() -> None:
    got = validate_candidate(doc(), parent=INC, round=1, known_steps=KNOWN)
    assert isinstance(got, Skill)
    assert got.body == "## Managing your context\nCompact early."
    assert (got.parent, got.round, got.mode) == (INC.id, 1, "file")
    assert got.targets == ("[n1.B.s3]", "[n2.B.s7]")
    assert got.predicts == "fewer overflows"


@pytest.mark.parametrize(
    ("over", "reason", "malformed"),
    [
        ({"mode": "tools"}, "mode 'tools' does not match", False),
        ({"mode": "<omit>"}, "lacks 'mode'", True),
        ({"body": ""}, "empty body", True),
        ({"body": "x" * 4001}, "4001 characters exceeds the cap of 4000", False),
        ({"body": INC.body}, "identical to the parent", False),
        ({"parent": "ffffffffffffffff"}, "is not the skill it was asked to edit", False),
        ({"round": "2"}, "is not the current round 1", False),
        ({"targets": "<omit>"}, "no citation", True),
        ({"targets": "steps 3 and 7"}, "stray text", True),
        ({"targets": "[n1.C.s3]"}, "stray text", True),
        ({"targets": "[n9.B.s1]"}, "cites steps no note shows: [n9.B.s1]", False),
        ({"predicts": "<omit>"}, "no predicted effect", True),
        ({"colour": "red"}, "unknown frontmatter key", True),
    ],
)
def test_malformed_candidates_are_dropped_with_the_reason(
    over: dict[str, str], reason: str, malformed: bool
) -> None:
    text = doc(**over)
    got = validate_candidate(text, parent=INC, round=1, known_steps=KNOWN)
    assert isinstance(got, Dropped)
    assert reason in got.reason
    assert got.reason.startswith(MALFORMED) is malformed
    assert got.text == text  # kept as proposed, not repaired


def test_a_code_fenced_document_is_dropped_not_unwrapped() -> None:
    got = validate_candidate("```markdown\n" + doc() + "```", parent=INC, round=1)
    assert isinstance(got, Dropped) and "no frontmatter" in got.reason


def test_length_cap_is_a_parameter() -> None:
    assert isinstance(validate_candidate(doc(body="y" * 50), parent=INC, round=1, max_chars=49), Dropped)
    assert isinstance(validate_candidate(doc(body="y" * 49), parent=INC, round=1, max_chars=49), Skill)
