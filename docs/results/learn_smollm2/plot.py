"""Draws curves.png of this folder from its metrics files: python docs/results/learn_smollm2/plot.py

SFT loss per optimiser step (sft_metrics.jsonl, TRL's log lines) and, per GRPO run (grpo*_metrics.jsonl,
ctxrl's metrics), the graded score and success of the step's train episodes and their replayed cost.
"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).parent


def rows(path: Path, key: str) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if key in r and "step" in r]


fig, ax = plt.subplots(1, 3, figsize=(12, 3.2))
sft = rows(HERE / "sft_metrics.jsonl", "loss")
ax[0].plot([r["step"] for r in sft], [r["loss"] for r in sft])
ax[0].set(yscale="log", title="SFT: loss on demo tokens", xlabel="optimiser step")
for path in sorted(HERE.glob("grpo*_metrics.jsonl")):
    run = path.name.removesuffix("_metrics.jsonl")
    grpo = rows(path, "reward/score")
    steps = [r["step"] for r in grpo]
    ax[1].plot(steps, [r["reward/score"] for r in grpo], "o-", label=f"{run}: graded score")
    ax[1].plot(steps, [r["reward/success"] for r in grpo], "s--", label=f"{run}: success")
    ax[2].plot(steps, [r["cost/tokens_per_episode"] for r in grpo], "o-", label=run)
ax[1].set(ylim=(-0.05, 1.05), title="GRPO: train episodes of each step", xlabel="step")
ax[1].legend(fontsize=7)
ax[2].set(title="GRPO: replayed cost tokens / episode", xlabel="step")
ax[2].legend(fontsize=7)
fig.tight_layout()
fig.savefig(HERE / "curves.png", dpi=90)
