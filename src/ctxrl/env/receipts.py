"""The edit gate and the receipt line every context-targeting command gets.

Exactly one receipt per command that changed the context file or names it in its text ("targeted"), and
none for other commands. The kinds, in the order :func:`judge_file_edit` decides them:

- ``failed``: the file is missing, not readable or too large, or the command exited non-zero. Nothing is
  applied, because a failing command may have left a half-written file; the file is rewritten from the
  live context before the next command.
- ``matched nothing``: the command targeted the file but the context did not change (the bytes are the
  same, or the edit only touched formatting the parser ignores).
- ``rejected``: the gate refused the edit (``fit``: the result would pass the limit; ``shrink``: the
  result is larger than before). Not applied; the file is restored.
- ``applied but grew`` (only under ``fit``) and ``applied``: the parsed turns replace the live region.

Token figures are the whole prompt's calibrated size, the same number as the budget readout.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ctxrl.env.config import Gate

APPLIED = "[context] applied: {before} → {after} tokens"
APPLIED_GREW = "[context] applied but grew: {before} → {after} tokens (+{delta})"
REJECTED_FIT = (
    "[context] rejected by rule fit: {before} → {after} tokens would pass the limit of {limit}; "
    "{file} restored, context unchanged"
)
REJECTED_SHRINK = (
    "[context] rejected by rule shrink: the edit grew the context {before} → {after} tokens; "
    "{file} restored, context unchanged"
)
FAILED_EXIT = (
    "[context] failed: the command exited {exit_code}; {file} restored, context unchanged ({before} tokens)"
)
FAILED_FILE = "[context] failed: {file} {problem}; {file} restored, context unchanged ({before} tokens)"
MATCHED_NOTHING = "[context] matched nothing: {file} unchanged ({before} tokens)"


class ReceiptKind(StrEnum):
    APPLIED = "applied"
    GREW = "applied_but_grew"
    REJECTED = "rejected"
    FAILED = "failed"
    MATCHED_NOTHING = "matched_nothing"


@dataclass(frozen=True)
class Receipt:
    """One receipt: its kind, the exact line shown to the model, and the sizes before/after."""

    kind: ReceiptKind
    text: str
    before: int
    after: int

    @property
    def applied(self) -> bool:
        return self.kind in (ReceiptKind.APPLIED, ReceiptKind.GREW)


def gate_allows(gate: Gate, before: int, after: int, limit: int) -> bool:
    """The edit gate: shrinking is always allowed; growth only under ``fit`` and only up to ``limit``."""
    if after <= before:
        return True
    return gate == "fit" and after <= limit


def judge_file_edit(
    *,
    gate: Gate,
    file: str,
    limit: int,
    before: int,
    after: int | None,
    targeted: bool,
    file_changed: bool,
    context_changed: bool,
    exit_code: int,
    file_problem: str | None = None,
    at_least: bool = False,
) -> Receipt | None:
    """Decide the receipt of one command; ``None`` if it neither changed nor targeted the file.

    ``file_changed``: the file's bytes differ from what the harness wrote (or it is gone);
    ``context_changed``: the parsed turns differ from the live ones, and ``after`` is then their token size;
    ``file_problem``: why the file could not be read (e.g. "is missing"); ``at_least``: ``after`` is a lower
    bound (the file's turns were too many to fit, and were not counted one by one). The edit is to be applied
    iff the returned receipt's ``applied`` is true.
    """
    if not (file_changed or targeted or file_problem):
        return None
    if file_problem is not None:
        text = FAILED_FILE.format(file=file, problem=file_problem, before=before)
        return Receipt(ReceiptKind.FAILED, text, before, before)
    if exit_code != 0:
        text = FAILED_EXIT.format(exit_code=exit_code, file=file, before=before)
        return Receipt(ReceiptKind.FAILED, text, before, before)
    if not context_changed or after is None:
        return Receipt(
            ReceiptKind.MATCHED_NOTHING, MATCHED_NOTHING.format(file=file, before=before), before, before
        )
    if not gate_allows(gate, before, after, limit):
        template = REJECTED_FIT if gate == "fit" else REJECTED_SHRINK
        text = template.format(
            before=before, after=f"at least {after}" if at_least else after, limit=limit, file=file
        )
        return Receipt(ReceiptKind.REJECTED, text, before, after)
    if after > before:
        text = APPLIED_GREW.format(before=before, after=after, delta=after - before)
        return Receipt(ReceiptKind.GREW, text, before, after)
    return Receipt(ReceiptKind.APPLIED, APPLIED.format(before=before, after=after), before, after)
