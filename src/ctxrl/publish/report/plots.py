"""The report's figures: matplotlib SVGs of the metric curves, the context graph, the Pareto plot and
the evolution rounds and lineage."""

from __future__ import annotations

import functools
import io
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from ctxrl.publish.report.load import MARKERS, SUCCESS, Candidate, EpisodeView, MetricRow, is_number
from ctxrl.publish.report.views import PolicyPoint, context_timeline, pareto_front

if TYPE_CHECKING:
    from matplotlib.figure import Figure

P = ParamSpec("P")
R = TypeVar("R")

# -------------------------------------------------------------------------------------------------- plots


@dataclass(frozen=True)
class Plot:
    """One rendered figure: its element id, its title (also the alt text) and the SVG bytes."""

    id: str
    title: str
    svg: bytes
    caption: str = ""


_STYLE: dict[Any, Any] = {
    "font.size": 10,
    "axes.titlesize": 11,
    "legend.fontsize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "svg.fonttype": "path",  # glyphs as paths: the page needs no font at view time
    "svg.hashsalt": "ctxrl-report",  # stable element ids: the same run gives the same file
}
_BANDS = (("pinned prefix", "#9e9e9e"), ("kept", "#4c78a8"), ("added this step", "#f58518"))
_MARKER_STYLE = {
    "edit": ("^", "#2ca02c"),
    "refused edit": ("x", "#ff7f0e"),
    "eviction": ("D", "#9467bd"),
    "harness eviction": ("d", "#8c564b"),
    "rollback": ("v", "#d62728"),
}


def _styled(fn: Callable[P, R]) -> Callable[P, R]:
    """Run a plotting function under the report's matplotlib style (it applies when axes are made)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        import matplotlib

        with matplotlib.rc_context(_STYLE):
            return fn(*args, **kwargs)

    return wrapper


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _svg(fig: Figure) -> bytes:
    import matplotlib

    buffer = io.BytesIO()
    with matplotlib.rc_context(_STYLE):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


HEADLINE = (("reward/success", "success"), ("cost/tokens_per_success", "compute per success (tokens)"))
"""The two curves of the report's first screen: did it get better, and at what cost."""


def flat_metrics(rows: Sequence[MetricRow]) -> dict[str, float]:
    """The metrics that never change over the run (their one value), left out of the curves."""
    seen: dict[str, set[float]] = defaultdict(set)
    for row in rows:
        for key, value in row.values.items():
            seen[key].add(value)
    return {
        key: next(iter(values)) for key, values in sorted(seen.items()) if len(values) == 1 and len(rows) > 1
    }


def _curve(ax: Any, xs: Sequence[int], ys: Sequence[float], color: str = "#4c78a8") -> None:
    """Raw points; with 20 or more, a faint raw curve and a trailing moving mean of ``n // 20`` on top."""
    many = len(xs) >= 20
    ax.plot(xs, ys, lw=1, color=color, alpha=0.5 if many else 1.0, marker=None if many else ".")
    if many:
        w = max(2, len(xs) // 20)
        ax.plot(
            xs, [statistics.fmean(ys[max(0, j - w + 1) : j + 1]) for j in range(len(ys))], lw=1.6, color=color
        )


@_styled
def plot_headline(rows: Sequence[MetricRow]) -> Plot | None:
    """Success and compute per success against step, side by side (None: the run logged neither)."""
    keys = [(k, label) for k, label in HEADLINE if any(k in r.values for r in rows)]
    if not keys:
        return None
    fig = _figure(4.6 * len(keys), 2.9)
    title = "Success and compute per success by training step"
    fig.suptitle(title)
    for i, (key, label) in enumerate(keys):
        ax = fig.add_subplot(1, len(keys), i + 1)
        pts = sorted((r.step, r.values[key]) for r in rows if key in r.values)
        if key.endswith("per_success"):
            pts = [p for p in pts if p[1] > 0]  # 0: no success in that step, no cost to show
        if pts:
            _curve(ax, [p[0] for p in pts], [p[1] for p in pts], "#4c78a8" if i == 0 else "#f58518")
        else:
            ax.text(0.5, 0.5, "no step had a success", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
        ax.set_title(label)
        ax.set_xlabel("step")
    return Plot("plot-headline", title, _svg(fig))


_ARM_COLORS = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#9d755d")


def binomial_se(p: float, n: float) -> float:
    """The standard error of a success rate ``p`` over ``n`` episodes."""
    return math.sqrt(max(p * (1.0 - p), 0.0) / n) if n > 0 else 0.0


@dataclass(frozen=True)
class HeldOut:
    """One held-out point of ``ctxrl compare``'s summary: the success, the evaluated checkpoint's step (None when
    the summary does not say), its standard error (None: take the binomial one over the held-out tasks), and how
    many training runs were pooled into it."""

    success: float
    step: int | None
    se: float | None = None
    runs: int = 1


def _members(origin: object) -> list[object]:
    """An ``exported_from`` entry as a list: one record for a single evaluation, one per replicate for a pool
    (a record is a dict naming ``run`` and ``step``; an evaluation of no training run has None)."""
    return origin if isinstance(origin, list) else [origin]


def _run_name(member: object) -> str | None:
    """The folder name of the run a record names, or None when it names none."""
    return PurePath(str(member["run"])).name if isinstance(member, dict) and member.get("run") else None


def held_out(comparison: Mapping[str, Any], arm: str) -> HeldOut | None:
    """The held-out success of the training run in folder ``arm`` in ``ctxrl compare``'s summary, or None when
    the summary did not evaluate that run. A summary that records ``exported_from`` names its runs there
    (matched by folder name); an older one by its keys (``<arm>_success``: the arms ``grpo`` and ``grpo_w0``),
    the checkpoint then being the run's last. A pool of replicates (``exported_from`` a list) has one success
    for all its runs: it is given once, on the first run it names, with the pool's own standard error."""
    origins = comparison.get("exported_from")
    if not isinstance(origins, dict):
        success = comparison.get(f"{arm}_success")
        return HeldOut(float(success), None) if is_number(success) else None
    errors = comparison.get("success_se")
    for key in ("grpo", "grpo_w0"):
        members, success = _members(origins.get(key)), comparison.get(f"{key}_success")
        first = members[0] if members else None
        if not isinstance(first, dict) or _run_name(first) != arm or not is_number(success):
            continue
        step = first.get("step")
        se = errors.get(key) if isinstance(errors, dict) and len(members) > 1 else None
        return HeldOut(
            float(success),
            step if isinstance(step, int) else None,
            float(se) if is_number(se) else None,
            len(members),
        )
    return None


def evaluated_runs(comparison: Mapping[str, Any] | None) -> list[str]:
    """The folder names of the training runs ``ctxrl compare``'s summary evaluated, in its order (every member
    of a pool); empty when it has no ``exported_from`` record."""
    origins = comparison.get("exported_from") if comparison else None
    if not isinstance(origins, dict):
        return []
    names = (_run_name(m) for key in ("grpo", "grpo_w0") for m in _members(origins.get(key)))
    return [name for name in names if name is not None]


@_styled
def plot_arms(arms: Mapping[str, Sequence[MetricRow]], comparison: dict[str, Any] | None) -> Plot:
    """Every arm's training success by step with a band of ± one binomial SE (``rollout/episodes`` a step),
    and, from ``ctxrl compare``'s summary, held-out success ± SE: the start at step 0, each evaluated arm at the
    step of its checkpoint, a pool of replicates once, on its first run (:func:`held_out`). When the summary
    names the runs it evaluated (:func:`evaluated_runs`) and there are others, those are drawn in colour and
    the others as thin grey lines behind them, so a folder of many ablations still shows the compared arms."""
    fig = _figure(8.4, 3.6)
    named = [name for name in dict.fromkeys(evaluated_runs(comparison)) if name in arms]
    shown = named or list(arms)
    context = [name for name in arms if name not in shown]
    which = "Both arms" if len(shown) == 2 else f"{len(shown)} arms"
    title = f"{which}: training success by step (band: ± SE) and held-out success (points: ± SE)"
    ax = fig.add_subplot(1, 1, 1)
    last = 0

    def points(rows: Sequence[MetricRow]) -> list[tuple[int, float, float]]:
        return sorted(
            (r.step, r.values[SUCCESS], r.values.get("rollout/episodes", 0.0))
            for r in rows
            if SUCCESS in r.values
        )

    for i, name in enumerate(context):
        pts = points(arms[name])
        label = f"{len(context)} other arms: training" if i == 0 else None
        ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=0.6, color="#bbbbbb", zorder=1, label=label)
        last = max(last, pts[-1][0] if pts else 0)
    for i, name in enumerate(shown):
        color = _ARM_COLORS[i % len(_ARM_COLORS)]
        pts = points(arms[name])
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        se = [binomial_se(p[1], p[2]) for p in pts]
        ax.plot(xs, ys, lw=1.2, marker=".", color=color, label=f"{name}: training", zorder=2)
        ax.fill_between(
            xs,
            [y - e for y, e in zip(ys, se)],
            [y + e for y, e in zip(ys, se)],
            color=color,
            alpha=0.15,
            lw=0,
        )
        last = max(last, xs[-1] if xs else 0)
        point = held_out(comparison, name) if comparison else None
        if comparison and point is not None:
            n = float(comparison["heldout_tasks"])
            pooled = f", pool of {point.runs} runs" if point.runs > 1 else ""
            ax.errorbar(
                [point.step if point.step is not None else xs[-1] if xs else 0],
                [point.success],
                yerr=[point.se if point.se is not None else binomial_se(point.success, n)],
                fmt="s",
                ms=7,
                color=color,
                capsize=4,
                label=f"{name}: held-out ({n:.0f} tasks{pooled})",
                zorder=3,
            )
    if comparison:
        start, n = float(comparison["sft_success"]), float(comparison["heldout_tasks"])
        ax.errorbar(
            [0],
            [start],
            yerr=[binomial_se(start, n)],
            fmt="o",
            ms=7,
            color="#555555",
            capsize=4,
            label=f"start: held-out ({n:.0f} tasks)",
            zorder=3,
        )
    ax.set_xlim(-0.5, last + 0.5)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("step")
    ax.set_ylabel("success")
    fig.legend(loc="outside right center", fontsize=7)
    fig.suptitle(title)
    return Plot("plot-arms", title, _svg(fig))


@_styled
def plot_metrics(rows: Sequence[MetricRow]) -> list[Plot]:
    """One figure per metric namespace, a panel per metric that changes, value against step (with 20 points
    or more the raw curve is faint and a trailing moving mean of ``n // 20`` points is drawn on top); the
    metrics that never change are left out (:func:`flat_metrics`)."""
    flat = flat_metrics(rows)
    series: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        for key, value in row.values.items():
            if key in flat:
                continue
            namespace = key.split("/", 1)[0] if "/" in key else "other"
            series[namespace][key].append((row.step, value))
    plots = []
    for namespace in sorted(series):
        keys = sorted(series[namespace])
        cols = min(3, len(keys))
        nrows = math.ceil(len(keys) / cols)
        fig = _figure(3.4 * cols, 2.5 * nrows + 0.3)
        title = f"Training curves: {namespace}"
        fig.suptitle(title)
        for i, key in enumerate(keys):
            ax = fig.add_subplot(nrows, cols, i + 1)
            pts = sorted(series[namespace][key])
            _curve(ax, [p[0] for p in pts], [p[1] for p in pts])
            ax.set_title(key)
            ax.set_xlabel("step")
            ax.set_ylabel(key.split("/", 1)[-1])
        plots.append(Plot(f"plot-train-{_slug(namespace)}", title, _svg(fig)))
    return plots


@_styled
def plot_timeline(ep: EpisodeView) -> Plot:
    """The context graph of one episode (see the module docstring)."""
    from matplotlib.ticker import MaxNLocator

    points = context_timeline(ep)
    xs = [p.step for p in points]
    fig = _figure(9.5, 3.6)
    ax = fig.add_subplot()
    bottom = [0] * len(points)
    for (label, color), values in zip(
        _BANDS, ([p.pinned for p in points], [p.kept for p in points], [p.added for p in points])
    ):
        ax.bar(xs, values, bottom=bottom, width=0.85, color=color, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    if any(p.freed for p in points):
        ax.bar(
            xs,
            [p.freed for p in points],
            bottom=bottom,
            width=0.85,
            color="none",
            edgecolor="#d62728",
            hatch="///",
            lw=0.6,
            label="freed this step",
        )
    tops = [b + p.freed for b, p in zip(bottom, points)]
    limits = [p.limit for p in points if p.limit is not None]
    ceiling = max([*tops, *limits, 1])
    if limits:
        ax.axhline(limits[-1], color="#d62728", ls="--", lw=1, label=f"limit ({limits[-1]:,} tokens)")
    for kind in MARKERS:
        hits = [(p.step, t) for p, t in zip(points, tops) if kind in p.events]
        if hits:
            marker, color = _MARKER_STYLE[kind]
            offset = 0.04 * ceiling * (1 + MARKERS.index(kind) % 2)
            ax.scatter(
                [h[0] for h in hits],
                [h[1] + offset for h in hits],
                marker=marker,
                color=color,
                s=36,
                zorder=3,
                label=kind,
            )
    ax.set_ylim(0, ceiling * 1.18)
    ax.set_xlim(-0.6, len(points) - 0.4)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    verdict = "success" if ep.success else "failure"
    title = f"Context usage: {ep.task_id} · mode {ep.mode} · episode {ep.group}.{ep.index} · {verdict} ({ep.end_reason})"
    ax.set_title(title)
    ax.set_xlabel("step (0 = first prompt)")
    ax.set_ylabel("context tokens")
    handles, labels = ax.get_legend_handles_labels()
    rank = [label for label, _ in _BANDS] + ["freed this step"]
    order = sorted(
        range(len(labels)), key=lambda i: rank.index(labels[i]) if labels[i] in rank else len(rank)
    )
    ax.legend(
        [handles[i] for i in order],
        [labels[i] for i in order],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        frameon=False,
    )
    ident = f"plot-context-{_slug(ep.task_id)}-{ep.mode}-{ep.group}-{ep.index}"
    counts = {k: sum(k in p.events for p in points) for k in MARKERS}
    caption = (
        ", ".join(f"{v} {k}{'s' if v != 1 else ''}" for k, v in counts.items() if v) or "no context events"
    )
    return Plot(ident, title, _svg(fig), f"{len(ep.steps)} steps; {caption}.")


@_styled
def plot_pareto(points: Sequence[PolicyPoint], unit: str, source: str, ident: str) -> Plot:
    """Success rate (± one standard error) against mean compute per episode, the Pareto front joined."""
    fig = _figure(7.5, 4.2)
    ax = fig.add_subplot()
    colors = [f"C{i % 10}" for i in range(len(points))]
    for p, color in zip(points, colors):
        ax.errorbar(
            p.cost,
            p.success,
            yerr=p.success_se,
            fmt="o",
            color=color,
            capsize=3,
            label=f"{p.label} (n={p.episodes})",
        )
    front = pareto_front(points)
    if len(front) > 1:
        ax.plot(
            [p.cost for p in front],
            [p.success for p in front],
            color="#555555",
            ls=":",
            lw=1,
            label="Pareto front",
        )
    costs = [p.cost for p in points if p.cost > 0]
    if costs and max(costs) / min(costs) > 20:
        ax.set_xscale("log")
    ax.set_ylim(-0.05, 1.05)
    title = f"Success vs compute per policy ({source})"
    ax.set_title(title)
    if unit == "FLOPs":
        from matplotlib.ticker import EngFormatter

        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.set_xlabel(f"compute per episode ({unit})")
    ax.set_ylabel("success rate")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return Plot(ident, title, _svg(fig))


_DECISION_COLORS = {
    "accept": "#2ca02c",
    "accepted": "#2ca02c",
    "promoted": "#2ca02c",
    "kept": "#2ca02c",
    "reject": "#d62728",
    "rejected": "#d62728",
    "discarded": "#d62728",
    "seed": "#1f77b4",
}
"""Colours of the decisions whose meaning is plain; any other decision gets the next colour of a palette."""


def _decision_colors(candidates: Sequence[Candidate]) -> dict[str, str]:
    palette = iter(["#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"] * 8)
    decisions = dict.fromkeys(c.decision for c in candidates)
    return {d: _DECISION_COLORS.get(d.lower()) or next(palette) for d in decisions}


def _scatter_by_decision(ax: Any, points: Sequence[tuple[int, Any, str]], colors: dict[str, str]) -> None:
    """One scatter series per decision of ``(round, value, decision)`` points, in the decision's colour."""
    for decision, color in colors.items():
        sel = [(r, v) for r, v, d in points if d == decision]
        if sel:
            ax.scatter(
                [r for r, _ in sel],
                [v for _, v in sel],
                color=color,
                s=28,
                label=decision or "(none)",
                zorder=3,
            )


@_styled
def plot_rounds(candidates: Sequence[Candidate]) -> Plot:
    """Every candidate's score by round, coloured by decision, and the best score so far."""
    from matplotlib.ticker import MaxNLocator

    colors = _decision_colors(candidates)
    fig = _figure(7.5, 3.8)
    ax = fig.add_subplot()
    scored = [(c.round, c.score, c.decision) for c in candidates if c.score is not None]
    _scatter_by_decision(ax, scored, colors)
    rounds = sorted({r for r, _, _ in scored})
    best, running = [], -math.inf
    for rnd in rounds:
        running = max(running, *(score for r, score, _ in scored if r == rnd))
        best.append(running)
    if rounds:
        ax.step(rounds, best, where="post", color="#555555", lw=1.2, label="best so far")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    title = "Evolution: score per round"
    ax.set_title(title)
    ax.set_xlabel("round")
    ax.set_ylabel("score")
    if ax.get_legend_handles_labels()[0]:  # nothing scored yet: no legend (matplotlib would warn)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    else:
        ax.text(
            0.5, 0.5, "no candidate graded on dev tasks yet", ha="center", va="center", transform=ax.transAxes
        )
    return Plot("plot-evolve-rounds", title, _svg(fig))


@_styled
def plot_lineage(candidates: Sequence[Candidate]) -> Plot:
    """The lineage tree: a node per candidate at (round, rank within its round), an edge from its parent."""
    from matplotlib.ticker import MaxNLocator

    colors = _decision_colors(candidates)
    position: dict[str, tuple[int, int]] = {}
    per_round: dict[int, int] = defaultdict(int)
    for c in candidates:
        position[c.id] = (c.round, per_round[c.round])
        per_round[c.round] += 1
    height = max(per_round.values(), default=1)
    fig = _figure(7.5, min(8.0, max(3.0, 1.6 + 0.4 * height)))
    ax = fig.add_subplot()
    for c in candidates:
        if c.parent is not None and c.parent in position:
            (x0, y0), (x1, y1) = position[c.parent], position[c.id]
            ax.plot([x0, x1], [y0, y1], color="#999999", lw=0.8, zorder=1)
    for decision, color in colors.items():
        sel = [position[c.id] for c in candidates if c.decision == decision]
        ax.scatter(
            [p[0] for p in sel], [p[1] for p in sel], color=color, s=40, zorder=2, label=decision or "(none)"
        )
    if len(candidates) <= 40:
        for c in candidates:
            x, y = position[c.id]
            label = c.id if c.score is None else f"{c.id} ({c.score:.2f})"
            ax.annotate(label, (x, y), xytext=(4, 3), textcoords="offset points", fontsize=7.5)
    ax.set_yticks([])
    ax.grid(False, axis="y")
    ax.set_ylim(-0.6, height - 0.4)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    title = "Evolution: skill lineage"
    ax.set_title(title)
    ax.set_xlabel("round")
    ax.set_ylabel("candidates of the round")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return Plot("plot-evolve-lineage", title, _svg(fig))


@_styled
def plot_skill_length(candidates: Sequence[Candidate]) -> Plot:
    """Every candidate's skill length (characters) by round, coloured by decision, with the seed's as a line: a
    collapse (a rewrite that drops most of the skill) or a creep shows here."""
    from matplotlib.ticker import MaxNLocator

    colors = _decision_colors(candidates)
    fig = _figure(7.5, 3.4)
    ax = fig.add_subplot()
    sized = [(c.round, c.chars, c.decision) for c in candidates if c.chars is not None]
    _scatter_by_decision(ax, sized, colors)
    seed = [n for r, n, _ in sized if r == 0]
    if seed:
        ax.axhline(seed[0], color="#555555", lw=1.0, ls="--", label="seed")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    title = "Evolution: skill length per round"
    ax.set_title(title)
    ax.set_xlabel("round")
    ax.set_ylabel("characters")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return Plot("plot-evolve-length", title, _svg(fig))
