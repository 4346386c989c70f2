"""A skill as itemised rules with stable ids, and the small edits a proposal applies to them.

A skill body is a list of rules, one per non-blank line (a heading is a rule too)::

    rules = itemise(skill.body)        # [Rule("r1a2b", "## Managing your context"), Rule("r77c0", "- Batch ..."), ...]
    body = apply_edits(rules, [Edit("revise", "r77c0", "- Batch all edits."), Edit("add", None, "- Keep ids.")])

A rule's id is a hash of its text (:func:`rule_id`): it stays the same as long as the rule does, whatever is
added or removed around it, so a proposal can name the rule it edits and an edit names nothing else. Edits
touch only the rules they name (``revise``, ``remove``) or append (``add``): a candidate built from edits keeps
every other rule of its parent verbatim, in order, which a whole rewrite need not. Published evolution of agent
contexts measured what unchecked whole rewrites do over many rounds ("context collapse": a long context
rewritten down to a fraction of itself, accuracy below the unedited start); :func:`removed_share` measures how
much of the parent a candidate dropped, for any candidate, so the lineage can flag a rewrite that did that.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ctxrl.errors import CtxrlError

Op = Literal["add", "revise", "remove"]
OPS: tuple[Op, ...] = ("add", "revise", "remove")


class EditError(CtxrlError):
    """An edit cannot be applied: it names a rule the skill does not have, names one twice, or has no text."""


def rule_id(text: str) -> str:
    """The id of a rule: ``r`` and the first four hex digits of the SHA-256 of its stripped text."""
    return "r" + hashlib.sha256(text.strip().encode("utf-8")).hexdigest()[:4]


@dataclass(frozen=True)
class Rule:
    id: str
    text: str


def itemise(body: str) -> list[Rule]:
    """The rules of ``body``: its non-blank lines, stripped of trailing spaces, each with its id. Two lines with
    the same text get ids ``rxxxx`` and ``rxxxx.2`` (order decides), so every id names one rule."""
    rules: list[Rule] = []
    seen: dict[str, int] = {}
    for line in body.split("\n"):
        text = line.rstrip()
        if not text.strip():
            continue
        base = rule_id(text)
        seen[base] = seen.get(base, 0) + 1
        rules.append(Rule(base if seen[base] == 1 else f"{base}.{seen[base]}", text))
    return rules


def render(rules: Sequence[Rule]) -> str:
    """The body of ``rules``: one line each, in order."""
    return "\n".join(rule.text for rule in rules)


def numbered(rules: Sequence[Rule]) -> str:
    """The rules as a proposer reads them: ``[id] text`` per line."""
    return "\n".join(f"[{rule.id}] {rule.text}" for rule in rules)


@dataclass(frozen=True)
class Edit:
    """One operation on a skill's rules: ``add`` a rule at the end (``rule`` None), ``revise`` rule ``rule`` to
    ``text``, or ``remove`` rule ``rule`` (``text`` empty)."""

    op: Op
    rule: str | None
    text: str = ""


def apply_edits(rules: Sequence[Rule], edits: Sequence[Edit]) -> str:
    """The body after ``edits``: revised rules in place, removed ones gone, added ones appended in the order
    given, every rule no edit names unchanged and in its place. Raises :class:`EditError` naming the first edit
    that cannot apply (an unknown op or rule id, a rule named twice, an add or revise without text, no edit)."""
    if not edits:
        raise EditError("no edit")
    by_id = {rule.id: rule for rule in rules}
    changed: dict[str, Edit] = {}
    added: list[str] = []
    for n, edit in enumerate(edits, start=1):
        if edit.op not in OPS:
            raise EditError(f"edit {n}: unknown op {str(edit.op)[:20]!r}; ops: {', '.join(OPS)}")
        if edit.op != "remove" and not edit.text.strip():
            raise EditError(f"edit {n}: {edit.op} without text")
        if edit.op == "add":
            added.append(edit.text.strip())
            continue
        if edit.rule not in by_id:
            raise EditError(
                f"edit {n}: {edit.op} of rule {str(edit.rule)[:20]!r}, which the skill does not have"
            )
        if edit.rule in changed:
            raise EditError(f"edit {n}: rule {edit.rule} is edited twice")
        changed[edit.rule] = edit
    lines: list[str] = []
    for rule in rules:
        named = changed.get(rule.id)
        if named is None:
            lines.append(rule.text)
        elif named.op == "revise":
            lines.append(named.text.strip())
    return "\n".join([*lines, *added])


def removed_share(parent: str, body: str) -> float:
    """The share of ``parent``'s rule text (in characters) that ``body`` no longer has verbatim as a rule: 0.0
    when every parent rule survives, 1.0 when none does."""
    old = itemise(parent)
    total = sum(len(rule.text) for rule in old)
    if total == 0:
        return 0.0
    kept = {rule.text for rule in itemise(body)}
    return sum(len(rule.text) for rule in old if rule.text not in kept) / total
