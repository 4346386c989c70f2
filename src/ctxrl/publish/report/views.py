"""What the report derives from the inputs: each step's context bands and events, the episodes worth
showing, and success-vs-compute points with their Pareto front."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctxrl.publish.report.load import (
    APPLIED_KINDS,
    EVICTION_TOOLS,
    EpisodeView,
    StepView,
    is_number,
    parse_readout,
)

if TYPE_CHECKING:
    pass

# ------------------------------------------------------------------------------------- the context graph


@dataclass(frozen=True)
class TimelinePoint:
    """The context after one step, split into bands (tokens), and the step's events."""

    step: int
    pinned: int
    kept: int
    """Tokens of the editable region carried over from the previous point."""
    added: int
    """Tokens the step added on top of what it kept."""
    freed: int
    """Tokens the step removed: of the previous editable region, or, on a harness eviction, of the context
    the readout showed before the pressure pass shrank it."""
    limit: int | None
    """The enforced context limit, from the readout."""
    events: tuple[str, ...]


def step_events(step: StepView) -> tuple[str, ...]:
    """The context-graph events of one step (a subset of :data:`MARKERS`; see the module docstring)."""
    events = []
    applied = any(kind in APPLIED_KINDS for kind in step.receipt_kinds)
    if step.edit_calls or step.receipt_kinds:
        names = {step.tool_calls[i] for i in step.edit_calls if 0 <= i < len(step.tool_calls)}
        if not applied:
            events.append("refused edit")
        elif names & EVICTION_TOOLS:
            events.append("eviction")
            if names - EVICTION_TOOLS:
                events.append("edit")
        else:
            events.append("edit")
    if step.edited and not applied:
        shown = parse_readout(step.readout)
        if shown is not None and shown[0] > step.context_tokens:
            events.append("harness eviction")
        else:
            events.append("rollback")
    return tuple(events)


def context_timeline(ep: EpisodeView) -> list[TimelinePoint]:
    """Point 0 is the first prompt (pinned prefix only), point k the context after step k (k >= 1)."""
    if not ep.steps:
        return []
    pinned = ep.steps[0].prompt_tokens
    limit = None
    points = [TimelinePoint(0, pinned, 0, 0, 0, None, ())]
    previous = 0
    for k, step in enumerate(ep.steps, start=1):
        shown = parse_readout(step.readout)
        limit = shown[1] if shown else limit
        editable = max(0, step.context_tokens - pinned)
        kept = min(previous, editable)
        events = step_events(step)
        freed = previous - kept
        if "harness eviction" in events and shown is not None:
            freed = max(freed, shown[0] - step.context_tokens)
        points.append(TimelinePoint(k, pinned, kept, editable - kept, freed, limit, events))
        previous = editable
    return points


def pick_episodes(episodes: Sequence[EpisodeView], limit: int) -> list[EpisodeView]:
    """Up to ``limit`` episodes worth a context graph: first, per mode, the one with the most events (then
    the most steps); then the rest by the same order. Deterministic; ties keep file order."""

    def weight(ep: EpisodeView) -> tuple[int, int]:
        return sum(len(step_events(s)) for s in ep.steps), len(ep.steps)

    ranked = sorted((ep for ep in episodes if ep.steps), key=weight, reverse=True)
    chosen: list[EpisodeView] = []
    modes: set[str] = set()
    for ep in ranked:
        if ep.mode not in modes and len(chosen) < limit:
            chosen.append(ep)
            modes.add(ep.mode)
    for ep in ranked:
        if len(chosen) >= limit:
            break
        if ep not in chosen:
            chosen.append(ep)
    return chosen


# ------------------------------------------------------------------------------------- success vs compute


@dataclass(frozen=True)
class PolicyPoint:
    """One policy's success rate (with its binomial standard error) and mean compute per episode."""

    label: str
    episodes: int
    success: float
    success_se: float
    cost: float


def pareto_front(points: Sequence[PolicyPoint]) -> list[PolicyPoint]:
    """The points no other point beats: none is at most as costly and more successful, or cheaper and as
    successful. Sorted by cost.

    >>> a, b, c = PolicyPoint("a", 1, 0.5, 0, 10), PolicyPoint("b", 1, 0.4, 0, 20), PolicyPoint("c", 1, 0.9, 0, 30)
    >>> [p.label for p in pareto_front([a, b, c])]
    ['a', 'c']
    """
    front: list[PolicyPoint] = []
    for p in sorted(points, key=lambda p: (p.cost, -p.success)):
        if not front or p.success > front[-1].success:
            front.append(p)
    return front


def eval_points(summary: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[PolicyPoint]:
    """One point per policy from the ``overall`` row of an eval summary (cost: FLOPs per episode)."""
    out = []
    for policy, rows in summary.items():
        row = rows.get("overall") or {}
        if all(is_number(row.get(k)) for k in ("episodes", "success", "cost")) and row["episodes"] > 0:
            se = row.get("success_se")
            out.append(
                PolicyPoint(
                    policy,
                    int(row["episodes"]),
                    float(row["success"]),
                    float(se) if is_number(se) else 0.0,
                    float(row.get("cost") or 0.0),
                )
            )
    return out


def rollout_points(episodes: Sequence[EpisodeView]) -> tuple[list[PolicyPoint], str]:
    """One point per (mode, skill) of a rollout and the unit of its cost: FLOPs when every episode has
    them, else computed tokens. The label is the mode, with the skill id when a mode ran several skills."""
    use_flops = bool(episodes) and all(ep.cost_flops is not None for ep in episodes)
    groups: dict[tuple[str, str], list[EpisodeView]] = defaultdict(list)
    for ep in episodes:
        groups[(ep.mode, ep.skill_id)].append(ep)
    skills_per_mode = defaultdict(set)
    for mode, skill in groups:
        skills_per_mode[mode].add(skill)
    out = []
    for (mode, skill), eps in groups.items():
        n = len(eps)
        p = sum(ep.success for ep in eps) / n
        cost = statistics.fmean((ep.cost_flops or 0.0) if use_flops else ep.cost_tokens for ep in eps)
        label = mode if len(skills_per_mode[mode]) == 1 else f"{mode} · skill {skill[:8]}"
        out.append(PolicyPoint(label, n, p, math.sqrt(p * (1 - p) / n), cost))
    return out, "FLOPs" if use_flops else "computed tokens"
