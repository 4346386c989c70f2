"""Paired comparison of policies evaluated on the same held-out tasks: the learning benchmark's final table.

    ctxrl compare runs/ladder/eval_sft runs/ladder/eval_grpo runs/ladder/eval_grpo_w0 --out summary.json

Each argument is a ``ctxrl eval --out`` folder (its ``eval.json``) of one policy in one mode on the same tasks
and seeds: the first is the start (the SFT policy), the second the trained policy (GRPO, default ``w_eff``),
the third the ablation arm (GRPO, ``w_eff = 0``). Episodes are paired by task id. A slot may also be a **pool**
of replicates — the evaluations of several training runs of one recipe (other seeds) on the same tasks, given as
a comma-separated list of folders: each task then scores its success averaged over the replicates, and the
pool's compute per success is its pooled compute over its pooled successes.

    ctxrl compare final_start final_wide,final_wide_s1,final_wide_s2 final_wide_w0

- **Success difference** (trained − start): the mean of the per-task differences with a 95 % normal interval
  (``success_diff_ci_low`` / ``_high``) and a 95 % bootstrap interval over tasks
  (``success_diff_bootstrap_ci``), and the two-sided exact p-value of the paired permutation test
  (``success_diff_p``): under the null the episodes of both slots on a task are exchangeable, so the outcomes
  are shuffled within each task, and the p-value is the exact probability of a total difference at least as
  large (:func:`permutation_p`). With one evaluation in each slot this is the exact McNemar test on the
  discordant tasks ("as many tasks gained as lost"), and ``success_diff_test`` names which one it was.
- **Compute per success** (GFLOP): all of a policy's compute over its successes (None when it solved none),
  with a 95 % paired bootstrap interval over tasks (2,000 resamples, seeded) and the trained/start ratio
  with its interval from the same resamples.
- **Success** (``<key>_success`` and ``success_se``, per arm): the mean over tasks of each task's success rate
  and its standard error over tasks (for one evaluation, the binomial SE).
- **Episode shape** (``shape``, per arm): steps, prompt tokens and notes edits an episode, how many episodes
  made no edit and how many of those succeeded, and how many ended at ``max_steps``: what the policy does, beside
  what it scores (a field the eval did not record is None).
- **Where each policy came from** (``exported_from``, per arm): the training run and step its model was exported
  from, as its eval recorded it (None for a start or a model not written by ``ctxrl export --run``; a list,
  one per replicate, for a pool), and ``replicates``: how many evaluations each slot pools.
- **The ablation** (with a third folder): the trained arm against it, paired the same way
  (``grpo_vs_w0_success_diff`` with its interval and p-value; ``grpo_over_w0_cost_per_success`` with its
  bootstrap interval): how much of the change the efficiency channel causes.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
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


@dataclass(frozen=True)
class Pool:
    """One slot of the comparison: the evaluations of one recipe's replicates (training runs with other seeds)
    on the same tasks; a single evaluation is a pool of one."""

    members: tuple[Outcomes, ...]

    def __post_init__(self) -> None:
        if not self.members:
            raise UsageError("a compared slot needs at least one eval folder")
        first = self.members[0]
        for other in self.members[1:]:
            if (other.label, other.level, sorted(other.success)) != (
                first.label,
                first.level,
                sorted(first.success),
            ):
                raise UsageError(
                    f"the replicates of one slot must be evaluations in one mode at one level on the same tasks: "
                    f"{first.label} at {first.level!r} on {len(first.success)} tasks vs {other.label} at "
                    f"{other.level!r} on {len(other.success)}"
                )

    @property
    def label(self) -> str:
        return self.members[0].label

    @property
    def level(self) -> str:
        return self.members[0].level

    @property
    def tasks(self) -> list[str]:
        return sorted(self.members[0].success)

    def wins(self, task: str) -> int:
        """How many of the replicates solved ``task``."""
        return sum(m.success[task] for m in self.members)

    def rate(self, task: str) -> float:
        """The fraction of the replicates that solved ``task`` (0 or 1 for a single evaluation)."""
        return self.wins(task) / len(self.members)

    @property
    def exported_from(self) -> dict[str, Any] | list[dict[str, Any] | None] | None:
        """The member's origin for a single evaluation; a list of them, one per replicate, for a pool."""
        if len(self.members) == 1:
            return self.members[0].exported_from
        return [m.exported_from for m in self.members]


def _pool(slot: Outcomes | Pool | Sequence[Outcomes]) -> Pool:
    if isinstance(slot, Pool):
        return slot
    return Pool((slot,)) if isinstance(slot, Outcomes) else Pool(tuple(slot))


def episode_shape(outcomes: Outcomes | Pool, tasks: list[str]) -> dict[str, Any]:
    """What ``outcomes``' episodes on ``tasks`` did (every replicate's, for a pool): means of steps, prompt
    tokens and edits, the episodes without an edit (and how many of them succeeded), and those that ran out of
    steps. A figure whose field some episode lacks (or holds as other than a number) is None."""
    pairs = [(m, t) for m in _pool(outcomes).members for t in tasks]
    records = [m.episodes.get(t, {}) for m, t in pairs]

    def mean(key: str) -> float | None:
        values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
        return sum(values) / len(values) if values and len(values) == len(records) else None

    have_edits = bool(records) and all(isinstance(r.get("edits"), int) for r in records)
    no_edit = [(m, t) for (m, t), r in zip(pairs, records, strict=True) if have_edits and r["edits"] == 0]
    have_reason = bool(records) and all("reason" in r for r in records)
    return {
        "steps_per_episode": mean("steps"),
        "prompt_tokens_per_episode": mean("prompt_tokens"),
        "edits_per_episode": mean("edits"),
        "no_edit_episodes": len(no_edit) if have_edits else None,
        "no_edit_solved": sum(m.success[t] for m, t in no_edit) if have_edits else None,
        "max_steps_episodes": sum(r["reason"] == "max_steps" for r in records) if have_reason else None,
    }


def per_success(outcomes: Outcomes | Pool, tasks: list[str]) -> float | None:
    """GFLOP per success over ``tasks``: their compute over their successes (a pool's: every replicate's
    compute over every replicate's successes); None with no success."""
    members = _pool(outcomes).members
    wins = sum(m.success[t] for m in members for t in tasks)
    return sum(m.flops[t] for m in members for t in tasks) / wins / 1e9 if wins else None


def mcnemar_p(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value: ``P(|X - n/2| >= |gained - n/2|)`` for X ~ Binomial(n, 1/2)."""
    n = gained + lost
    if n == 0:
        return 1.0
    k = min(gained, lost)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def permutation_p(base: list[tuple[int, int]], other: list[tuple[int, int]]) -> float:
    """Two-sided exact p-value of the paired permutation test of success on the same tasks.

    ``base[i]`` and ``other[i]`` are (successes, episodes) of two slots on task ``i``. Under the null a task's
    episodes are exchangeable between the slots, so its successes fall into ``other`` hypergeometrically; the
    statistic is the summed difference of the per-task success rates, and the p-value the exact probability of
    one at least as far from zero, by convolving the tasks' distributions. With one episode a side it is the
    exact McNemar test.

    >>> permutation_p([(0, 1)] * 6, [(1, 1)] * 6) == mcnemar_p(6, 0)
    True
    """
    dist: dict[int, float] = {0: 1.0}
    observed = 0
    for (wins_b, n_b), (wins_o, n_o) in zip(base, other, strict=True):
        wins, n = wins_b + wins_o, n_b + n_o
        # in units of 1 / (n_b * n_o): x of the task's wins in `other` adds x / n_o - (wins - x) / n_b
        observed += wins_o * n_b - wins_b * n_o
        if wins in (0, n):
            continue
        ways = math.comb(n, n_o)
        step = {
            x * n_b - (wins - x) * n_o: math.comb(wins, x) * math.comb(n - wins, n_o - x) / ways
            for x in range(max(0, n_o - (n - wins)), min(wins, n_o) + 1)
        }
        merged: dict[int, float] = {}
        for total, p in dist.items():
            for add, q in step.items():
                merged[total + add] = merged.get(total + add, 0.0) + p * q
        dist = merged
    return min(1.0, sum(p for total, p in dist.items() if abs(total) >= abs(observed)))


def _interval(values: list[float]) -> tuple[float, float] | None:
    if not values:
        return None
    values = sorted(values)
    return values[int(0.025 * (len(values) - 1))], values[int(0.975 * (len(values) - 1))]


Slot = Outcomes | Pool | Sequence[Outcomes]
"""What :func:`compare` takes for each policy: one evaluation, or the evaluations of its replicates."""


def compare(start: Slot, trained: Slot, ablation: Slot | None = None) -> dict[str, Any]:
    """The summary (see the module docstring) of ``trained`` (and ``ablation``) against ``start``."""
    arms = [_pool(start), _pool(trained), *([_pool(ablation)] if ablation is not None else [])]
    tasks = arms[0].tasks
    for arm in arms[1:]:
        if arm.tasks != tasks:
            raise UsageError(
                f"{arm.label} was evaluated on other tasks than {arms[0].label} "
                f"({len(arm.tasks)} vs {len(tasks)}); evaluate every policy on the same tasks and seeds"
            )
    n = len(tasks)
    keys = ("sft", "grpo", "grpo_w0")[: len(arms)]  # the arms by position: their labels (modes) may repeat
    pools = dict(zip(keys, arms, strict=False))
    rates = {k: [a.rate(t) for t in tasks] for k, a in pools.items()}
    rng = random.Random(SEED)
    boot: dict[str, list[float]] = {k: [] for k in keys}
    ratio: list[float] = []
    channel: list[float] = []  # trained / ablation: what the efficiency channel does to compute per success
    gains: dict[str, list[float]] = {"sft": [], "grpo_w0": []}  # trained − each, success, per resample
    for _ in range(RESAMPLES):
        picks = [rng.randrange(n) for _ in range(n)]
        sample = [tasks[i] for i in picks]
        costs = {k: per_success(a, sample) for k, a in pools.items()}
        for k, c in costs.items():
            if c is not None:
                boot[k].append(c)
        for k in gains.keys() & pools.keys():
            gains[k].append(sum(rates["grpo"][i] - rates[k][i] for i in picks) / n)
        base, new = costs["sft"], costs["grpo"]
        if base is not None and new is not None:
            ratio.append(new / base)
        w0 = costs.get("grpo_w0")
        if new is not None and w0 is not None:
            channel.append(new / w0)
    mean, low, high, p = paired_difference(pools["sft"], pools["grpo"], tasks)
    summary: dict[str, Any] = {
        "level": arms[0].level,
        "heldout_tasks": n,
        "replicates": {k: len(a.members) for k, a in pools.items()},
        **{f"{k}_success": sum(rates[k]) / n if k in pools else None for k in ("sft", "grpo", "grpo_w0")},
        **{
            f"{k}_cost_per_success": per_success(pools[k], tasks) if k in pools else None
            for k in ("sft", "grpo", "grpo_w0")
        },
        "success_se": {k: _standard_error(r) for k, r in rates.items()},
        "success_diff": mean,
        "success_diff_ci_low": low,
        "success_diff_ci_high": high,
        "success_diff_bootstrap_ci": _interval(gains["sft"]),
        "success_diff_p": p,
        "success_diff_test": _test_name(pools["sft"], pools["grpo"]),
        "cost_per_success_ci": {k: _interval(boot[k]) for k in keys},
        "shape": {k: episode_shape(a, tasks) for k, a in pools.items()},
        "exported_from": {k: a.exported_from for k, a in pools.items()},
        "grpo_over_sft_cost_per_success": None,
        "grpo_over_sft_cost_per_success_ci": _interval(ratio),
        "unit": "GFLOP",
        "resamples": RESAMPLES,
    }
    if summary["sft_cost_per_success"] and summary["grpo_cost_per_success"] is not None:
        summary["grpo_over_sft_cost_per_success"] = (
            summary["grpo_cost_per_success"] / summary["sft_cost_per_success"]
        )
    if "grpo_w0" in pools:
        # the claim's control: the trained arm against the same training without the efficiency channel
        mean, low, high, p = paired_difference(pools["grpo_w0"], pools["grpo"], tasks)
        summary.update(
            {
                "grpo_vs_w0_success_diff": mean,
                "grpo_vs_w0_success_diff_ci_low": low,
                "grpo_vs_w0_success_diff_ci_high": high,
                "grpo_vs_w0_success_diff_bootstrap_ci": _interval(gains["grpo_w0"]),
                "grpo_vs_w0_success_diff_p": p,
                "grpo_vs_w0_success_diff_test": _test_name(pools["grpo_w0"], pools["grpo"]),
                "grpo_over_w0_cost_per_success": None,
                "grpo_over_w0_cost_per_success_ci": _interval(channel),
            }
        )
        if summary["grpo_w0_cost_per_success"] and summary["grpo_cost_per_success"] is not None:
            summary["grpo_over_w0_cost_per_success"] = (
                summary["grpo_cost_per_success"] / summary["grpo_w0_cost_per_success"]
            )
    return summary


def _standard_error(rates: list[float]) -> float:
    """The SE of a mean success over tasks: the spread of the per-task rates over sqrt(n) (for one evaluation's
    0/1 outcomes exactly the binomial sqrt(p (1 - p) / n))."""
    n = len(rates)
    mean = sum(rates) / n
    return math.sqrt(sum((r - mean) ** 2 for r in rates) / n / n)


def _test_name(base: Pool, other: Pool) -> str:
    one = len(base.members) == len(other.members) == 1
    return "exact McNemar" if one else "exact paired permutation"


def paired_difference(
    base: Outcomes | Pool, other: Outcomes | Pool, tasks: list[str]
) -> tuple[float, float, float, float]:
    """``other`` − ``base`` success on the same ``tasks`` (a pool's: its replicates' mean on each task): the mean
    per-task difference, its 95 % normal interval, and the exact p-value (:func:`permutation_p`; the exact
    McNemar test of the discordant tasks when each side is one evaluation)."""
    b, o = _pool(base), _pool(other)
    n = len(tasks)
    diffs = [o.rate(t) - b.rate(t) for t in tasks]
    mean = sum(diffs) / n
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n > 1 else 0.0
    if len(b.members) == len(o.members) == 1:
        p = mcnemar_p(diffs.count(1), diffs.count(-1))
    else:
        k_b, k_o = len(b.members), len(o.members)
        p = permutation_p([(b.wins(t), k_b) for t in tasks], [(o.wins(t), k_o) for t in tasks])
    return mean, mean - 1.96 * se, mean + 1.96 * se, p
