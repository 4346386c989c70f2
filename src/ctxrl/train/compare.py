"""Paired comparison of policies evaluated on the same held-out tasks: the learning benchmark's final table.

    ctxrl compare runs/ladder/eval_sft runs/ladder/eval_grpo runs/ladder/eval_grpo_w0 --out summary.json

Each argument is a ``ctxrl eval --out`` folder (its ``eval.json``) of one policy in one mode on the same tasks
and seeds: the first is the start (the SFT policy), the second the trained policy (GRPO, default ``w_eff``),
the third the ablation arm (GRPO, ``w_eff = 0``). Episodes are paired by task id.

- **Success difference** (trained − start): the mean of the per-task differences with a 95 % normal interval
  (``success_diff_ci_low`` / ``_high``), and the two-sided exact McNemar p-value on the discordant tasks
  (``success_diff_p``): the binomial test of "as many tasks gained as lost".
- **Compute per success** (GFLOP): all of a policy's compute over its successes (None when it solved none),
  with a 95 % paired bootstrap interval over tasks (2,000 resamples, seeded) and the trained/start ratio
  with its interval from the same resamples.
- **Episode shape** (``shape``, per arm): steps, prompt tokens and notes edits an episode, how many episodes
  made no edit and how many of those succeeded, and how many ended at ``max_steps``: what the policy does, beside
  what it scores (a field the eval did not record is None).
- **Where each policy came from** (``exported_from``, per arm): the training run and step its model was exported
  from, as its eval recorded it (None for a start or a model not written by ``ctxrl export --run``).
- **The ablation** (with a third folder): the trained arm against it, paired the same way
  (``grpo_vs_w0_success_diff`` with its interval and p-value; ``grpo_over_w0_cost_per_success`` with its
  bootstrap interval): how much of the change the efficiency channel causes.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxrl.errors import UsageError

RESAMPLES = 2000
SEED = 0


@dataclass(frozen=True)
class Outcomes:
    """One policy's held-out episodes, by task id: success, compute (FLOPs) and the whole episode record."""

    label: str
    level: str
    success: dict[str, bool]
    flops: dict[str, float]
    episodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    exported_from: dict[str, Any] | None = None
    """The training run and step of the evaluated model (``ctxrl export --run``), when the eval recorded it."""


def load_outcomes(folder: str | Path) -> Outcomes:
    """The episodes of ``folder``'s ``eval.json`` (one policy or mode row; a UsageError otherwise)."""
    path = Path(folder) / "eval.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        rows: dict[str, list[dict[str, Any]]] = record["episodes"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path}: not the eval.json of `ctxrl eval --out` ({exc})") from None
    if len(rows) != 1:
        raise UsageError(f"{path} holds {len(rows)} rows ({', '.join(rows)}); evaluate one mode per folder")
    ((label, episodes),) = rows.items()
    model = record.get("model")
    origin = model.get("exported_from") if isinstance(model, dict) else None
    return Outcomes(
        label=label,
        level=str(record.get("config", {}).get("difficulty", "")),
        success={e["task_id"]: bool(e["success"]) for e in episodes},
        flops={e["task_id"]: float(e["cost_flops"]) for e in episodes},
        episodes={e["task_id"]: e for e in episodes},
        exported_from=origin if isinstance(origin, dict) else None,
    )


def episode_shape(outcomes: Outcomes, tasks: list[str]) -> dict[str, Any]:
    """What ``outcomes``' episodes on ``tasks`` did: means of steps, prompt tokens and edits, the episodes
    without an edit (and how many of them succeeded), and those that ran out of steps. A figure whose field
    some episode lacks (or holds as other than a number) is None."""
    records = [outcomes.episodes.get(t, {}) for t in tasks]

    def mean(key: str) -> float | None:
        values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
        return sum(values) / len(values) if values and len(values) == len(records) else None

    have_edits = bool(records) and all(isinstance(r.get("edits"), int) for r in records)
    no_edit = [t for t, r in zip(tasks, records, strict=True) if have_edits and r["edits"] == 0]
    have_reason = bool(records) and all("reason" in r for r in records)
    return {
        "steps_per_episode": mean("steps"),
        "prompt_tokens_per_episode": mean("prompt_tokens"),
        "edits_per_episode": mean("edits"),
        "no_edit_episodes": len(no_edit) if have_edits else None,
        "no_edit_solved": sum(outcomes.success[t] for t in no_edit) if have_edits else None,
        "max_steps_episodes": sum(r["reason"] == "max_steps" for r in records) if have_reason else None,
    }


def per_success(outcomes: Outcomes, tasks: list[str]) -> float | None:
    """GFLOP per success over ``tasks``: their compute over their successes; None with no success."""
    wins = sum(outcomes.success[t] for t in tasks)
    return sum(outcomes.flops[t] for t in tasks) / wins / 1e9 if wins else None


def mcnemar_p(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value: ``P(|X - n/2| >= |gained - n/2|)`` for X ~ Binomial(n, 1/2)."""
    n = gained + lost
    if n == 0:
        return 1.0
    k = min(gained, lost)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def _interval(values: list[float]) -> tuple[float, float] | None:
    if not values:
        return None
    values = sorted(values)
    return values[int(0.025 * (len(values) - 1))], values[int(0.975 * (len(values) - 1))]


def compare(start: Outcomes, trained: Outcomes, ablation: Outcomes | None = None) -> dict[str, Any]:
    """The summary (see the module docstring) of ``trained`` (and ``ablation``) against ``start``."""
    arms = [start, trained, *([ablation] if ablation else [])]
    tasks = sorted(start.success)
    for arm in arms[1:]:
        if sorted(arm.success) != tasks:
            raise UsageError(
                f"{arm.label} was evaluated on other tasks than {start.label} "
                f"({len(arm.success)} vs {len(tasks)}); evaluate every policy on the same tasks and seeds"
            )
    n = len(tasks)
    mean, low, high, p = paired_difference(start, trained, tasks)
    keys = ("sft", "grpo", "grpo_w0")[: len(arms)]  # the arms by position: their labels (modes) may repeat
    rng = random.Random(SEED)
    boot: dict[str, list[float]] = {k: [] for k in keys}
    ratio: list[float] = []
    channel: list[float] = []  # trained / ablation: what the efficiency channel does to compute per success
    for _ in range(RESAMPLES):
        sample = [tasks[rng.randrange(n)] for _ in range(n)]
        costs = {k: per_success(a, sample) for k, a in zip(keys, arms, strict=True)}
        for k, c in costs.items():
            if c is not None:
                boot[k].append(c)
        base, new = costs["sft"], costs["grpo"]
        if base is not None and new is not None:
            ratio.append(new / base)
        w0 = costs.get("grpo_w0")
        if new is not None and w0 is not None:
            channel.append(new / w0)
    summary: dict[str, Any] = {
        "level": start.level,
        "heldout_tasks": n,
        "sft_success": sum(start.success.values()) / n,
        "grpo_success": sum(trained.success.values()) / n,
        "grpo_w0_success": sum(ablation.success.values()) / n if ablation else None,
        "sft_cost_per_success": per_success(start, tasks),
        "grpo_cost_per_success": per_success(trained, tasks),
        "grpo_w0_cost_per_success": per_success(ablation, tasks) if ablation else None,
        "success_diff": mean,
        "success_diff_ci_low": low,
        "success_diff_ci_high": high,
        "success_diff_p": p,
        "cost_per_success_ci": {k: _interval(boot[k]) for k in keys},
        "shape": {k: episode_shape(a, tasks) for k, a in zip(keys, arms, strict=True)},
        "exported_from": {k: a.exported_from for k, a in zip(keys, arms, strict=True)},
        "grpo_over_sft_cost_per_success": None,
        "grpo_over_sft_cost_per_success_ci": _interval(ratio),
        "unit": "GFLOP",
        "resamples": RESAMPLES,
    }
    if summary["sft_cost_per_success"] and summary["grpo_cost_per_success"] is not None:
        summary["grpo_over_sft_cost_per_success"] = (
            summary["grpo_cost_per_success"] / summary["sft_cost_per_success"]
        )
    if ablation is not None:
        # the claim's control: the trained arm against the same training without the efficiency channel
        mean, low, high, p = paired_difference(ablation, trained, tasks)
        summary.update(
            {
                "grpo_vs_w0_success_diff": mean,
                "grpo_vs_w0_success_diff_ci_low": low,
                "grpo_vs_w0_success_diff_ci_high": high,
                "grpo_vs_w0_success_diff_p": p,
                "grpo_over_w0_cost_per_success": None,
                "grpo_over_w0_cost_per_success_ci": _interval(channel),
            }
        )
        if summary["grpo_w0_cost_per_success"] and summary["grpo_cost_per_success"] is not None:
            summary["grpo_over_w0_cost_per_success"] = (
                summary["grpo_cost_per_success"] / summary["grpo_w0_cost_per_success"]
            )
    return summary


def paired_difference(base: Outcomes, other: Outcomes, tasks: list[str]) -> tuple[float, float, float, float]:
    """``other`` − ``base`` success on the same ``tasks``: the mean per-task difference, its 95 % normal
    interval, and the exact McNemar p-value of the discordant tasks."""
    n = len(tasks)
    diffs = [int(other.success[t]) - int(base.success[t]) for t in tasks]
    mean = sum(diffs) / n
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n > 1 else 0.0
    return mean, mean - 1.96 * se, mean + 1.96 * se, mcnemar_p(diffs.count(1), diffs.count(-1))
