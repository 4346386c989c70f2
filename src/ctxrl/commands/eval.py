"""``ctxrl eval``: run policies on every task family and print (and save) one results table.

    ctxrl eval eval.episodes=50 eval.split=test rollout.workers=2 --out runs/eval --json runs/eval/metrics.json
    ctxrl eval engine.name=vllm --model runs/smol eval.modes=[file,tools] eval.episodes=3 eval.split=dev

With the ``scripted`` engine (the default for ``eval``; see ``configs/eval.yaml``) every scripted reference
policy in ``eval.policies`` runs in its own mode; with a model engine the model runs in every mode of
``eval.modes``. Either way every episode goes through the same rollout loop as training
(:func:`ctxrl.train.rollout.rollout`, group size 1) and the table is computed from its
:class:`~ctxrl.train.trajectory.EpisodeRecord` s. Every policy runs the same tasks: per family, the first
``eval.episodes`` seeds of ``eval.split`` (after its first ``eval.offset``). Per policy, per family and overall the table gives: success rate ±
its standard error, prompt tokens per episode, compute per episode (FLOPs of the policy's model after
prefix-cache reuse, :mod:`ctxrl.rewards.cost`; the tiny model's for scripted policies), edits and rollbacks
per episode, and receipts by kind per episode.

Outputs: the table on stdout; with ``--out DIR``, ``eval.json`` (config, the model folder and the training run
and step it was exported from, summary, every episode's summary), ``eval.md`` (the table with the command and
date), ``config.yaml`` and ``trajectories.jsonl`` (every episode's full record); with ``--json FILE``, flat
``{metric: number}`` with ``success/<policy>/<family>``, ``cost/<policy>/<family>`` and the other figures
(``<family>`` includes ``overall``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
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
    summary_engine,
    write_text,
)
from ctxrl.commands.config import RunConfig
from ctxrl.errors import ConfigError
from ctxrl.train.engines import engine_spec
from ctxrl.train.eval_table import episode_row, flat_metrics, markdown, summary_table
from ctxrl.train.trajectory import EpisodeRecord


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

    if engine_spec(config.engine.name).needs_policy:
        policies = _names(config.eval.policies, list(POLICY_MODES), "policy")
        return {p: POLICY_MODES[p] for p in policies}
    return {m: m for m in _names(config.eval.modes, list(MODES), "mode")}


def run_eval(args: argparse.Namespace) -> int:
    """Entry point of ``ctxrl eval`` (see the module docstring)."""
    config = run_config(args)
    flags = [f"--{flag} {getattr(args, flag)}" for flag in ("model", "engine") if getattr(args, flag, None)]
    command = " ".join(
        ["ctxrl eval", *(["--config", str(args.config)] if args.config else []), *flags, *args.overrides]
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
) -> dict[str, dict[str, dict[str, float | None]]]:
    """Run the evaluation ``config`` describes; write the outputs; return the summary table."""
    from ctxrl.env.tasks.registry import FAMILIES, make_task
    from ctxrl.env.tasks.splits import split_seeds
    from ctxrl.publish.export import exported_from
    from ctxrl.train.rollout import rollout
    from ctxrl.train.trajectory import save_trajectories

    ev = config.eval
    runs = plan(config)
    families = list(ev.families) or list(FAMILIES)
    if json_path is not None:
        check_writable_file(json_path)
    if out is not None:
        out = prepare_out(out, overwrite=overwrite, inputs=[config.model])
    seeds = split_seeds(ev.split, ev.episodes, ev.offset)
    tasks = [make_task(f, s, ev.difficulty, split=ev.split) for f in families for s in seeds]
    scripted = engine_spec(config.engine.name).needs_policy
    folder, tokenizer, price = resolve_model(config, out)
    generate, summariser = summary_engine(config, folder, tokenizer)

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
                generate=generate,
            )
        finally:
            engine.close()
        records += result.episodes
        results[label] = [episode_row(ep) for ep in result.episodes]
        done = results[label]
        print(f"{label}: {sum(r['success'] for r in done)}/{len(done)} solved ({result.stats.wall_s:.0f} s)")
    if summariser is not None:
        summariser.close()
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
            # the policy's origin, so that a comparison can name the training run behind each row
            "model": {
                "path": None if folder is None else str(folder),
                "exported_from": exported_from(folder),
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
