"""What a GRPO step logs: the episodes' rollout, reward and cost metrics summed over ranks, the one-line
summary, and the progress bar."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ctxrl.train.credit import EpisodeCredit
from ctxrl.train.loss import LossStats
from ctxrl.train.rollout import RolloutStats
from ctxrl.train.rows import Row, layout_kind, row_stats
from ctxrl.train.trajectory import EpisodeRecord
from ctxrl.train.update import UpdateResult


def episode_metrics(
    acc: Any, episodes: Sequence[EpisodeRecord], credit: Sequence[EpisodeCredit], rows: Sequence[Row]
) -> dict[str, float]:
    """Rollout, reward and cost metrics summed over ranks, then divided."""
    groups = {ep.group: c.dropped for ep, c in zip(episodes, credit)}
    rs = row_stats(rows, [ep for ep, c in zip(episodes, credit) if not c.dropped])
    sums = torch.tensor(
        [
            len(episodes),
            sum(ep.success for ep in episodes),
            sum(c.reward for c in credit),
            sum(ep.score for ep in episodes),
            sum(ep.cost_tokens for ep in episodes),
            sum(ep.cost_tokens for ep in episodes if ep.success),
            sum(len(ep.steps) for ep in episodes),
            sum(1 for ep in episodes for s in ep.steps if s.edit_calls),
            sum(1 for ep in episodes for s in ep.steps if s.edited),
            len(groups),
            sum(groups.values()),
            rs.rows,
            rs.tokens,
            rs.naive_tokens,
            sum(not c.dropped for c in credit),
        ],
        dtype=torch.float64,
        device=acc.device,
    )
    (
        n,
        wins,
        reward,
        score,
        cost,
        win_cost,
        steps,
        edits,
        rebuilt,
        n_groups,
        dropped,
        n_rows,
        tokens,
        naive,
        trained,
    ) = acc.reduce(sums, "sum").tolist()
    n = n or 1.0
    return {
        "reward/success": wins / n,
        "reward/mean": reward / n,
        "reward/score": score / n,
        "reward/dropped_groups": dropped / (n_groups or 1.0),
        "rollout/episodes": n,
        "rollout/steps_per_episode": steps / n,
        "rollout/edits_per_episode": edits / n,
        "rollout/edited_steps_per_episode": rebuilt / n,
        "cost/tokens_per_episode": cost / n,
        "cost/tokens_per_success": win_cost / wins if wins else 0.0,
        "cost/rows_per_episode": n_rows / (trained or 1.0),
        "cost/row_tokens": tokens,
        "cost/naive_tokens": naive,
        "cost/packed_vs_naive_tokens": tokens / naive if naive else 0.0,
    }


def summary_line(m: dict[str, float]) -> str:
    return (
        f"step {int(m['step'])}: success {m['reward/success']:.2f} reward {m['reward/mean']:+.3f} "
        f"loss {m['loss/loss']:+.4f} kl {m['loss/kl']:.4f} clip {m['loss/clip_frac']:.3f} "
        f"tokens/ep {m['cost/tokens_per_episode']:.0f} rows/ep {m['cost/rows_per_episode']:.1f} "
        f"{m['time/step_s']:.1f}s"
    )


def groups_with_success(episodes: Sequence[EpisodeRecord]) -> tuple[int, int]:
    """``(groups holding a success, groups)`` of a step's episodes."""
    groups: dict[int, bool] = {}
    for ep in episodes:
        groups[ep.group] = groups.get(ep.group, False) or ep.success
    return sum(groups.values()), len(groups)


def progress_bar(total: int, initial: int, *, enabled: bool) -> Any:
    """A progress bar over optimiser steps (silent on every rank but the main one)."""
    from tqdm import tqdm

    return tqdm(
        total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True, disable=not enabled
    )


def step_metrics(
    acc: Any,
    step: int,
    graded: bool,
    episodes: Sequence[EpisodeRecord],
    credit: Sequence[EpisodeCredit],
    rows: Sequence[Row],
    update: UpdateResult,
    rollout_stats: RolloutStats,
    times: dict[str, float],
) -> dict[str, float]:
    """The namespaced metrics of one step (``rollout/``, ``reward/``, ``loss/``, ``cost/``, ``time/``), every
    rank's episodes and loss tokens counted; ``times``: seconds of the rollout, train, sync and the whole step."""
    metrics = {"step": float(step), "train/graded": float(graded)}
    metrics.update(episode_metrics(acc, episodes, credit, rows))
    metrics.update(
        LossStats.from_tensor(acc.reduce(update.stats.as_tensor().to(acc.device), "sum").cpu()).metrics()
    )
    entropy = acc.reduce(torch.tensor(update.entropy_sum, dtype=torch.float64, device=acc.device), "sum")
    metrics["loss/entropy"] = float(entropy.item()) / (metrics["loss/tokens"] or 1.0)
    metrics["loss/grad_norm"] = float(np.mean(update.grad_norms)) if update.grad_norms else 0.0
    metrics.update(rollout_stats.metrics())
    layouts = update.layouts
    batches = [float(mb.kind == "packed") for us in layouts for u in us for mb in u.all_batches()]
    metrics.update(
        {
            **{f"time/{name}_s": seconds for name, seconds in times.items()},
            "cost/packed": float(np.mean(batches or [0.0])),
            "cost/shared_prefix": float(
                np.mean([float(layout_kind(us) == "shared") for us in layouts] or [0.0])
            ),
            "cost/layout_tokens": float(sum(u.num_tokens for us in layouts for u in us)),
        }
    )
    return metrics
