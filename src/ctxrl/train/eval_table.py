"""The eval table: what it counts of each episode's record, per-group means, Markdown and flat metrics.

    rows = {"file-manager": [episode_row(ep) for ep in episodes]}
    table = summary_table(rows, families)     # {policy: {family or "overall": {metric: mean}}}
    print(markdown(table))

``ctxrl eval`` (:mod:`ctxrl.commands.eval`) fills it from the rollout loop's
:class:`~ctxrl.train.trajectory.EpisodeRecord` s; the HTML report reads the same table back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ctxrl.env.receipts import ReceiptKind
from ctxrl.train.trajectory import EpisodeRecord

OVERALL = "overall"
RECEIPT_KINDS = tuple(kind.value for kind in ReceiptKind)
"""Receipt kinds, in the order tables show them."""
_RECEIPT_LABELS = {
    ReceiptKind.APPLIED.value: "applied",
    ReceiptKind.GREW.value: "grew",
    ReceiptKind.REJECTED.value: "rejected",
    ReceiptKind.FAILED.value: "failed",
    ReceiptKind.MATCHED_NOTHING.value: "matched nothing",
}


COLUMNS = (
    "policy",
    "family",
    "n",
    "success",
    "prompt tokens/ep",
    "compute GFLOP/ep",
    "edits/ep",
    "rollbacks/ep",
)
"""The eval table's columns before the receipt kinds (``<kind>/ep``)."""


def episode_row(ep: EpisodeRecord) -> dict[str, Any]:
    """What the table counts of one episode, from its record."""
    kinds = [k for s in ep.steps for k in s.receipt_kinds]
    return {
        "task_id": ep.task_id,
        "family": ep.family,
        "mode": ep.mode,
        "success": ep.success,
        "score": ep.score,
        "reason": ep.end_reason,
        "verdict": ep.verdict,
        "steps": sum(not s.free_turn for s in ep.steps),
        "lm_calls": len(ep.steps),
        "prompt_tokens": sum(len(s.prompt_ids) for s in ep.steps),
        "generated_tokens": sum(len(s.token_ids) for s in ep.steps),
        "peak_tokens": max((s.context_tokens for s in ep.steps), default=0),
        "cost_tokens": ep.cost_tokens,
        "cost_flops": ep.cost_flops or 0.0,
        "edits": sum(bool(s.receipts) for s in ep.steps),
        "rollbacks": sum(s.rolled_back_turns > 0 for s in ep.steps),
        "receipts": {kind: kinds.count(kind) for kind in RECEIPT_KINDS},
    }


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Per-episode means of a group of episodes, success with its binomial standard error, the graded score,
    and ``cost_per_success`` (the group's FLOPs over its successes; None — JSON null — when none succeeded:
    the figure is undefined, and 0 would read as free)."""
    n = len(rows)
    if n == 0:
        return {"episodes": 0.0}
    p = sum(r["success"] for r in rows) / n
    out: dict[str, float | None] = {
        "episodes": float(n),
        "success": p,
        "success_se": math.sqrt(p * (1 - p) / n),
        "tokens": sum(r["prompt_tokens"] for r in rows) / n,
        "cost": sum(r["cost_flops"] for r in rows) / n,
        "cost_tokens": sum(r["cost_tokens"] for r in rows) / n,
        "score": sum(r.get("score", float(r["success"])) for r in rows) / n,
        # compute per success: all the group's compute over its successes (undefined when nothing succeeded)
        "cost_per_success": sum(r["cost_flops"] for r in rows) / (p * n) if p else None,
        "edits": sum(r["edits"] for r in rows) / n,
        "rollbacks": sum(r["rollbacks"] for r in rows) / n,
    }
    for kind in RECEIPT_KINDS:
        out[f"receipts/{kind}"] = sum(r["receipts"][kind] for r in rows) / n
    return out


def summary_table(
    results: dict[str, list[dict[str, Any]]], families: Sequence[str]
) -> dict[str, dict[str, dict[str, float | None]]]:
    """``{policy: {family or "overall": summarize(...)}}``."""
    table: dict[str, dict[str, dict[str, float | None]]] = {}
    for policy, rows in results.items():
        by_family = {f: summarize([r for r in rows if r["family"] == f]) for f in families}
        by_family[OVERALL] = summarize(rows)
        table[policy] = by_family
    return table


def flat_metrics(table: dict[str, dict[str, dict[str, float | None]]]) -> dict[str, float | None]:
    """``{"success/<policy>/<family>": ..., "cost/<policy>/<family>": ..., ...}`` for ``--json`` (an undefined
    figure stays None: null in the JSON)."""
    flat: dict[str, float | None] = {}
    for policy, rows in table.items():
        for family, row in rows.items():
            for metric, value in row.items():
                flat[f"{metric}/{policy}/{family}"] = None if value is None else float(value)
    return flat


def markdown(table: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The results as one Markdown table (a row per policy and family, then the policy's overall row)."""
    receipts = [_RECEIPT_LABELS[k] for k in RECEIPT_KINDS]
    head = [*COLUMNS, *(f"{label}/ep" for label in receipts)]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|"]
    for policy, rows in table.items():
        for family, row in rows.items():
            if not row.get("episodes"):
                continue
            name = f"**{family}**" if family == OVERALL else family
            cells = [
                policy,
                name,
                f"{int(row['episodes'])}",
                f"{row['success']:.2f} ± {row['success_se']:.2f}",
                f"{row['tokens']:,.0f}",
                f"{row['cost'] / 1e9:,.1f}",
                f"{row['edits']:.1f}",
                f"{row['rollbacks']:.1f}",
                *(f"{row[f'receipts/{kind}']:.1f}" for kind in RECEIPT_KINDS),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
