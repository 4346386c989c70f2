"""Verifiers: pure functions that grade an answer, plus the sandboxed ``command`` check.

Each ``check_*`` returns a :class:`Verdict` and never raises on any answer text. They are what
:meth:`ctxrl.env.tasks.base.VerifierSpec.verify` dispatches to; user code may call them directly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Verdict:
    """The grade of one answer."""

    success: bool
    """Whether the task counts as solved (the training signal)."""
    score: float
    """Partial credit in [0, 1] for logs and analysis; 1.0 whenever ``success``."""
    detail: str
    """One human line: what matched, what was missing or wrong."""


def normalize_ws(text: str) -> str:
    """Collapse every run of whitespace to one space and strip the ends.

    >>> normalize_ws("  a\\n  b\\tc ")
    'a b c'
    """
    return " ".join(text.split())


def check_exact(answer: str, expected: str, *, case_sensitive: bool = True) -> Verdict:
    """Success iff the answer equals ``expected`` up to whitespace (and case, unless ``case_sensitive``).

    >>> check_exact(" 42\\n", "42").success
    True
    >>> check_exact("43", "42").success
    False
    """
    got, want = normalize_ws(answer), normalize_ws(expected)
    if not case_sensitive:
        got, want = got.casefold(), want.casefold()
    if got == want:
        return Verdict(True, 1.0, "exact match")
    return Verdict(False, 0.0, f"expected {_clip(want)!r}, got {_clip(got)!r}")


# A value "occurs" only as a whole token: not glued to letters/digits on either side, and not the head or
# tail of a longer number ("12" does not occur in "12.5", "1500" does not occur in "21500").
_BEFORE = r"(?<![A-Za-z0-9_])(?<![0-9][.,])"
_AFTER = r"(?![A-Za-z0-9_])(?![.,][0-9])"


def value_occurs(value: str, text: str, *, case_sensitive: bool = True) -> bool:
    """Whether ``value`` appears verbatim in ``text`` as a whole token (whitespace runs compare equal).

    >>> value_occurs("9f3a", "key = 9f3a.")
    True
    >>> value_occurs("9f3a", "key = 9f3ab")
    False
    >>> value_occurs("orion-7", "orion-71 is not it")
    False
    """
    value, text = normalize_ws(value), normalize_ws(text)
    if not value:
        return False
    pattern = re.escape(value)
    if value[0].isalnum() or value[0] == "_":
        pattern = _BEFORE + pattern
    if value[-1].isalnum() or value[-1] == "_":
        pattern = pattern + _AFTER
    return re.search(pattern, text, 0 if case_sensitive else re.IGNORECASE) is not None


def check_all_values(
    answer: str, expected: Sequence[str], *, forbidden: Sequence[str] = (), case_sensitive: bool = True
) -> Verdict:
    """Success iff every expected value occurs verbatim (see :func:`value_occurs`) and no forbidden one does.

    ``forbidden`` holds the near-duplicates of the task (a neighbour's key, a rotated-out value), so an answer
    that pastes everything it saw does not pass. Score: the fraction of expected values found, 0 if any
    forbidden value occurs.

    >>> check_all_values("a=17 b=x9", ["17", "x9"]).success
    True
    >>> check_all_values("a=18 b=x9", ["17", "x9"]).score
    0.5
    """
    missing = [v for v in expected if not value_occurs(v, answer, case_sensitive=case_sensitive)]
    present_bad = [v for v in forbidden if value_occurs(v, answer, case_sensitive=case_sensitive)]
    found = len(expected) - len(missing)
    score = found / len(expected) if expected else 0.0
    if present_bad:
        return Verdict(
            False, 0.0, f"{found}/{len(expected)} values found, but wrong values given: {present_bad}"
        )
    if missing:
        return Verdict(False, score, f"{found}/{len(expected)} values found; missing {missing}")
    return Verdict(True, 1.0, f"all {len(expected)} values found")


# -- board ------------------------------------------------------------------------------------------------

_CELL = re.compile(r"[A-Za-z0-9.#*_-]{1,3}")
_ROW_LABEL = re.compile(r"[rR]?\d{1,2}:?")
Grid = list[list[str]]


def parse_grid_text(text: str) -> Grid:
    """The grid written as one row per line, cells separated by whitespace (``|`` counts as a separator).

    Blank lines are skipped. Used for the expected state, which is always well formed.
    """
    return [line.replace("|", " ").split() for line in text.splitlines() if line.strip()]


def find_grid(answer: str, width: int, height: int) -> Grid | None:
    """The last ``height`` × ``width`` grid written in ``answer``, or None if there is none.

    A grid row is a line of ``width`` short cells (``|`` and extra spaces tolerated, an optional leading row
    label like ``r3`` or ``3:`` ignored). Rows must be consecutive (blank lines between them allowed); prose
    before or after is ignored. When several grids appear, the last one counts.
    """
    runs: list[Grid] = []
    current: Grid = []
    for line in answer.splitlines():
        cells = line.replace("|", " ").split()
        if not cells:
            continue
        if len(cells) == width + 1 and _ROW_LABEL.fullmatch(cells[0]):
            cells = cells[1:]
        if len(cells) == width and all(_CELL.fullmatch(c) for c in cells):
            current.append(cells)
            continue
        if current:
            runs.append(current)
        current = []
    if current:
        runs.append(current)
    for run in reversed(runs):
        if len(run) >= height:
            return run[-height:]
    return None


def check_board(answer: str, expected: str) -> Verdict:
    """Success iff the last grid in the answer equals the expected grid cell for cell.

    Score: the fraction of equal cells (0 when no grid of the right shape is found).

    >>> check_board("Final:\\n A . \\n . B\\n", "A .\\n. B").success
    True
    >>> check_board("A .\\n. .", "A .\\n. B").score
    0.75
    """
    want = parse_grid_text(expected)
    height, width = len(want), len(want[0]) if want else 0
    got = find_grid(answer, width, height)
    if got is None:
        return Verdict(False, 0.0, f"no {height}x{width} grid found in the answer")
    wrong = [(r + 1, c + 1) for r in range(height) for c in range(width) if got[r][c] != want[r][c]]
    if not wrong:
        return Verdict(True, 1.0, "grid matches")
    score = 1.0 - len(wrong) / (height * width)
    shown = ", ".join(f"r{r}c{c}" for r, c in wrong[:6])
    return Verdict(False, score, f"{len(wrong)} of {height * width} cells differ ({shown})")


# -- json fields -------------------------------------------------------------------------------------------


def find_json_object(answer: str) -> dict[str, Any] | None:
    """The first JSON object written in ``answer`` (the whole answer, or one embedded in prose)."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", answer):
        try:
            value, _ = decoder.raw_decode(answer, match.start())
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _same_value(got: Any, want: Any) -> bool:
    if isinstance(want, str):
        return isinstance(got, str) and normalize_ws(got) == normalize_ws(want)
    if isinstance(want, bool) or isinstance(got, bool):
        return got is want
    return bool(got == want)


def check_json_fields(answer: str, expected: Mapping[str, Any]) -> Verdict:
    """Success iff the answer holds a JSON object whose fields equal ``expected`` (extra fields allowed).

    Strings compare up to whitespace; numbers by value (``1 == 1.0``). Score: the fraction of equal fields.

    >>> check_json_fields('Result: {"a": 1, "b": " x "}', {"a": 1, "b": "x"}).success
    True
    """
    obj = find_json_object(answer)
    if obj is None:
        return Verdict(False, 0.0, "no JSON object found in the answer")
    wrong = [k for k, v in expected.items() if k not in obj or not _same_value(obj[k], v)]
    score = 1.0 - len(wrong) / len(expected) if expected else 0.0
    if wrong:
        return Verdict(False, score, f"fields missing or wrong: {wrong}")
    return Verdict(True, 1.0, f"all {len(expected)} fields match")


def _clip(text: str, n: int = 120) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
