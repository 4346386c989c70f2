"""Credit assignment for training: from episode records to one advantage per generated token.

    reward = RewardConfig(penalties=Penalties(no_tool_call=0.3, format_failure=0.2))
    credit = assign_credit(episodes, CreditConfig(reward=reward))
    credit[i].steps[k][t]     # advantage of generated token t of step k of episode i
    credit[i].dropped         # its group carries no signal (drop_zero_variance) and is left out of training

Per episode the reward is its task reward (success 1/0, or the verifier's graded score with
``RewardConfig.graded``), minus the reference run's penalties on *failed* episodes only: ``no_tool_call`` when the
episode made no well-formed tool call at all, else ``format_failure`` when any call was malformed (the two
never stack). Episodes are grouped by ``EpisodeRecord.group`` (the G episodes of one task) and passed to
:func:`ctxrl.rewards.advantages.group_advantages` with the episode's edit masks concatenated over its steps,
so ``A[i,t] = r_i + w_eff · a_eff_i · m_i[t]``; the result is split back per step. The efficiency channel
prices episodes by ``RewardConfig.cost_unit`` (replayed computed tokens or FLOPs) and counts an episode as clean when it
ended by an explicit submit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Literal

import numpy as np

from ctxrl.env.actions import FORMAT_ERROR_TOOL
from ctxrl.errors import ConfigError
from ctxrl.rewards.advantages import AdvantageConfig, group_advantages
from ctxrl.train.trajectory import EpisodeRecord


@dataclass(frozen=True)
class Penalties:
    """Reward penalties on failed episodes (the reference run used 0.3 and 0.2); 0 disables one."""

    no_tool_call: float = 0.0
    """Subtracted from a failed episode's reward when it made no well-formed tool call."""
    format_failure: float = 0.0
    """Subtracted from a failed episode's reward when any of its tool calls was malformed."""

    def __post_init__(self) -> None:
        for name in ("no_tool_call", "format_failure"):
            value = getattr(self, name)
            if value < 0:
                raise ConfigError(f"penalties.{name} must be >= 0 (it is subtracted), got {value}")


@dataclass(frozen=True)
class RewardConfig:
    """What an episode's reward is and what its cost is measured in (the ``train.reward`` section)."""

    penalties: Penalties = field(default_factory=Penalties)
    """Penalties on failed episodes (the reference run: no_tool_call 0.3, format_failure 0.2)."""
    graded: bool = False
    """Use the verifier's graded score (fraction right) as the task reward instead of success 1/0."""
    cost_unit: Literal["tokens", "flops"] = "tokens"
    """What the efficiency channel compares: replayed computed tokens or replayed FLOPs."""


@dataclass(frozen=True)
class CreditConfig:
    """How rewards and advantages are made from episodes: the run's ``advantages`` and ``train.reward``."""

    advantages: AdvantageConfig = field(default_factory=AdvantageConfig)
    """The two channels (``w_eff``, std scaling, efficiency method) and ``drop_zero_variance``."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Penalties, graded or success reward, cost unit."""


@dataclass(frozen=True)
class EpisodeCredit:
    """One episode's reward, its two advantage channels and its per-token advantages, per step."""

    reward: float
    """The shaped reward the task channel normalised (task reward minus penalties)."""
    task: float
    """Task advantage ``r_i``."""
    efficiency: float
    """Efficiency advantage ``a_eff_i``."""
    steps: list[list[float]]
    """Per step, one advantage per generated token (same lengths as the steps' ``token_ids``)."""
    dropped: bool
    """The episode's group was dropped by ``drop_zero_variance``: train on none of its tokens."""


def shaped_reward(episode: EpisodeRecord, reward: RewardConfig) -> float:
    """The task reward of ``episode`` (score if ``reward.graded`` else reward) less ``reward.penalties``.

    ``no_tool_call`` applies when no step called a well-formed tool; otherwise ``format_failure`` applies
    when any call was malformed. Successful episodes are never penalised.
    """
    base, penalties = float(episode.score if reward.graded else episode.reward), reward.penalties
    if episode.success:
        return base
    calls = [name for step in episode.steps for name in step.tool_calls]
    if not any(name != FORMAT_ERROR_TOOL for name in calls):
        return base - penalties.no_tool_call
    if FORMAT_ERROR_TOOL in calls:
        return base - penalties.format_failure
    return base


def episode_cost(episode: EpisodeRecord, unit: str) -> float:
    """The replayed cost of ``episode`` in ``unit``; FLOPs need a rollout run with the model geometry."""
    if unit == "tokens":
        return float(episode.cost_tokens)
    if unit == "flops":
        if episode.cost_flops is None:
            raise ConfigError(
                "cost_unit is 'flops' but the episodes carry no FLOPs; roll out with geometry=... or use tokens"
            )
        return float(episode.cost_flops)
    raise ConfigError(f"cost_unit must be 'tokens' or 'flops', got {unit!r}")


def assign_credit(
    episodes: Sequence[EpisodeRecord], config: CreditConfig | None = None
) -> list[EpisodeCredit]:
    """One :class:`EpisodeCredit` per episode, in the order given; groups by ``EpisodeRecord.group``."""
    cfg = config or CreditConfig()
    groups: dict[int, list[int]] = {}
    for i, ep in enumerate(episodes):
        groups.setdefault(ep.group, []).append(i)
    out: list[EpisodeCredit | None] = [None] * len(episodes)
    for members in groups.values():
        eps = [episodes[i] for i in members]
        rewards = [shaped_reward(ep, cfg.reward) for ep in eps]
        masks = [[m for step in ep.steps for m in step.edit_mask] for ep in eps]
        for ep, mask in zip(eps, masks):
            if len(mask) != ep.num_generated:
                raise ConfigError(
                    f"episode {ep.task_id}#{ep.index}: edit masks cover {len(mask)} tokens, "
                    f"its steps generated {ep.num_generated}; the trajectory file is inconsistent"
                )
        result = group_advantages(
            rewards,
            [episode_cost(ep, cfg.reward.cost_unit) for ep in eps],
            [ep.success for ep in eps],
            masks,
            clean=[ep.end_reason == "submit" for ep in eps],
            config=cfg.advantages,
        )
        for j, (i, ep) in enumerate(zip(members, eps)):
            flat = np.asarray(result.tokens[j], dtype=np.float64)
            bounds = np.cumsum([0] + [len(s.token_ids) for s in ep.steps])
            out[i] = EpisodeCredit(
                reward=rewards[j],
                task=float(result.task[j]),
                efficiency=float(result.efficiency[j]),
                steps=[flat[a:b].tolist() for a, b in pairwise(bounds)],
                dropped=result.dropped,
            )
    assert all(c is not None for c in out)
    return [c for c in out if c is not None]
