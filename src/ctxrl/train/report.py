"""One static HTML report of a run folder: training curves, context graphs, the Pareto plot, eval, evolution.

    path = write_report("runs/r1")                     # runs/r1/report.html
    path = write_report("runs/r1", out="r1.html", max_episodes=4)

Inputs, each optional (at least one must be there):

- ``trajectories.jsonl``: episodes (:mod:`ctxrl.train.trajectory`). Gives the per-episode context graph and,
  without an eval, the success-vs-compute plot of the rollout grouped by mode and skill.
- ``metrics.jsonl``: one JSON object per line, ``{"step": int, "<namespace>/<name>": number, ...}``. Gives
  one figure of training curves per namespace (``loss``, ``reward``, ``cost``, ...).
- ``eval/eval.json`` (or ``eval.json``): written by ``ctxrl eval --out``. Gives the eval table and the
  success-vs-compute (Pareto) plot per policy.
- ``evolve.sqlite``: skill evolution with a table ``candidates(id, parent, round, score, cost, decision)``.
  Gives the lineage and the per-round scores; a missing or differently shaped table skips the section
  with a note.

The page is one self-contained file: every plot is an SVG made by matplotlib, embedded as a ``data:`` URI
in an ``<img class="plot" id="plot-…" alt="…">``; no script, style sheet or font is fetched at view time.
Bad input (a missing folder, a line that is not JSON or not a record) is a :class:`UsageError` naming the
file and line.

**The context graph.** For each shown episode, one stacked bar per step (step 0 is the reset prompt) of
the context the model would see next, in the engine's tokens: the pinned prefix (the size of the first
prompt: system prompt, skill and task), the part of the editable region kept from the previous step, the
part added by this step (action, results, notes), and, hatched above, what the step freed. Markers on
top: ``edit`` (an applied edit), ``refused edit`` (rejected, failed or matched nothing), ``eviction``
(an applied eviction tool: ``evict_file_view``, ``archive_thread``, ``context_drop``, ``context_note``),
``harness eviction`` and ``rollback``. The last two are read off the step record, which has no field of
its own for them: the step rewrote the context (``edited``) with no applied receipt; when the readout
shown after the step counts more tokens than the context holds, the harness's pressure pass shrank it
after the readout (an eviction); otherwise the readout was written after the change, which the harness
does only on an overflow rollback.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import html
import io
import json
import math
import re
import sqlite3
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeGuard, TypeVar

from ctxrl.env.budget import READOUT
from ctxrl.errors import UsageError
from ctxrl.train.eval_table import COLUMNS
from ctxrl.train.trajectory import EpisodeRecord, StepRecord

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TRAJECTORIES = "trajectories.jsonl"
METRICS = "metrics.jsonl"
EVAL_FILES = ("eval/eval.json", "eval.json")
EVOLVE_DB = "evolve.sqlite"
EVOLVE_DBS = ("lineage.sqlite", EVOLVE_DB)
"""Evolution databases the report reads: the loop's lineage store first (``ctxrl evolve``)."""
P = ParamSpec("P")
R = TypeVar("R")
CANDIDATE_COLUMNS = ("id", "parent", "round", "score", "cost", "decision")

EVICTION_TOOLS = frozenset({"evict_file_view", "archive_thread", "context_drop", "context_note"})
"""Context tools whose applied call removes content from the context (seeds 000 and 001)."""
APPLIED_KINDS = frozenset({"applied", "applied_but_grew"})
MARKERS = ("edit", "refused edit", "eviction", "harness eviction", "rollback")
"""The event kinds of the context graph, in legend order."""


def _template_regex(template: str) -> re.Pattern[str]:
    """A regex matching ``template``'s output, each ``{name}`` an integer group called ``name``."""
    pattern = re.escape(template)
    pattern = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>-?\\d+)", pattern)
    return re.compile(pattern)


_READOUT = _template_regex(READOUT)


def parse_readout(text: str) -> tuple[int, int] | None:
    """``(tokens, limit)`` from a budget readout line, or None when ``text`` holds none.

    >>> parse_readout("[context: 1324/5748 tokens (23% of the limit)]")
    (1324, 5748)
    """
    match = _READOUT.search(text)
    return (int(match["tokens"]), int(match["limit"])) if match else None


# ------------------------------------------------------------------------------------------------ records


@dataclass(frozen=True)
class StepView:
    """What the report needs of one step (a :class:`StepRecord` without its token ids)."""

    prompt_tokens: int
    generated_tokens: int
    context_tokens: int
    readout: str
    tool_calls: tuple[str, ...]
    edit_calls: tuple[int, ...]
    receipt_kinds: tuple[str, ...]
    edited: bool
    prompt_source: str

    @classmethod
    def of(cls, step: StepRecord) -> StepView:
        return cls(
            prompt_tokens=len(step.prompt_ids),
            generated_tokens=len(step.token_ids),
            context_tokens=int(step.context_tokens),
            readout=step.readout,
            tool_calls=tuple(step.tool_calls),
            edit_calls=tuple(step.edit_calls),
            receipt_kinds=tuple(step.receipt_kinds),
            edited=bool(step.edited),
            prompt_source=step.prompt_source,
        )


@dataclass(frozen=True)
class EpisodeView:
    """What the report needs of one episode; the token ids are dropped on reading to keep memory small."""

    task_id: str
    family: str
    mode: str
    skill_id: str
    group: int
    index: int
    success: bool
    end_reason: str
    cost_tokens: float
    cost_flops: float | None
    steps: tuple[StepView, ...]

    @classmethod
    def of(cls, ep: EpisodeRecord) -> EpisodeView:
        return cls(
            task_id=ep.task_id,
            family=ep.family,
            mode=ep.mode,
            skill_id=ep.skill_id,
            group=ep.group,
            index=ep.index,
            success=bool(ep.success),
            end_reason=ep.end_reason,
            cost_tokens=float(ep.cost_tokens),
            cost_flops=None if ep.cost_flops is None else float(ep.cost_flops),
            steps=tuple(StepView.of(s) for s in ep.steps),
        )


@dataclass(frozen=True)
class MetricRow:
    step: int
    values: dict[str, float]


@dataclass(frozen=True)
class Candidate:
    """One row of ``candidates`` in ``evolve.sqlite``."""

    id: str
    parent: str | None
    round: int
    score: float | None
    cost: float | None
    decision: str


@dataclass
class RunData:
    """Everything read from one run folder; None: the input is absent. ``notes`` says what was skipped."""

    folder: Path
    episodes: list[EpisodeView] | None = None
    metrics: list[MetricRow] | None = None
    eval: dict[str, Any] | None = None
    eval_path: Path | None = None
    candidates: list[Candidate] | None = None
    notes: list[str] = field(default_factory=list)


def _json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed value)`` for each non-blank line; a line that is not JSON is a UsageError."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror})") from None
    with handle:
        try:
            for n, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    yield n, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise UsageError(f"{path}:{n}: not JSON ({exc.msg} at column {exc.colno})") from None
        except UnicodeDecodeError:
            raise UsageError(f"{path}: not UTF-8 text") from None


def load_episodes(path: str | Path) -> list[EpisodeView]:
    """The episodes of a trajectory file; a line that is not an episode record names the file and line."""
    path = Path(path)
    out = []
    for n, data in _json_lines(path):
        if not isinstance(data, dict):
            raise UsageError(f"{path}:{n}: not an episode record (a JSON {type(data).__name__})")
        try:
            out.append(EpisodeView.of(EpisodeRecord.from_dict(data)))
        except UsageError as exc:
            raise UsageError(f"{path}:{n}: {exc}") from None
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise UsageError(f"{path}:{n}: not an episode record ({type(exc).__name__}: {exc})") from None
    return out


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def load_metrics(path: str | Path) -> tuple[list[MetricRow], list[str]]:
    """The rows of ``metrics.jsonl`` in file order and the keys left out because a value was not a number.

    Every line must be an object with an integer ``step``; a null or non-finite value is left out of its
    curve (a gap), as is a non-numeric one (its key is returned so the report can say so).
    """
    path = Path(path)
    rows, ignored = [], set()
    for n, data in _json_lines(path):
        if not isinstance(data, dict):
            raise UsageError(f"{path}:{n}: not a JSON object with a 'step' (a JSON {type(data).__name__})")
        step = data.get("step")
        if isinstance(step, float) and step.is_integer():
            step = int(step)  # a tracker that logs every value as a float writes 3.0 for step 3
        if not isinstance(step, int) or isinstance(step, bool):
            raise UsageError(f"{path}:{n}: 'step' must be an integer, not {step!r}")
        values = {}
        for key, value in data.items():
            if key == "step" or value is None:
                continue
            if _number(value):
                if math.isfinite(value):
                    values[key] = float(value)
            else:
                ignored.add(key)
        rows.append(MetricRow(step, values))
    return rows, sorted(ignored)


def load_eval(path: str | Path) -> dict[str, Any]:
    """``eval.json`` as written by ``ctxrl eval --out``; its ``summary`` must be ``{policy: {family: row}}``."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text") from None
    summary = data.get("summary") if isinstance(data, dict) else None
    if not isinstance(summary, dict) or not all(
        isinstance(rows, dict) and all(isinstance(r, dict) for r in rows.values())
        for rows in summary.values()
    ):
        raise UsageError(f"{path}: no 'summary' of the form {{policy: {{family: {{metric: number}}}}}}")
    return data


def load_candidates(path: str | Path) -> tuple[list[Candidate] | None, str | None]:
    """The ``candidates`` rows of an evolution database, or ``(None, why not)`` when it has no such table.

    The file is opened read-only; a file that is not SQLite, a missing table or a missing column is a
    reason to skip the section, not an error (the schema belongs to the evolution loop).
    """
    path = Path(path)
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        return None, f"{path.name}: cannot open it ({exc})"
    try:
        info = con.execute("PRAGMA table_info(candidates)").fetchall()
        columns = {row[1] for row in info}
        if not info:
            return None, f"{path.name} has no table 'candidates'"
        if "score" not in columns and {"id", "parent", "round", "status"} <= columns:
            # the evolution loop's lineage store: a candidate's score and cost are its dev episodes' means
            rows = con.execute(
                'SELECT c."id", c."parent", c."round", AVG(e."score"), AVG(e."cost"), '
                'c."status" FROM candidates c LEFT JOIN episodes e '
                'ON e."skill" = c."id" AND e."split" = \'dev\' AND e."round" = c."round" '
                'GROUP BY c."id" ORDER BY c."round", c.rowid'
            ).fetchall()
        else:
            missing = [c for c in CANDIDATE_COLUMNS if c not in columns]
            if missing:
                return None, f"{path.name}: table 'candidates' lacks column(s) {', '.join(missing)}"
            rows = con.execute(
                'SELECT "id", "parent", "round", "score", "cost", "decision" FROM candidates '
                'ORDER BY "round", rowid'
            ).fetchall()
    except sqlite3.Error as exc:
        return None, f"{path.name}: cannot read it ({exc})"
    finally:
        con.close()
    out = []
    for cid, parent, rnd, score, cost, decision in rows:
        if not _number(rnd):
            return None, f"{path.name}: candidate {cid!r} has a non-numeric round {rnd!r}"
        out.append(
            Candidate(
                id=str(cid),
                parent=None if parent is None or parent == "" else str(parent),
                round=int(rnd),
                score=float(score) if _number(score) else None,
                cost=float(cost) if _number(cost) else None,
                decision="" if decision is None else str(decision),
            )
        )
    return out, None


def _find(folder: Path, name: str) -> Path | None:
    """``folder/name``, else the newest ``folder/<stage>/name`` (a pipeline's run folder holds one stage per
    subfolder, as the quickstart's does: the later stage's file is the one to show), else None."""
    if (folder / name).is_file():
        return folder / name
    found = [p for p in folder.glob(f"*/{name}") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime_ns) if found else None


def read_run(folder: str | Path) -> RunData:
    """Read every input present in ``folder`` (or in its stage subfolders, see :func:`_find`); UsageError
    when the folder is missing or holds none."""
    folder = Path(folder)
    if not folder.exists():
        raise UsageError(f"run folder {folder} does not exist")
    if not folder.is_dir():
        raise UsageError(f"{folder} is not a folder; give the run folder")
    run = RunData(folder)
    found = False
    trajectories = _find(folder, TRAJECTORIES)
    if trajectories is not None:
        found = True
        run.episodes = load_episodes(trajectories)
        if not run.episodes:
            run.notes.append(f"{TRAJECTORIES} holds no episodes.")
    metrics = _find(folder, METRICS)
    if metrics is not None:
        found = True
        run.metrics, ignored = load_metrics(metrics)
        if ignored:
            run.notes.append(f"{METRICS}: non-numeric keys not plotted: {', '.join(ignored)}.")
    evals = [p for p in (_find(folder, name) for name in EVAL_FILES) if p is not None]
    if evals:
        found = True
        run.eval_path = evals[0]
        run.eval = load_eval(evals[0])
    dbs = [p for p in (_find(folder, name) for name in EVOLVE_DBS) if p is not None]
    if dbs:
        found = True
        run.candidates, why = load_candidates(dbs[0])
        if why:
            run.notes.append(f"Evolution section skipped: {why}.")
    if not found:
        wanted = ", ".join([TRAJECTORIES, METRICS, EVAL_FILES[0], *EVOLVE_DBS])
        raise UsageError(f"{folder}: nothing to report; expected at least one of {wanted}")
    return run


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
        if all(_number(row.get(k)) for k in ("episodes", "success", "cost")) and row["episodes"] > 0:
            se = row.get("success_se")
            out.append(
                PolicyPoint(
                    policy,
                    int(row["episodes"]),
                    float(row["success"]),
                    float(se) if _number(se) else 0.0,
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


@_styled
def plot_metrics(rows: Sequence[MetricRow]) -> list[Plot]:
    """One figure per metric namespace, a panel per metric, value against step (with 20 points or more the
    raw curve is faint and a trailing moving mean of ``n // 20`` points is drawn on top)."""
    series: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        for key, value in row.values.items():
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
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            ax.plot(
                xs,
                ys,
                lw=1,
                color="#4c78a8",
                alpha=0.5 if len(xs) >= 20 else 1.0,
                marker="." if len(xs) < 20 else None,
            )
            if len(xs) >= 20:
                w = max(2, len(xs) // 20)
                smooth = [statistics.fmean(ys[max(0, j - w + 1) : j + 1]) for j in range(len(ys))]
                ax.plot(xs, smooth, lw=1.6, color="#4c78a8")
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


@_styled
def plot_rounds(candidates: Sequence[Candidate]) -> Plot:
    """Every candidate's score by round, coloured by decision, and the best score so far."""
    from matplotlib.ticker import MaxNLocator

    colors = _decision_colors(candidates)
    fig = _figure(7.5, 3.8)
    ax = fig.add_subplot()
    scored = [(c.round, c.score, c.decision) for c in candidates if c.score is not None]
    for decision, color in colors.items():
        sel = [(r, score) for r, score, d in scored if d == decision]
        if sel:
            ax.scatter(
                [r for r, _ in sel],
                [score for _, score in sel],
                color=color,
                s=28,
                label=decision or "(none)",
                zorder=3,
            )
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
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
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


# --------------------------------------------------------------------------------------------------- HTML

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1180px;
padding:0 16px;color:#222}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;border-bottom:1px solid #ddd;padding-bottom:3px;
margin-top:32px}.meta{color:#666}figure{margin:14px 0}figure img.plot{max-width:100%;height:auto;
display:block}figcaption{color:#555;font-size:12px}table{border-collapse:collapse;font-size:12px;
margin:8px 0}th,td{border:1px solid #ddd;padding:3px 7px;text-align:right}th{background:#f4f4f4}
td{white-space:nowrap}td.l,th.l{text-align:left}.row{display:flex;flex-wrap:wrap;gap:8px 24px;
align-items:flex-start}tr.overall td{font-weight:600;background:#fafafa}.notes{background:#fff8e1;
border:1px solid #f0d98c;padding:6px 10px}dl{display:grid;grid-template-columns:max-content auto;
gap:2px 14px}dt{color:#666}dd{margin:0}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _figure_html(plot: Plot) -> str:
    data = base64.b64encode(plot.svg).decode("ascii")
    caption = f"<figcaption>{_e(plot.caption)}</figcaption>" if plot.caption else ""
    return (
        f'<figure><img class="plot" id="{_e(plot.id)}" alt="{_e(plot.title)}" title="{_e(plot.title)}" '
        f'src="data:image/svg+xml;base64,{data}">{caption}</figure>'
    )


def _fmt(value: Any, spec: str) -> str:
    return format(value, spec) if _number(value) else "—"


def eval_table(summary: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """The eval summary as an HTML table: a row per policy and family, then the policy's overall row."""
    receipts = sorted(
        {k for rows in summary.values() for r in rows.values() for k in r if k.startswith("receipts/")}
    )
    head = [*COLUMNS, *(f"{k.split('/', 1)[1].replace('_', ' ')}/ep" for k in receipts)]
    out = ['<table id="eval-table"><thead><tr>']
    out += [f'<th class="{"l" if i < 2 else ""}">{_e(h)}</th>' for i, h in enumerate(head)]
    out.append("</tr></thead><tbody>")
    for policy, rows in summary.items():
        families = [f for f in rows if f != "overall"] + (["overall"] if "overall" in rows else [])
        for family in families:
            row = rows[family]
            if not row.get("episodes"):
                continue
            success = f"{_fmt(row.get('success'), '.2f')} ± {_fmt(row.get('success_se'), '.2f')}"
            cost = row.get("cost")
            gflop = cost / 1e9 if isinstance(cost, int | float) else None
            cells = [
                _fmt(row.get("episodes"), ".0f"),
                success,
                _fmt(row.get("tokens"), ",.0f"),
                _fmt(gflop, ",.1f"),
                _fmt(row.get("edits"), ".1f"),
                _fmt(row.get("rollbacks"), ".1f"),
                *(_fmt(row.get(k), ".1f") for k in receipts),
            ]
            cls = ' class="overall"' if family == "overall" else ""
            out.append(f'<tr{cls}><td class="l">{_e(policy)}</td><td class="l">{_e(family)}</td>')
            out += [f"<td>{_e(c)}</td>" for c in cells]
            out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _candidate_table(candidates: Sequence[Candidate], limit: int = 200) -> str:
    out = ['<table id="evolve-table"><thead><tr>']
    out += [
        f'<th class="{"l" if c in ("id", "parent", "decision") else ""}">{c}</th>' for c in CANDIDATE_COLUMNS
    ]
    out.append("</tr></thead><tbody>")
    for c in candidates[:limit]:
        cells = [
            (c.id, "l"),
            (c.parent or "—", "l"),
            (c.round, ""),
            (_fmt(c.score, ".3f"), ""),
            (_fmt(c.cost, ".4g"), ""),
            (c.decision or "—", "l"),
        ]
        out.append("<tr>" + "".join(f'<td class="{k}">{_e(v)}</td>' for v, k in cells) + "</tr>")
    out.append("</tbody></table>")
    more = f"<p>{len(candidates) - limit} more candidates not shown.</p>" if len(candidates) > limit else ""
    return "".join(out) + more


def _overview(run: RunData) -> str:
    items: list[tuple[str, str]] = [("run folder", run.folder.name or str(run.folder))]
    if run.episodes:
        eps = run.episodes
        rate = sum(ep.success for ep in eps) / len(eps)
        items.append(("episodes", f"{len(eps)} ({rate:.0%} success), {sum(len(e.steps) for e in eps)} steps"))
        modes = sorted({ep.mode for ep in eps})
        items.append(("modes", ", ".join(modes)))
        items.append(("families", ", ".join(sorted({ep.family for ep in eps}))))
    if run.metrics:
        steps = [r.step for r in run.metrics]
        items.append(("training steps", f"{min(steps)}–{max(steps)} ({len(run.metrics)} logged rows)"))
    if run.eval is not None:
        items.append(("eval", _e(run.eval.get("command", "")) or "eval.json"))
    if run.candidates is not None:
        rounds = {c.round for c in run.candidates}
        items.append(("evolution", f"{len(run.candidates)} candidates over {len(rounds)} rounds"))
    return "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in items) + "</dl>"


def render_report(run: RunData, *, max_episodes: int = 6) -> tuple[str, list[Plot]]:
    """The report's HTML and its plots (in page order)."""
    if max_episodes < 0:
        raise UsageError(f"the number of episodes to show must be >= 0, not {max_episodes}")
    sections: list[str] = []
    plots: list[Plot] = []

    def section(title: str, ident: str, body: Sequence[str]) -> None:
        sections.append(f'<section id="{ident}"><h2>{_e(title)}</h2>{"".join(body)}</section>')

    if run.metrics:
        new = plot_metrics(run.metrics)
        plots += new
        smooth = (
            "; with 20 points or more, thin: raw, thick: trailing moving mean"
            if len(run.metrics) >= 20
            else ""
        )
        intro = f"<p>From {METRICS}, one figure per metric namespace{smooth}.</p>"
        section(
            "Training curves",
            "training",
            [intro, '<div class="row">', *(_figure_html(p) for p in new), "</div>"],
        )
    shown = pick_episodes(run.episodes or [], max_episodes)
    if run.episodes and shown:
        new = [plot_timeline(ep) for ep in shown]
        plots += new
        intro = (
            f"<p>{len(shown)} of {len(run.episodes)} episodes (per mode the one with the most context events "
            "first). Bars: the context after each step, in the engine's tokens; hatched: what the step freed. "
            "Markers: edits, refused edits, evictions by the model or the harness, overflow rollbacks.</p>"
        )
        section("Context usage per episode", "context", [intro, *(_figure_html(p) for p in new)])
    pareto: list[str] = []
    if run.eval is not None:
        pts = eval_points(run.eval["summary"])
        if pts:
            p = plot_pareto(pts, "FLOPs", "eval", "plot-pareto-eval")
            plots.append(p)
            pareto.append(_figure_html(p))
    elif run.episodes:
        pts, unit = rollout_points(run.episodes)
        p = plot_pareto(pts, unit, "rollout, by mode and skill", "plot-pareto-rollout")
        plots.append(p)
        pareto.append(_figure_html(p))
    if pareto:
        section("Success vs compute", "pareto", pareto)
    if run.eval is not None:
        command = run.eval.get("command")
        head = (
            f"<p class=meta><code>{_e(command)}</code> · {_e(run.eval.get('date', ''))}</p>"
            if command
            else ""
        )
        section("Evaluation", "eval", [head, eval_table(run.eval["summary"])])
    if run.candidates:
        new = [plot_rounds(run.candidates), plot_lineage(run.candidates)]
        plots += new
        section("Evolution", "evolution", [*(_figure_html(p) for p in new), _candidate_table(run.candidates)])
    notes = "".join(f"<p>{_e(n)}</p>" for n in run.notes)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>ctxrl report: {_e(run.folder.name)}</title><style>{_CSS}</style></head><body>"
        f"<h1>ctxrl report: {_e(run.folder.name)}</h1><p class=meta>generated {now}</p>"
        f"{_overview(run)}"
        + (f'<div class="notes" id="notes">{notes}</div>' if notes else "")
        + "".join(sections)
        + "</body></html>\n"
    )
    return page, plots


def write_page(page: str, path: str | Path) -> Path:
    """Write ``page`` to ``path`` atomically (a temporary name, then a rename); returns the path."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path} is a folder; give the report's file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(page, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise UsageError(f"cannot write {path} ({exc.strerror})") from None
    return path


def write_report(folder: str | Path, out: str | Path | None = None, *, max_episodes: int = 6) -> Path:
    """Read ``folder`` and write its report (default ``folder/report.html``); returns the report's path."""
    run = read_run(folder)
    page, _ = render_report(run, max_episodes=max_episodes)
    return write_page(page, Path(out) if out is not None else Path(folder) / "report.html")
