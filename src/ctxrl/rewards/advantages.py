"""Advantages: the task channel (group-normalised success) plus the success-gated efficiency channel.

Per token of episode ``i`` in a group: ``A[i,t] = r_i + w_eff · a_eff_i · m_i[t]`` where

- ``r_i`` is the task advantage: the episode's reward minus the group mean, optionally divided by the
  group std (plain GRPO);
- ``a_eff_i`` is the efficiency advantage: ``clip((mean_c − c_i) / mean_c, −1, 1)`` with the mean over the
  group's successful, cleanly finished episodes (``"relative"``), or a cost rank mapped to ``[−1, 1]``
  (``"rank"``); zero for every other episode and for groups with fewer than two such episodes;
- ``m_i[t]`` is the edit mask over the episode's action tokens (:mod:`ctxrl.rewards.masks`).

Success stays primary: cost only re-ranks successful attempts, and only on edit tokens. Neither ``r_i`` nor
``a_eff_i`` depends on how many edits an episode made or how much they removed.

``efficiency_tokens: actions`` is an ablation, not the reference design: it sets ``m_i[t] = 1`` on every
action token, so the same success-gated efficiency advantage also falls on the steps that are not edits (reads,
searches). The learning benchmark uses it to test whether the channel fails only because the cost a policy adds
by reading more is invisible on its edit tokens (docs/results/learning/).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ctxrl.errors import ConfigError

__all__ = [
    "AdvantageConfig",
    "GroupAdvantages",
    "batch_advantages",
    "efficiency_advantages",
    "group_advantages",
    "task_advantages",
    "token_advantages",
]

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class AdvantageConfig:
    """How advantages are computed; defaults follow the reference run."""

    w_eff: float = 0.25
    """Weight of the efficiency channel on edit tokens (0 gives plain GRPO)."""
    scale_by_std: bool = True
    """Divide the task advantage by the group std (GRPO); False keeps only the mean baseline (Dr. GRPO)."""
    drop_zero_variance: Literal["none", "task", "signal"] = "none"
    """Drop groups: ``task`` = equal task rewards (DAPO as published); ``signal`` = every token advantage
    zero (keeps an all-success group whose costs differ, since its efficiency channel still teaches)."""
    efficiency: Literal["relative", "rank"] = "relative"
    """Efficiency channel: cost relative to the successful mean, or cost rank among the successful."""
    efficiency_tokens: Literal["edits", "actions"] = "edits"
    """Where the efficiency advantage goes: the edit tokens (the reference design) or every action token."""
    eps: float = 1e-6
    """Added to the std before dividing."""

    def __post_init__(self) -> None:
        if self.w_eff < 0:
            raise ConfigError(f"w_eff must be >= 0, got {self.w_eff}")
        if self.drop_zero_variance not in ("none", "task", "signal"):
            raise ConfigError(
                f"drop_zero_variance must be 'none', 'task' or 'signal', got {self.drop_zero_variance!r}"
            )
        if self.efficiency not in ("relative", "rank"):
            raise ConfigError(f"efficiency must be 'relative' or 'rank', got {self.efficiency!r}")
        if self.efficiency_tokens not in ("edits", "actions"):
            raise ConfigError(
                f"efficiency_tokens must be 'edits' or 'actions', got {self.efficiency_tokens!r}"
            )


def task_advantages(rewards: ArrayLike, *, scale_by_std: bool = True, eps: float = 1e-6) -> FloatArray:
    """Group-normalised task advantage of each episode: ``(r − mean) / (std + eps)``, or ``r − mean``.

    ``rewards`` is one group's rewards (success as 0/1, or a graded score). The std is the population std.

    >>> task_advantages([1, 0, 0, 1]).round(4).tolist()
    [1.0, -1.0, -1.0, 1.0]
    >>> task_advantages([1, 0, 0, 0], scale_by_std=False).tolist()
    [0.75, -0.25, -0.25, -0.25]
    """
    r = np.asarray(rewards, dtype=np.float64)
    centred = r - r.mean() if r.size else r
    if not scale_by_std:
        return centred
    return centred / (r.std() + eps) if r.size else centred


def efficiency_advantages(
    costs: ArrayLike,
    success: ArrayLike,
    clean: ArrayLike | None = None,
    *,
    method: Literal["relative", "rank"] = "relative",
) -> FloatArray:
    """Efficiency advantage of each episode in a group; nonzero only for successful, clean episodes.

    Eligible episodes are those with ``success`` and ``clean`` (finished by an explicit submit, not by a
    limit or an overflow; all clean when ``clean`` is None). With fewer than two eligible episodes, or a
    mean eligible cost of 0, every advantage is 0. ``relative``: ``clip((mean − c_i) / mean, −1, 1)``.
    ``rank``: cheapest 1, dearest −1, linear in the (tie-averaged) rank between. A cheaper eligible episode
    never gets a lower advantage than a dearer one.

    >>> efficiency_advantages([100, 300, 50, 80], [True, True, False, False]).tolist()
    [0.5, -0.5, 0.0, 0.0]
    >>> efficiency_advantages([100, 300, 200], [True, True, True], method="rank").tolist()
    [1.0, -1.0, 0.0]
    """
    c = np.asarray(costs, dtype=np.float64)
    ok = np.asarray(success, dtype=bool)
    if clean is not None:
        ok = ok & np.asarray(clean, dtype=bool)
    if c.shape != ok.shape:
        raise ValueError(f"costs {c.shape} and success {ok.shape} differ in shape")
    out = np.zeros_like(c)
    n = int(ok.sum())
    if n < 2:
        return out
    sub = c[ok]
    if method == "relative":
        mean = sub.mean()
        if mean <= 0:
            return out
        out[ok] = np.clip((mean - sub) / mean, -1.0, 1.0)
    elif method == "rank":
        order = np.argsort(sub, kind="stable")
        ranks = np.empty(n)
        ranks[order] = np.arange(n, dtype=np.float64)
        for value in np.unique(sub):  # ties share their mean rank
            same = sub == value
            ranks[same] = ranks[same].mean()
        out[ok] = 1.0 - 2.0 * ranks / (n - 1)
    else:
        raise ConfigError(f"efficiency method must be 'relative' or 'rank', got {method!r}")
    return out


def token_advantages(
    task_adv: ArrayLike, eff_adv: ArrayLike, masks: Sequence[ArrayLike], *, w_eff: float
) -> list[FloatArray]:
    """Per-token advantages ``A[i,t] = task_adv[i] + w_eff · eff_adv[i] · masks[i][t]``.

    ``masks[i]`` covers episode ``i``'s action tokens (1 on edit tokens); the result has the same lengths.

    >>> [a.tolist() for a in token_advantages([1.0, -1.0], [0.4, 0.0], [[0, 1, 1], [1, 0]], w_eff=0.25)]
    [[1.0, 1.1, 1.1], [-1.0, -1.0]]
    """
    r = np.asarray(task_adv, dtype=np.float64)
    e = np.asarray(eff_adv, dtype=np.float64)
    if not (len(r) == len(e) == len(masks)):
        raise ValueError(f"{len(r)} task advantages, {len(e)} efficiency advantages, {len(masks)} masks")
    return [r[i] + w_eff * e[i] * np.asarray(m, dtype=np.float64) for i, m in enumerate(masks)]


@dataclass(frozen=True)
class GroupAdvantages:
    """One group's advantages: per episode (``task``, ``efficiency``) and per action token (``tokens``)."""

    task: FloatArray
    efficiency: FloatArray
    tokens: list[FloatArray]
    dropped: bool
    """True when ``drop_zero_variance`` removed the group (its tokens are still returned, for logging)."""


def group_advantages(
    rewards: ArrayLike,
    costs: ArrayLike,
    success: ArrayLike,
    masks: Sequence[ArrayLike],
    *,
    clean: ArrayLike | None = None,
    config: AdvantageConfig | None = None,
) -> GroupAdvantages:
    """Both channels and the per-token advantages for one group of episodes of the same task.

    ``rewards``: task reward per episode; ``costs``: episode cost in any unit (see
    :func:`ctxrl.rewards.cost.episode_cost`); ``success``/``clean``: see :func:`efficiency_advantages`;
    ``masks``: edit mask over each episode's action tokens (all ones under ``efficiency_tokens: actions``).

    >>> g = group_advantages([1, 1, 0, 0], [100, 300, 50, 80], [True, True, False, False],
    ...                      [[1, 0], [1, 0], [1, 0], [0, 0]])
    >>> g.efficiency.tolist(), [round(float(a[0]), 4) for a in g.tokens]
    ([0.5, -0.5, 0.0, 0.0], [1.125, 0.875, -1.0, -1.0])
    >>> g = group_advantages([1, 1, 0, 0], [100, 300, 50, 80], [True, True, False, False],
    ...                      [[1, 0], [1, 0], [1, 0], [0, 0]],
    ...                      config=AdvantageConfig(efficiency_tokens="actions"))
    >>> [a.round(4).tolist() for a in g.tokens]
    [[1.125, 1.125], [0.875, 0.875], [-1.0, -1.0], [-1.0, -1.0]]
    """
    cfg = config or AdvantageConfig()
    if cfg.efficiency_tokens == "actions":
        masks = [np.ones_like(np.asarray(m, dtype=np.float64)) for m in masks]
    task = task_advantages(rewards, scale_by_std=cfg.scale_by_std, eps=cfg.eps)
    eff = efficiency_advantages(costs, success, clean, method=cfg.efficiency)
    tokens = token_advantages(task, eff, masks, w_eff=cfg.w_eff)
    r = np.asarray(rewards, dtype=np.float64)
    if cfg.drop_zero_variance == "task":
        dropped = bool(r.size == 0 or np.ptp(r) == 0)
    elif cfg.drop_zero_variance == "signal":
        dropped = not any(bool(np.any(a != 0)) for a in tokens)
    else:
        dropped = False
    return GroupAdvantages(task=task, efficiency=eff, tokens=tokens, dropped=dropped)


def batch_advantages(
    groups: Sequence[tuple[ArrayLike, ArrayLike, ArrayLike, Sequence[ArrayLike]]],
    *,
    clean: Sequence[ArrayLike | None] | None = None,
    config: AdvantageConfig | None = None,
) -> tuple[list[GroupAdvantages], list[int]]:
    """:func:`group_advantages` for each ``(rewards, costs, success, masks)`` group; also the dropped indices.

    >>> _, dropped = batch_advantages([([1, 1], [1, 2], [1, 1], [[0], [0]]), ([1, 0], [1, 2], [1, 0], [[0], [0]])],
    ...                               config=AdvantageConfig(drop_zero_variance="task"))
    >>> dropped
    [0]
    """
    results = [
        group_advantages(r, c, s, m, clean=None if clean is None else clean[i], config=config)
        for i, (r, c, s, m) in enumerate(groups)
    ]
    return results, [i for i, g in enumerate(results) if g.dropped]
