"""A proposal as data: the JSON a proposer answers, the schema that constrains it, and how it becomes a candidate.

A proposal is one JSON object. In the default ``edits`` style it is a few operations on the parent skill's
itemised rules (:mod:`ctxrl.evolve.rules`), which keep every rule they do not name::

    {"targets": ["[n1.B.s7]"], "predicts": "fewer overflows; cost about the same",
     "edits": [{"op": "revise", "rule": "r3f2a", "text": "- Compact at 70% of the limit."},
               {"op": "add", "text": "- Keep task ids verbatim."}]}

In the ``rewrite`` style it carries the whole new body instead (``"body": "..."``). :func:`proposal_schema` is
that shape as a JSON schema with the parent's rule ids and the notes' citations as the only allowed values, so
an engine with structured outputs (vLLM in-process or served, an OpenAI-compatible ``response_format``) cannot
produce anything else; a proposer without them is asked for the same JSON in words.

:func:`read_proposal` turns a proposer's text into a :class:`~ctxrl.evolve.skill.Skill` or a
:class:`~ctxrl.evolve.skill.Dropped`: the JSON is parsed, the edits applied, and the resulting document goes
through :func:`~ctxrl.evolve.skill.validate_candidate` like any other. A skill document (frontmatter + body, as
hand-written or from proposers of earlier versions) is read as a whole rewrite. A drop whose reason starts with
:data:`MALFORMED` is a proposal that was not well-formed (not the JSON asked for, an edit of a rule the parent
lacks, a broken frontmatter); the rest were well-formed but failed a check of content (an identical body, an
over-long one, a citation no note shows). The loop logs the well-formed share per round.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Literal

from ctxrl.evolve.rules import Edit, EditError, apply_edits, itemise
from ctxrl.evolve.skill import CITATION, MALFORMED, MAX_BODY_CHARS, Dropped, Skill, validate_candidate

ProposalStyle = Literal["edits", "rewrite"]

MAX_EDITS = 1
"""Default of the most operations in one ``edits`` proposal (``evolve.max_edits``): with more than one, a
proposal can name a rule twice, which no JSON schema forbids (such a proposal is dropped as malformed)."""
MAX_RULE_CHARS = 400
"""Most characters of one added or revised rule."""
MAX_TARGETS = 6
MAX_PREDICTS_CHARS = 200

__all__ = ["MALFORMED", "ProposalStyle", "proposal_schema", "read_proposal", "well_formed"]


def proposal_schema(
    parent: Skill,
    citations: Iterable[str],
    *,
    style: ProposalStyle,
    max_chars: int = MAX_BODY_CHARS,
    max_edits: int = MAX_EDITS,
) -> dict[str, Any]:
    """The JSON schema of a proposal on ``parent``: ``targets`` drawn from ``citations`` (the notes' shown
    steps; any citation-shaped string when there are none), a bounded ``predicts``, and either 1 to
    ``max_edits`` ``edits`` naming only ``parent``'s rule ids or a ``body`` of at most ``max_chars``
    characters."""
    cites = sorted(set(citations))
    target: dict[str, Any] = (
        {"type": "string", "enum": cites} if cites else {"type": "string", "pattern": CITATION.pattern}
    )
    properties: dict[str, Any] = {
        "targets": {"type": "array", "items": target, "minItems": 1, "maxItems": MAX_TARGETS},
        "predicts": {"type": "string", "minLength": 1, "maxLength": MAX_PREDICTS_CHARS},
    }
    if style == "edits":
        ids = [rule.id for rule in itemise(parent.body)]
        text = {"type": "string", "minLength": 1, "maxLength": MAX_RULE_CHARS}
        ops: list[dict[str, Any]] = [_op({"op": {"const": "add"}, "text": text})]
        if ids:
            ops.append(_op({"op": {"const": "revise"}, "rule": {"enum": ids}, "text": text}))
            ops.append(_op({"op": {"const": "remove"}, "rule": {"enum": ids}}))
        properties["edits"] = {"type": "array", "items": {"anyOf": ops}, "minItems": 1, "maxItems": max_edits}
    else:
        properties["body"] = {"type": "string", "minLength": 1, "maxLength": max_chars}
    return {
        "type": "object",
        "properties": properties,
        "required": [*properties],
        "additionalProperties": False,
    }


def _op(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": [*properties],
        "additionalProperties": False,
    }


def read_proposal(
    text: str,
    *,
    parent: Skill,
    round: int,
    known_steps: frozenset[str] | None = None,
    max_chars: int = MAX_BODY_CHARS,
) -> Skill | Dropped:
    """The candidate ``text`` proposes on ``parent`` (see the module docstring), or why it is dropped. Nothing
    is repaired: a code fence around the JSON, a missing key or an unknown rule id drops the proposal."""
    stripped = text.strip()
    if stripped.startswith("---"):
        return validate_candidate(
            stripped, parent=parent, round=round, known_steps=known_steps, max_chars=max_chars
        )
    try:  # strict=False: raw control characters inside strings, which some grammar backends let through
        data = json.loads(stripped, strict=False)
    except ValueError as exc:
        return Dropped(text, f"{MALFORMED}not a JSON object or skill document ({str(exc)[:80]})")
    body_or_reason = _body(data, parent)
    if isinstance(body_or_reason, Dropped):
        return Dropped(text, body_or_reason.reason)
    targets = " ".join(dict.fromkeys(data["targets"]))
    predicts = " ".join(data["predicts"].split())
    document = (
        f"---\nmode: {parent.mode}\nparent: {parent.id}\nround: {round}\n"
        f"targets: {targets}\npredicts: {predicts}\n---\n{body_or_reason}\n"
    )
    out = validate_candidate(
        document, parent=parent, round=round, known_steps=known_steps, max_chars=max_chars
    )
    return Dropped(text, out.reason) if isinstance(out, Dropped) else out


def _body(data: Any, parent: Skill) -> str | Dropped:
    """The candidate body a parsed proposal describes, or a :data:`MALFORMED` drop naming what is wrong."""
    if not isinstance(data, dict):
        return Dropped("", f"{MALFORMED}a proposal is a JSON object, got {type(data).__name__}")
    targets, predicts = data.get("targets"), data.get("predicts")
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        return Dropped("", f"{MALFORMED}'targets' must be a non-empty list of citations like [n1.B.s7]")
    if not isinstance(predicts, str) or not predicts.strip():
        return Dropped("", f"{MALFORMED}'predicts' must be a non-empty string")
    if ("edits" in data) == ("body" in data):
        return Dropped("", f"{MALFORMED}a proposal has either 'edits' or 'body'")
    if "body" in data:
        body = data["body"]
        if not isinstance(body, str):
            return Dropped("", f"{MALFORMED}'body' must be a string")
        return body.strip()
    edits = data["edits"]
    if not isinstance(edits, list) or not all(isinstance(e, dict) for e in edits):
        return Dropped("", f"{MALFORMED}'edits' must be a list of objects")
    ops = []
    for n, edit in enumerate(edits, start=1):
        op, rule, new = edit.get("op"), edit.get("rule"), edit.get("text", "")
        if not isinstance(op, str) or not isinstance(new, str) or not (rule is None or isinstance(rule, str)):
            return Dropped("", f"{MALFORMED}edit {n} must have a string 'op', 'rule' and 'text'")
        ops.append(Edit(op, rule, new))  # type: ignore[arg-type]  # apply_edits checks the op
    try:
        return apply_edits(itemise(parent.body), ops)
    except EditError as exc:
        return Dropped("", f"{MALFORMED}{exc}")


def well_formed(reason: str) -> bool:
    """Whether a drop with ``reason`` was of a well-formed proposal (one that failed a content check)."""
    return not reason.startswith(MALFORMED)
