"""Skills as files, and the validation that decides whether a proposed rewrite may enter the lineage.

A skill file is markdown with a frontmatter block::

    ---
    id: 37a1857f43c02771
    mode: file
    parent: 5c0a1f0e9d2b7a33
    round: 2
    targets: [n1.B.s7] [n3.B.s12]
    predicts: fewer overflow rollbacks on long tasks; success up, cost about the same
    ---
    ## Managing your context
    ...

- ``id`` is :func:`ctxrl.train.trajectory.skill_id` of the body, the same id an episode's trajectory record
  carries, so episodes and lineage rows join on it.
- ``parent`` is the id of the skill it was rewritten from, or ``none`` for a seed skill.
- ``round`` is the evolution round that produced it (0 for a seed skill).
- ``targets`` and ``predicts`` are what the proposer must state: the steps of the contrastive notes the rewrite
  targets (citations of the form ``[n<note>.<A|B>.s<step>]``, see :mod:`ctxrl.evolve.notes`) and the effect
  it predicts. A seed skill has neither.

The body (everything after the closing ``---``) is the text that goes into the system prompt.

**Validation drops, never repairs.** :func:`validate_candidate` checks a proposer's document and either
returns a :class:`Skill` or a :class:`Dropped` with the first reason it failed. It does not strip code fences,
fill in a missing key or trim an over-long body: a proposer that cannot follow the format gets its candidate
dropped, and the reason is recorded in the lineage.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ctxrl.env.modes import MODES
from ctxrl.errors import CtxrlError
from ctxrl.train.trajectory import skill_id

MAX_BODY_CHARS = 4000
"""Default length cap of a skill body, in characters (the default skills are 150-450 characters; the cap keeps a
rewrite from crowding the context it is meant to manage)."""

CITATION = re.compile(r"\[(n\d+)\.([AB])\.s(\d+)\]")
"""A citation of one step of one run of a contrastive note: ``[n2.B.s7]`` is step 7 of run B of note n2."""

_KEY = re.compile(r"^([a-z_]+):[ \t]*(.*)$")
_HEX16 = re.compile(r"^[0-9a-f]{16}$")
KEYS = ("id", "mode", "parent", "round", "targets", "predicts")
"""The frontmatter keys, in the order they are written."""
MALFORMED = "malformed: "
"""The prefix of a drop reason that says the proposal was not in the asked form (a broken frontmatter, no
citation, no prediction), as against well-formed proposals that failed a check of content."""


class SkillFormatError(CtxrlError):
    """A skill file is not a frontmatter block followed by a non-empty markdown body."""


@dataclass(frozen=True)
class Skill:
    """One skill: the body that goes into the system prompt and its place in the lineage."""

    body: str
    mode: str
    parent: str | None
    round: int
    targets: tuple[str, ...] = ()
    """Citations (``[n1.B.s7]``) of the note steps the rewrite targets; empty for a seed skill."""
    predicts: str = ""
    """The effect the proposer predicted; empty for a seed skill."""

    @property
    def id(self) -> str:
        """The id of the body (:func:`ctxrl.train.trajectory.skill_id`), as trajectory records carry it."""
        return skill_id(self.body)

    def to_markdown(self) -> str:
        """The skill file: frontmatter, then the body. :func:`parse_skill` reads it back to an equal Skill."""
        lines = ["---", f"id: {self.id}", f"mode: {self.mode}", f"parent: {self.parent or 'none'}"]
        lines.append(f"round: {self.round}")
        if self.targets:
            lines.append("targets: " + " ".join(self.targets))
        if self.predicts:
            lines.append(f"predicts: {self.predicts}")
        lines.append("---")
        return "\n".join(lines) + "\n" + self.body.strip() + "\n"


def seed_skill(mode: str) -> Skill:
    """The mode's default skill (the mode registry's, ``ctxrl.env.modes.MODES``) as round-0 skill with no
    parent."""
    if mode not in MODES:
        raise SkillFormatError(f"no default skill for mode {mode!r}; modes: {', '.join(MODES)}")
    return Skill(body=MODES[mode].skill.strip(), mode=mode, parent=None, round=0)


def split_frontmatter(text: str) -> tuple[dict[str, str], str]:
    """The frontmatter keys and the body of a skill document.

    The document must start with a line ``---``; the block ends at the next ``---`` line; every line inside is
    ``key: value`` with a known key, each key at most once. Raises :class:`SkillFormatError` naming the first
    problem.
    """
    lines = text.split("\n")
    if not lines or lines[0].strip() != "---":
        raise SkillFormatError("no frontmatter: the document must start with a line '---'")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise SkillFormatError("frontmatter not closed: no second '---' line") from None
    keys: dict[str, str] = {}
    for n, line in enumerate(lines[1:end], start=2):
        if not line.strip():
            continue
        match = _KEY.match(line.strip())
        if match is None:
            raise SkillFormatError(f"frontmatter line {n} is not 'key: value': {line.strip()[:60]!r}")
        key, value = match.group(1), match.group(2).strip()
        if key not in KEYS:
            raise SkillFormatError(f"unknown frontmatter key {key!r} (line {n}); keys: {', '.join(KEYS)}")
        if key in keys:
            raise SkillFormatError(f"frontmatter key {key!r} given twice")
        keys[key] = value
    return keys, "\n".join(lines[end + 1 :]).strip()


def _citations(value: str) -> tuple[str, ...]:
    """The citations of a ``targets`` value; anything else in it is a format error."""
    found = CITATION.findall(value)
    rest = CITATION.sub("", value).replace(",", " ").strip()
    if rest:
        raise SkillFormatError(f"targets must be citations like [n1.B.s7]; stray text {rest[:40]!r}")
    return tuple(f"[{n}.{run}.s{step}]" for n, run, step in found)


def parse_skill(text: str) -> Skill:
    """A skill file as written by :meth:`Skill.to_markdown`: ``mode``, ``parent`` and ``round`` are required,
    ``id`` (if given) must be the id of the body. Raises :class:`SkillFormatError`."""
    keys, body = split_frontmatter(text)
    for key in ("mode", "parent", "round"):
        if not keys.get(key):
            raise SkillFormatError(f"frontmatter lacks {key!r}")
    if not body:
        raise SkillFormatError("empty body")
    if not re.fullmatch(r"\d+", keys["round"]):
        raise SkillFormatError(f"round must be a non-negative integer, got {keys['round']!r}")
    parent = None if keys["parent"] == "none" else keys["parent"]
    if parent is not None and not _HEX16.match(parent):
        raise SkillFormatError(f"parent must be a 16-digit hex skill id or 'none', got {parent[:40]!r}")
    skill = Skill(
        body=body,
        mode=keys["mode"],
        parent=parent,
        round=int(keys["round"]),
        targets=_citations(keys.get("targets", "")),
        predicts=keys.get("predicts", ""),
    )
    if "id" in keys and keys["id"] != skill.id:
        raise SkillFormatError(f"id {keys['id']!r} is not the id of the body ({skill.id})")
    return skill


@dataclass(frozen=True)
class Dropped:
    """A candidate that failed validation: the raw text as proposed and the reason."""

    text: str
    reason: str


def validate_candidate(
    text: str,
    *,
    parent: Skill,
    round: int,
    known_steps: frozenset[str] | None = None,
    max_chars: int = MAX_BODY_CHARS,
) -> Skill | Dropped:
    """Check one proposed rewrite of ``parent``; return it as a :class:`Skill` of ``round`` or a
    :class:`Dropped` with the first reason it fails (prefixed :data:`MALFORMED` when the document is not in the
    asked form).

    Required of the document: a well-formed frontmatter block (see :func:`split_frontmatter`); ``mode`` equal
    to the parent's; ``parent``, when given, equal to the parent's id; ``id``, when given, equal to the
    id of the body; ``targets`` with at least one citation ``[n<k>.<A|B>.s<step>]`` and nothing else; when
    ``known_steps`` is given, every citation among them (a citation of a step that no note shows is invented);
    a non-empty ``predicts``; a non-empty body of at most ``max_chars`` characters that differs from the
    parent's. Nothing is repaired.
    """
    try:
        keys, body = split_frontmatter(text)
        targets = _citations(keys.get("targets", ""))
    except SkillFormatError as exc:
        return Dropped(text, f"{MALFORMED}{exc}")
    mode = keys.get("mode", "")
    if not mode:
        return Dropped(text, f"{MALFORMED}frontmatter lacks 'mode'")
    if not body:
        return Dropped(text, f"{MALFORMED}empty body")
    if not targets:
        return Dropped(text, f"{MALFORMED}no citation of the steps it targets (targets: [n1.B.s7] ...)")
    if not keys.get("predicts"):
        return Dropped(text, f"{MALFORMED}no predicted effect (predicts: ...)")
    if mode != parent.mode:
        return Dropped(text, f"mode {mode!r} does not match the parent's {parent.mode!r}")
    if len(body) > max_chars:
        return Dropped(text, f"body of {len(body)} characters exceeds the cap of {max_chars}")
    if body == parent.body.strip():
        return Dropped(text, "body identical to the parent's")
    if "parent" in keys and keys["parent"] != parent.id:
        return Dropped(
            text, f"parent {keys['parent'][:40]!r} is not the skill it was asked to edit ({parent.id})"
        )
    if "id" in keys and keys["id"] != skill_id(body):
        return Dropped(text, f"id {keys['id'][:40]!r} is not the id of the body")
    if "round" in keys and keys["round"] != str(round):
        return Dropped(text, f"round {keys['round'][:20]!r} is not the current round {round}")
    if known_steps is not None:
        unknown = [c for c in targets if c not in known_steps]
        if unknown:
            return Dropped(text, f"cites steps no note shows: {' '.join(unknown[:5])}")
    return Skill(
        body=body,
        mode=mode,
        parent=parent.id,
        round=round,
        targets=targets,
        predicts=keys["predicts"],
    )
