"""``ctxrl quickstart``: every stage of the pipeline that exists, end to end, on the tiny model."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ctxrl.commands.common import ensure_tiny_model, prepare_out
from ctxrl.commands.config import load_run_config
from ctxrl.commands.eval import eval_command
from ctxrl.commands.rollout import rollout_command


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
    out: Path = prepare_out(args.out, overwrite=args.overwrite)
    engine = next((o.split("=", 1)[1] for o in args.overrides if o.startswith("engine.name=")), "vllm")
    print(f"[1/4] tiny model -> {out / 'model'}")
    model_dir = ensure_tiny_model(out / "model")
    print("[2/4] scripted reference policies on dev tasks: append-only vs the file-mode manager (ctxrl eval)")
    eval_overrides = ["engine.name=scripted", "eval.policies=[append,file-manager]",
                      "eval.families=[retention,board]", "eval.episodes=3", "eval.split=dev"]  # fmt: skip
    eval_command(
        load_run_config(None, eval_overrides),
        out=out / "eval",
        command=f"ctxrl eval {' '.join(eval_overrides)}",
    )
    print(f"[3/4] rollouts of the tiny model on the {engine} engine (ctxrl rollout)")
    rollout_dir = out / "rollout"
    rollout_overrides = [f"model={model_dir}", "tasks.families=[retention,board]", "tasks.count=2",
                         "rollout.group_size=4", "rollout.max_steps=6", "sampling.max_new_tokens=64"]  # fmt: skip
    rollout_command(load_run_config(None, [*rollout_overrides, *args.overrides]), rollout_dir)
    print("[4/4] advantages per group (success first; cost re-ranks successes, on edit tokens only)")
    for line in advantage_report(rollout_dir / "trajectories.jsonl"):
        print(line)
    print(f"done. run folder: {out}")
    return 0
