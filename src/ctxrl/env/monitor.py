"""Self-injection monitor: flag instruction-shaped text the model writes into its own context.

A model-writable context is a persistence channel: a line like "Ignore the task's test requirement" in a
self-written note is read by every later turn. Role folding stops such a note from claiming ``system``
authority, but not from being followed. This monitor looks at the regions the model writes (its
assistant turns, the lines it adds to the context file, and the text of its tool arguments: a
``context_note``'s note, a command, a path) for imperative, instruction-shaped lines, and skips lines that
come from the user or the task (found in the pinned prefix).

It only records: flags go to the step result and its metrics; nothing is blocked or rewritten. The rules
are a small set of regular expressions, chosen for recall on the patterns reported in practice (overrides
of earlier instructions, second-person orders, standing rules, role claims), not for precision.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Protocol

Region = Literal["assistant", "file", "arguments"]


class Matcher(Protocol):
    """What a rule needs of a compiled pattern: a ``search`` whose result is truthy on a match."""

    def search(self, text: str) -> object: ...


class _SentenceStart:
    r"""Matches ``(^|[.!:;]\s+)\W*(always|never|do not|don't|must not|under no circumstances)\s+\w+`` in
    linear time.

    As one regular expression, every ``.`` of a line like ``". " * 20000`` starts an attempt whose ``\W*``
    runs to the end of the line and backtracks: quadratic (36 s for 40,000 characters). Here the keywords are
    found first (each a word start), and for each, only the run of non-word characters just before it is
    examined: it must reach the line start or hold a ``[.!:;]`` followed by whitespace. Those runs are
    disjoint (a keyword ends each), so the work is linear in the line.
    """

    _KEYWORD = re.compile(
        r"(?<!\w)(?:always|never|do not|don't|must not|under no circumstances)", re.IGNORECASE
    )
    _OBJECT = re.compile(r"\s+\w")
    _BREAK = re.compile(r"[.!:;]\s")
    _WORD = re.compile(r"\w")

    def search(self, text: str) -> bool:
        for m in self._KEYWORD.finditer(text):
            if not self._OBJECT.match(text, m.end()):
                continue
            start = m.start()
            while start > 0 and not self._WORD.match(text, start - 1):
                start -= 1
            if start == 0 or self._BREAK.search(text, start, m.start()):
                return True
        return False


_PATTERNS = tuple(
    (name, re.compile(pattern, re.IGNORECASE))
    for name, pattern in (
        (
            "override",
            r"\b(ignore|disregard|forget|override|bypass)\b.{0,40}\b(instructions?|rules?|task|prompt|system|"
            r"constraints?|requirements?|above|previous|earlier)\b",
        ),
        (
            "second_person_order",
            r"\byou\s+(must|should|shall|have to|need to|are required to|are not allowed to)\b",
        ),
        (
            "standing_rule",
            r"\b(from now on|going forward|in all future (turns|steps)|for the rest of (the|this))\b",
        ),
        ("role_claim", r"^\W*(system|developer|instructions?|rules?|policy)\s*:"),
        (
            "new_identity",
            r"\b(you are now|act as|pretend to be|your (new|real) (role|task|instructions?|goal))\b",
        ),
    )
)
RULES: tuple[tuple[str, Matcher], ...] = (*_PATTERNS, ("imperative_rule", _SentenceStart()))
"""The rules, in the order they are tried; a line gets the first rule that matches."""


@dataclass(frozen=True)
class Flag:
    """One flagged line: where the model wrote it, which rule matched, and the line itself (≤ 200 chars)."""

    region: Region
    rule: str
    text: str


def _normalized(text: str) -> str:
    return " ".join(text.lower().split())


def scan(text: str, region: Region, origin: str = "") -> list[Flag]:
    """Flags for the instruction-shaped lines of ``text`` that are not quoted from ``origin``.

    ``origin`` is the text the user and the task supplied (the pinned prefix); a line found in it is the
    user's instruction, not a self-injected one.
    """
    origin_norm = _normalized(origin)
    flags: list[Flag] = []
    for line in text.split("\n"):
        stripped = line.strip()
        if len(stripped) < 8:
            continue
        for rule, pattern in RULES:
            if pattern.search(stripped):
                if _normalized(stripped) not in origin_norm:
                    flags.append(Flag(region=region, rule=rule, text=stripped[:200]))
                break
    return flags


def argument_texts(value: object) -> list[str]:
    """Every string inside a tool call's arguments (nested lists and objects included), in order.

    An explicit stack, not recursion: the arguments are model output, and a call nested thousands deep must
    not raise ``RecursionError`` in the step (issue 24).

    >>> argument_texts({"a": ["x", {"b": "y"}], "c": 3, "d": "z"})
    ['x', 'y', 'z']
    """
    out: list[str] = []
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list | tuple):
            stack.extend(reversed(item))
    return out


def added_lines(before: str, after: str) -> str:
    """The lines of ``after`` that are not lines of ``before`` (what an edit wrote), in order."""
    old = set(before.split("\n"))
    return "\n".join(line for line in after.split("\n") if line not in old)
