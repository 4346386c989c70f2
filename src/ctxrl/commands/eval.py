"""``ctxrl eval``: run policies on every task family and print (and save) one results table.

    ctxrl eval eval.episodes=50 eval.split=test rollout.workers=2 --out runs/eval --json runs/eval/metrics.json
    ctxrl eval engine.name=vllm --model runs/smol eval.modes=[file,tools] eval.episodes=3 eval.split=dev

With the ``scripted`` engine (the default for ``eval``; see ``configs/eval.yaml``) every scripted reference
policy in ``eval.policies`` runs in its own mode; with a model engine the model runs in every mode of
``eval.modes``. Either way every episode goes through the same rollout loop as training
(:func:`ctxrl.train.rollout.rollout`, group size 1) and the table is computed from its
:class:`~ctxrl.train.trajectory.EpisodeRecord` s. Every policy runs the same tasks: per family, the first
``eval.episodes`` seeds of ``eval.split``. Per policy, per family and overall the table gives: success rate ±
its standard error, prompt tokens per episode, compute per episode (FLOPs of the policy's model after
prefix-cache reuse, :mod:`ctxrl.rewards.cost`; the tiny model's for scripted policies), edits and rollbacks
per episode, and receipts by kind per episode.

Outputs: the table on stdout; with ``--out DIR``, ``eval.json`` (config, summary, every episode's summary),
``eval.md`` (the table with the command and date), ``config.yaml`` and ``trajectories.jsonl`` (every
episode's full record); with ``--json FILE``, flat ``{metric: number}`` with ``success/<policy>/<family>``,
``cost/<policy>/<family>`` and the other figures (``<family>`` includes ``overall``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ctxrl.commands.common import (
    build_engine,
    check_writable_file,
    prepare_out,
    resolve_model,
    run_config,
    save_config,
    write_text,
)
from ctxrl.commands.config import RunConfig
from ctxrl.env.receipts import ReceiptKind
from ctxrl.errors import ConfigError
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


def episode_row(ep: EpisodeRecord) -> dict[str, Any]:
    """What the table counts of one episode, from its record."""
    kinds = [k for s in ep.steps for k in s.receipt_kinds]
    return {
        "task_id": ep.task_id,
        "family": ep.family,
        "mode": ep.mode,
        "success": ep.success,
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


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per-episode means of a group of episodes, success with its binomial standard error."""
    n = len(rows)
    if n == 0:
        return {"episodes": 0.0}
    p = sum(r["success"] for r in rows) / n
    out = {
        "episodes": float(n),
        "success": p,
        "success_se": math.sqrt(p * (1 - p) / n),
        "tokens": sum(r["prompt_tokens"] for r in rows) / n,
        "cost": sum(r["cost_flops"] for r in rows) / n,
        "cost_tokens": sum(r["cost_tokens"] for r in rows) / n,
        "edits": sum(r["edits"] for r in rows) / n,
        "rollbacks": sum(r["rollbacks"] for r in rows) / n,
    }
    for kind in RECEIPT_KINDS:
        out[f"receipts/{kind}"] = sum(r["receipts"][kind] for r in rows) / n
    return out


def summary_table(
    results: dict[str, list[dict[str, Any]]], families: Sequence[str]
) -> dict[str, dict[str, dict[str, float]]]:
    """``{policy: {family or "overall": summarize(...)}}``."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    for policy, rows in results.items():
        by_family = {f: summarize([r for r in rows if r["family"] == f]) for f in families}
        by_family[OVERALL] = summarize(rows)
        table[policy] = by_family
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


def _names(values: Sequence[str], every: Sequence[str], kind: str) -> list[str]:
    """``values`` checked against ``every`` (``all`` or none given: every one)."""
    if not values or "all" in values:
        return list(every)
    unknown = [v for v in values if v not in every]
    if unknown:
        raise ConfigError(f"unknown {kind} {unknown[0]!r}; {kind}s: {', '.join(every)}, all")
    return list(dict.fromkeys(values))


def plan(config: RunConfig) -> dict[str, str]:
    """What runs, ``{row label: mode}``: each scripted policy in its mode, or the model in each mode."""
    from ctxrl.env.modes import MODES
    from ctxrl.env.policies import POLICY_MODES

    if config.engine.name == "scripted":
        policies = _names(config.eval.policies, list(POLICY_MODES), "policy")
        return {p: POLICY_MODES[p] for p in policies}
    return {m: m for m in _names(config.eval.modes, list(MODES), "mode")}


def run_eval(args: argparse.Namespace) -> int:
    """Entry point of ``ctxrl eval`` (see the module docstring)."""
    config = run_config(args)
    if args.model is not None:
        config = replace(config, model=str(args.model))
    command = " ".join(
        ["ctxrl eval", *(["--config", str(args.config)] if args.config else []), *args.overrides]
    )
    eval_command(config, out=args.out, json_path=args.json, overwrite=args.overwrite, command=command)
    return 0


def eval_command(
    config: RunConfig,
    *,
    out: Path | None = None,
    json_path: Path | None = None,
    overwrite: bool = False,
    command: str = "ctxrl eval",
) -> dict[str, dict[str, dict[str, float]]]:
    """Run the evaluation ``config`` describes; write the outputs; return the summary table."""
    from ctxrl.env.tasks.registry import FAMILIES, make_task
    from ctxrl.env.tasks.splits import split_seeds
    from ctxrl.train.rollout import rollout
    from ctxrl.train.trajectory import save_trajectories

    ev = config.eval
    runs = plan(config)
    families = list(ev.families) or list(FAMILIES)
    if json_path is not None:
        check_writable_file(json_path)
    if out is not None:
        out = prepare_out(out, overwrite=overwrite)
    seeds = split_seeds(ev.split, ev.episodes)
    tasks = [make_task(f, s, ev.difficulty, split=ev.split) for f in families for s in seeds]
    scripted = config.engine.name == "scripted"
    folder, tokenizer, price = resolve_model(config, out)

    started = dt.datetime.now(dt.UTC)
    records: list[EpisodeRecord] = []
    results: dict[str, list[dict[str, Any]]] = {}
    for label, mode in runs.items():
        run = replace(config, engine=replace(config.engine, policy=label)) if scripted else config
        engine = build_engine(run, folder, tokenizer)
        try:
            result = rollout(
                engine,
                tokenizer,
                tasks,
                replace(config.rollout, mode=mode, group_size=1),
                geometry=price,
                harness=config.harness,
                sampling=config.sampling,
            )
        finally:
            engine.close()
        records += result.episodes
        results[label] = [episode_row(ep) for ep in result.episodes]
        done = results[label]
        print(f"{label}: {sum(r['success'] for r in done)}/{len(done)} solved ({result.stats.wall_s:.0f} s)")
    table = summary_table(results, families)
    text = markdown(table)
    print(text)

    if out is not None:
        save_config(config, out)
        save_trajectories(records, out / "trajectories.jsonl")
        record: dict[str, Any] = {
            "command": command,
            "date": started.isoformat(timespec="seconds"),
            "config": {
                "runs": runs,
                "engine": config.engine.name,
                "families": families,
                "split": ev.split,
                "difficulty": ev.difficulty,
                "episodes_per_family": ev.episodes,
                "seeds": [seeds.start, seeds.stop - 1],
            },
            "summary": table,
            "episodes": results,
        }
        write_text(out / "eval.json", json.dumps(record, indent=1) + "\n")
        header = f"# ctxrl eval\n\n`{command}`\n\nRun {started:%Y-%m-%d %H:%M} UTC.\n\n"
        write_text(out / "eval.md", header + text + "\n")
        print(f"wrote {out / 'eval.json'} and {out / 'eval.md'}")
    if json_path is not None:
        write_text(json_path, json.dumps(flat_metrics(table), indent=2) + "\n")
        print(f"wrote {json_path}")
    return table
