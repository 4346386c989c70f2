"""``ctxrl eval``: run scripted policies on task families and print (and save) one results table.

    ctxrl eval --policy all --split test --episodes 50 --workers 2 --out runs/eval --json runs/eval/metrics.json

Every policy runs the same tasks (the first ``--episodes`` seeds of the split, per family) in its own mode,
through the batched runner (:mod:`ctxrl.env.runner`). Per policy, per family and overall the table gives:
success rate ± its standard error, prompt tokens per episode, compute per episode (FLOPs of the tiny model
after prefix-cache reuse, :mod:`ctxrl.rewards.cost`), edits and rollbacks per episode, and receipts by kind
per episode.

Outputs: the table on stdout; with ``--out DIR``, ``eval.json`` (config, summary, every episode) and
``eval.md`` (the table with the command and date); with ``--json FILE``, flat ``{metric: number}`` with
``success/<policy>/<family>``, ``cost/<policy>/<family>`` and the other figures (``<family>`` includes
``overall``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctxrl.env.receipts import ReceiptKind
from ctxrl.env.runner import RECEIPT_KINDS, EpisodeResult, EpisodeSpec, PolicyActor, run_episodes
from ctxrl.errors import TaskError, UsageError

OVERALL = "overall"
_RECEIPT_LABELS = {
    ReceiptKind.APPLIED.value: "applied",
    ReceiptKind.GREW.value: "grew",
    ReceiptKind.REJECTED.value: "rejected",
    ReceiptKind.FAILED.value: "failed",
    ReceiptKind.MATCHED_NOTHING.value: "matched nothing",
}


def _names(values: Sequence[str] | None) -> list[str]:
    """``["a,b", "c"]`` -> ``["a", "b", "c"]`` (options take names space- or comma-separated)."""
    return [n.strip() for v in values or () for n in v.split(",") if n.strip()]


def resolve_policies(values: Sequence[str] | None) -> list[str]:
    """Policy names from ``--policy`` (``all`` = every scripted policy); UsageError for an unknown one."""
    from ctxrl.env.policies import POLICY_MODES

    names = _names(values) or ["all"]
    if "all" in names:
        return list(POLICY_MODES)
    unknown = [n for n in names if n not in POLICY_MODES]
    if unknown:
        raise UsageError(f"unknown policy {unknown[0]!r}; policies: {', '.join(POLICY_MODES)}, all")
    return list(dict.fromkeys(names))


def resolve_families(values: Sequence[str] | None) -> list[str]:
    """Family names from ``--families`` (default: all); TaskError for an unknown one."""
    from ctxrl.env.tasks.registry import FAMILIES

    names = _names(values) or list(FAMILIES)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise TaskError(f"unknown task family {unknown[0]!r}; families: {', '.join(FAMILIES)}")
    return list(dict.fromkeys(names))


def summarize(episodes: Sequence[EpisodeResult]) -> dict[str, float]:
    """Per-episode means of a group of episodes, success with its binomial standard error."""
    n = len(episodes)
    if n == 0:
        return {"episodes": 0.0}
    p = sum(e.success for e in episodes) / n
    out = {
        "episodes": float(n),
        "success": p,
        "success_se": math.sqrt(p * (1 - p) / n),
        "tokens": sum(e.prompt_tokens for e in episodes) / n,
        "cost": sum(e.cost_flops for e in episodes) / n,
        "cost_tokens": sum(e.cost_tokens for e in episodes) / n,
        "edits": sum(e.edits for e in episodes) / n,
        "rollbacks": sum(e.rollbacks for e in episodes) / n,
    }
    for kind in RECEIPT_KINDS:
        out[f"receipts/{kind}"] = sum(e.receipts.get(kind, 0) for e in episodes) / n
    return out


def summary_table(
    results: dict[str, list[EpisodeResult]], families: Sequence[str]
) -> dict[str, dict[str, dict[str, float]]]:
    """``{policy: {family or "overall": summarize(...)}}``."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    for policy, episodes in results.items():
        rows = {f: summarize([e for e in episodes if e.spec.family == f]) for f in families}
        rows[OVERALL] = summarize(episodes)
        table[policy] = rows
    return table


def flat_metrics(table: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """``{"success/<policy>/<family>": ..., "cost/<policy>/<family>": ..., ...}`` for ``--json``."""
    flat: dict[str, float] = {}
    for policy, rows in table.items():
        for family, row in rows.items():
            for metric, value in row.items():
                flat[f"{metric}/{policy}/{family}"] = float(value)
    return flat


def markdown(table: dict[str, dict[str, dict[str, float]]]) -> str:
    """The results as one Markdown table (a row per policy and family, then the policy's overall row)."""
    receipts = [_RECEIPT_LABELS[k] for k in RECEIPT_KINDS]
    head = [
        "policy",
        "family",
        "n",
        "success",
        "prompt tokens/ep",
        "compute GFLOP/ep",
        "edits/ep",
        "rollbacks/ep",
    ]
    head += [f"{label}/ep" for label in receipts]
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


def command_line(args: argparse.Namespace, policies: Sequence[str], families: Sequence[str]) -> str:
    """The ``ctxrl eval`` command that reproduces this run (outputs left out)."""
    from ctxrl.env.policies import POLICY_MODES
    from ctxrl.env.tasks.registry import FAMILIES

    parts = ["ctxrl eval", "--policy", "all" if list(policies) == list(POLICY_MODES) else " ".join(policies)]
    if list(families) != list(FAMILIES):
        parts += ["--families", " ".join(families)]
    parts += ["--split", args.split, "--episodes", str(args.episodes)]
    if args.difficulty != "default":
        parts += ["--difficulty", args.difficulty]
    parts += ["--workers", str(args.workers)]
    return " ".join(parts)


def run_eval(args: argparse.Namespace) -> int:
    """Entry point of ``ctxrl eval`` (see the module docstring)."""
    from ctxrl.env.policies import POLICY_MODES, make_policy
    from ctxrl.env.tasks.registry import DIFFICULTIES
    from ctxrl.env.tasks.splits import split_seeds

    policies = resolve_policies(args.policy)
    families = resolve_families(args.families)
    if args.difficulty not in DIFFICULTIES:
        raise TaskError(f"unknown difficulty {args.difficulty!r}; difficulties: {', '.join(DIFFICULTIES)}")
    if args.episodes < 1:
        raise UsageError(f"--episodes must be >= 1, not {args.episodes}")
    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, not {args.workers}")
    seeds = split_seeds(args.split, args.episodes)

    started = dt.datetime.now(dt.UTC)
    results: dict[str, list[EpisodeResult]] = {}
    for name in policies:
        specs = [
            EpisodeSpec(f, POLICY_MODES[name], s, args.split, args.difficulty)
            for f in families
            for s in seeds
        ]
        results[name] = run_episodes(
            specs, PolicyActor(make_policy(name)), workers=args.workers, progress=name
        )
    table = summary_table(results, families)
    text = markdown(table)
    print(text)

    command = command_line(args, policies, families)
    if args.out is not None:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        record: dict[str, Any] = {
            "command": command,
            "date": started.isoformat(timespec="seconds"),
            "config": {
                "policies": {p: POLICY_MODES[p] for p in policies},
                "families": families,
                "split": args.split,
                "difficulty": args.difficulty,
                "episodes_per_family": args.episodes,
                "seeds": [seeds.start, seeds.stop - 1],
                "cost": "FLOPs of the tiny model (ctxrl tiny-model), prefix-cache replay with 16-token blocks",
            },
            "summary": table,
            "episodes": {p: [e.to_dict() for e in eps] for p, eps in results.items()},
        }
        (out / "eval.json").write_text(json.dumps(record, indent=1) + "\n")
        header = f"# ctxrl eval\n\n`{command}`\n\nRun {started:%Y-%m-%d %H:%M} UTC.\n\n"
        (out / "eval.md").write_text(header + text + "\n")
        print(f"wrote {out / 'eval.json'} and {out / 'eval.md'}")
    if args.json is not None:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(flat_metrics(table), indent=2) + "\n")
        print(f"wrote {path}")
    return 0
