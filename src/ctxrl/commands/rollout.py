"""``ctxrl rollout``: run a policy on built-in tasks and write its trajectories.

    ctxrl rollout --out runs/rollout                          # the tiny model, built into runs/rollout/model
    ctxrl rollout --config configs/rollout.yaml --model path/to/model engine.name=hf tasks.count=8
    ctxrl rollout engine.name=vllm-server engine.server_url=http://127.0.0.1:8000 --model path/to/model
    ctxrl rollout engine.name=scripted engine.policy=file-manager --out runs/demo   # demonstrations

Writes ``<out>/trajectories.jsonl`` (one episode per line, :mod:`ctxrl.train.trajectory`),
``<out>/summary.json`` and ``<out>/config.yaml`` (the resolved run config), shows a progress bar over
episodes, and prints a one-screen summary. Bad input (a folder that is not a causal LM, an unreachable
server, an unknown family, a non-empty ``--out``) is a one-line error, exit 1, before any episode runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
from pathlib import Path
from typing import Any

from ctxrl.commands.common import (
    build_engine,
    prepare_out,
    resolve_model,
    run_config,
    save_config,
    summary_engine,
    write_text,
)
from ctxrl.commands.config import RunConfig
from ctxrl.train.rollout import RolloutResult
from ctxrl.train.trajectory import EpisodeRecord


def summarize(result: RolloutResult) -> dict[str, Any]:
    """The summary of a rollout: episodes, success, steps, tokens, cache share, speed, end reasons."""
    eps = result.episodes
    st = result.stats
    by_family: dict[str, list[EpisodeRecord]] = collections.defaultdict(list)
    for ep in eps:
        by_family[ep.family].append(ep)
    return {
        "episodes": len(eps),
        "success_rate": statistics.fmean(ep.success for ep in eps) if eps else 0.0,
        "mean_steps": statistics.fmean(len(ep.steps) for ep in eps) if eps else 0.0,
        "generated_tokens": st.generated_tokens,
        "prompt_tokens": st.prompt_tokens,
        "cached_token_share": st.cached_share,
        "tokens_per_s": st.tokens_per_s,
        "env_steps": st.env_steps,
        "env_steps_per_s": st.env_steps_per_s,
        "wall_s": st.wall_s,
        "generate_s": st.generate_s,
        "rebuilt_prompts": sum(s.prompt_source == "rebuild" for ep in eps for s in ep.steps),
        "mean_cost_tokens": statistics.fmean(ep.cost_tokens for ep in eps) if eps else 0.0,
        "end_reasons": dict(collections.Counter(ep.end_reason for ep in eps)),
        "success_by_family": {
            f: statistics.fmean(e.success for e in group) for f, group in by_family.items()
        },
    }


def _print_summary(summary: dict[str, Any], engine: str, out: Path) -> None:
    s = summary
    ends = ", ".join(f"{k} {v}" for k, v in sorted(s["end_reasons"].items()))
    fams = ", ".join(f"{k} {v:.0%}" for k, v in s["success_by_family"].items())
    print(f"rollout with the {engine} engine")
    print(f"  episodes          {s['episodes']}  (success {s['success_rate']:.1%}; by family: {fams})")
    print(f"  steps per episode {s['mean_steps']:.1f}  (end reasons: {ends})")
    print(f"  tokens generated  {s['generated_tokens']}  ({s['tokens_per_s']:.0f} tokens/s in the engine)")
    print(f"  cached-token share {s['cached_token_share']:.1%} of {s['prompt_tokens']} prompt tokens")
    print(f"  prompts rebuilt   {s['rebuilt_prompts']}  (after edits, rollbacks or changed history)")
    print(
        f"  env steps         {s['env_steps']}  ({s['env_steps_per_s']:.2f} steps/s over {s['wall_s']:.1f} s wall)"
    )
    print(f"  trajectories      {out / 'trajectories.jsonl'}")


def run_rollout(args: argparse.Namespace) -> int:
    """Entry point of ``ctxrl rollout`` (see the module docstring)."""
    config = run_config(args)
    rollout_command(config, args.out, overwrite=args.overwrite)
    return 0


def rollout_command(config: RunConfig, out: Path, *, overwrite: bool = False) -> dict[str, Any]:
    """Run the rollout ``config`` describes into the run folder ``out``; return its summary."""
    from tqdm import tqdm

    from ctxrl.env.tasks.registry import BuiltinTaskSource
    from ctxrl.train.rollout import rollout
    from ctxrl.train.trajectory import save_trajectories

    out = prepare_out(out, overwrite=overwrite, inputs=[config.model])
    tc = config.tasks
    tasks = list(BuiltinTaskSource(tc.families or None, tc.difficulty).tasks(tc.split, tc.count))
    save_config(config, out)
    folder, tokenizer, price = resolve_model(config, out)
    generate, summariser = summary_engine(config, folder, tokenizer)
    engine = build_engine(config, folder, tokenizer)
    try:
        total = len(tasks) * config.rollout.group_size
        with tqdm(total=total, desc="episodes", unit="ep", dynamic_ncols=True) as bar:
            steps = 0

            def on_step(taken: int, ended: int) -> None:
                nonlocal steps
                steps += taken
                bar.update(ended)
                bar.set_postfix(steps=steps)

            result = rollout(
                engine,
                tokenizer,
                tasks,
                config.rollout,
                workdir=out / "workspaces",
                geometry=price,
                on_step=on_step,
                harness=config.harness,
                sampling=config.sampling,
                generate=generate,
            )
    finally:
        engine.close()
        if summariser is not None:
            summariser.close()
        if (out / "workspaces").is_dir() and not any((out / "workspaces").iterdir()):
            (out / "workspaces").rmdir()
    save_trajectories(result.episodes, out / "trajectories.jsonl")
    summary = summarize(result)
    write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    _print_summary(summary, engine.name, out)
    return summary
