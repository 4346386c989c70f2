"""Implementations of the ``ctxrl`` subcommands. Imported only when a subcommand runs."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from ctxrl.errors import UsageError


def run_tiny_model(args: argparse.Namespace) -> int:
    from ctxrl.train.tiny_model import build_tiny_model

    t0 = time.perf_counter()
    out = build_tiny_model(args.out, seed=args.seed, force=args.force)
    size = sum(f.stat().st_size for f in out.iterdir()) / 1e6
    print(
        f"tiny model (seed {args.seed}) written to {out} ({size:.1f} MB) in {time.perf_counter() - t0:.1f} s"
    )
    return 0


def ensure_tiny_model(folder: Path, seed: int = 0) -> Path:
    """Build the tiny model into ``folder`` unless a model is already there."""
    from ctxrl.train.tiny_model import build_tiny_model

    if (folder / "config.json").is_file():
        return folder
    return build_tiny_model(folder, seed=seed, force=True)


def _run_subcommand(argv: list[str]) -> None:
    """Run another ``ctxrl`` subcommand in this process; a failure stops the quickstart."""
    from ctxrl.cli import build_parser, resolve

    sub_args = build_parser().parse_args(argv)
    status = int(resolve(sub_args.run)(sub_args) or 0)
    if status != 0:
        raise UsageError(f"'ctxrl {' '.join(argv[:1])}' exited with status {status}")


def advantage_report(trajectories: Path) -> list[str]:
    """One line per group of a trajectory file: successes, the task and efficiency advantages of its
    episodes, and how many generated tokens the edit mask marks."""
    from ctxrl.rewards.advantages import group_advantages
    from ctxrl.train.trajectory import load_trajectories

    groups: dict[int, list[Any]] = {}
    for ep in load_trajectories(trajectories):
        groups.setdefault(ep.group, []).append(ep)
    lines = []
    for g, eps in sorted(groups.items()):
        adv = group_advantages(
            [ep.reward for ep in eps],
            [ep.cost_flops if ep.cost_flops is not None else ep.cost_tokens for ep in eps],
            [ep.success for ep in eps],
            [[m for s in ep.steps for m in s.edit_mask] for ep in eps],
            clean=[ep.end_reason == "submit" for ep in eps],
        )
        edit_tokens = sum(sum(s.edit_mask) for ep in eps for s in ep.steps)
        lines.append(
            f"  group {g} ({eps[0].family}): {sum(ep.success for ep in eps)}/{len(eps)} solved, "
            f"task adv {[round(float(a), 2) for a in adv.task]}, "
            f"efficiency adv {[round(float(a), 2) for a in adv.efficiency]}, edit tokens {edit_tokens}"
        )
    return lines


def run_quickstart(args: argparse.Namespace) -> int:
    """The CPU quickstart: every stage of the pipeline that exists, end to end, on the tiny model."""
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    print(f"[1/4] tiny model -> {out / 'model'}")
    model_dir = ensure_tiny_model(out / "model", seed=args.seed)
    print("[2/4] scripted reference policies on dev tasks: append-only vs the file-mode manager (ctxrl eval)")
    _run_subcommand(
        ["eval", "--policy", "append", "file-manager", "--families", "retention", "board",
         "--episodes", "3", "--split", "dev", "--out", str(out / "eval")]
    )  # fmt: skip
    print(f"[3/4] rollouts of the tiny model on the {args.engine} engine (ctxrl rollout)")
    rollout_dir = out / "rollout"
    _run_subcommand(
        ["rollout", "--engine", args.engine, "--model", str(model_dir), "--out", str(rollout_dir),
         "--families", "retention,board", "--tasks", "2", "--group-size", "4", "--max-steps", "6",
         "--max-new-tokens", "64", "--seed", str(args.seed)]
    )  # fmt: skip
    print("[4/4] advantages per group (success first; cost re-ranks successes, on edit tokens only)")
    for line in advantage_report(rollout_dir / "trajectories.jsonl"):
        print(line)
    print(f"done. run folder: {out}")
    return 0
