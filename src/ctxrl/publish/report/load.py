"""The report's inputs read from a run folder: episodes, metrics, the eval summary, the evolution
lineage (through :mod:`ctxrl.evolve.lineage`), each optional. See :mod:`ctxrl.publish.report`."""

from __future__ import annotations

import json
import math
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from ctxrl.env.budget import READOUT
from ctxrl.errors import UsageError
from ctxrl.evolve.lineage import LineageError, read_candidates
from ctxrl.train.run_folder import json_lines
from ctxrl.train.trajectory import EpisodeRecord, StepRecord

TRAJECTORIES = "trajectories.jsonl"
METRICS = "metrics.jsonl"
EVAL_FILES = ("eval/eval.json", "eval.json")
EVOLVE_DB = "evolve.sqlite"
EVOLVE_DBS = ("lineage.sqlite", EVOLVE_DB)
"""Evolution databases the report reads: the loop's lineage store first (``ctxrl evolve``)."""
CANDIDATE_COLUMNS = ("id", "parent", "round", "score", "cost", "decision")
COMPARISON = "summary.json"
"""``ctxrl compare``'s summary of a start and trained arms on the same held-out tasks."""
MORE_COMPARISONS = "summary_*.json"
"""Further summaries of ``ctxrl compare`` beside it (another arm, another split)."""
SUCCESS = "reward/success"

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
    chars: int | None = None
    """Length of the skill body in characters (the lineage store has it; None for other databases)."""
    in_pool: bool | None = None
    """In the evolution's Pareto pool (the lineage store says; None for other databases)."""


@dataclass
class RunData:
    """Everything read from one run folder; None: the input is absent. ``notes`` says what was skipped."""

    folder: Path
    episodes: list[EpisodeView] | None = None
    metrics: list[MetricRow] | None = None
    eval: dict[str, Any] | None = None
    eval_path: Path | None = None
    candidates: list[Candidate] | None = None
    arms: dict[str, list[MetricRow]] | None = None
    """Training runs side by side (an ablation): each stage subfolder whose ``metrics.jsonl`` logs
    ``reward/success``, by folder name, when there are two or more."""
    comparison: dict[str, Any] | None = None
    """``summary.json`` of ``ctxrl compare``: held-out success and compute per success of the start and arms."""
    more_comparisons: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Further ``ctxrl compare`` summaries beside it (``summary_*.json``: another arm, another split), by file
    name."""
    notes: list[str] = field(default_factory=list)


def load_episodes(path: str | Path) -> list[EpisodeView]:
    """The episodes of a trajectory file; a line that is not an episode record names the file and line."""
    path = Path(path)
    out = []
    for n, data in json_lines(path):
        if not isinstance(data, dict):
            raise UsageError(f"{path}:{n}: not an episode record (a JSON {type(data).__name__})")
        try:
            out.append(EpisodeView.of(EpisodeRecord.from_dict(data)))
        except UsageError as exc:
            raise UsageError(f"{path}:{n}: {exc}") from None
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise UsageError(f"{path}:{n}: not an episode record ({type(exc).__name__}: {exc})") from None
    return out


def is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def load_metrics(path: str | Path) -> tuple[list[MetricRow], list[str]]:
    """The rows of ``metrics.jsonl`` in file order and the keys left out because a value was not a number.

    Every line must be an object with an integer ``step``; a null or non-finite value is left out of its
    curve (a gap), as is a non-numeric one (its key is returned so the report can say so).
    """
    path = Path(path)
    rows, ignored = [], set()
    for n, data in json_lines(path):
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
            if is_number(value):
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
        lineage = "score" not in columns and {"id", "parent", "round", "status"} <= columns
        missing = [c for c in CANDIDATE_COLUMNS if c not in columns]
        rows = (
            []
            if lineage or missing
            else con.execute(
                'SELECT "id", "parent", "round", "score", "cost", "decision" FROM candidates '
                'ORDER BY "round", rowid'
            ).fetchall()
        )
    except sqlite3.Error as exc:
        return None, f"{path.name}: cannot read it ({exc})"
    finally:
        con.close()
    if lineage:  # the evolution loop's lineage store: read through its own read side
        try:
            found = read_candidates(path)
        except LineageError as exc:
            return None, str(exc)
        return [
            Candidate(c.id, c.parent, c.round, c.score, c.cost, c.status, c.chars, c.in_pool) for c in found
        ], None
    if missing:
        return None, f"{path.name}: table 'candidates' lacks column(s) {', '.join(missing)}"
    out = []
    for cid, parent, rnd, score, cost, decision in rows:
        if not is_number(rnd):
            return None, f"{path.name}: candidate {cid!r} has a non-numeric round {rnd!r}"
        out.append(
            Candidate(
                id=str(cid),
                parent=None if parent is None or parent == "" else str(parent),
                round=int(rnd),
                score=float(score) if is_number(score) else None,
                cost=float(cost) if is_number(cost) else None,
                decision="" if decision is None else str(decision),
            )
        )
    return out, None


def load_comparison(path: Path) -> dict[str, Any] | None:
    """``summary.json`` as ``ctxrl compare`` writes it, or None when there is none or the file is another
    command's own summary (``ctxrl rollout`` and ``ctxrl sft`` write one into their run folders: it holds none
    of the comparison's keys); a file that is neither (unreadable, or a comparison with keys missing) is a
    UsageError naming it."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a readable JSON summary ({exc})") from None
    needed = ("heldout_tasks", "sft_success", "grpo_success")
    if isinstance(data, dict) and not any(k in data for k in needed):
        return None
    if not isinstance(data, dict) or not all(is_number(data.get(k)) for k in needed):
        raise UsageError(f"{path}: not the summary of 'ctxrl compare' (it needs {', '.join(needed)})")
    return data


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
    arms = {}
    for path in sorted(folder.glob(f"*/{METRICS}")):
        rows, _ = load_metrics(path)
        if any(SUCCESS in r.values for r in rows):
            arms[path.parent.name] = rows
    if len(arms) >= 2:
        found = True
        run.arms = arms
    comparison = load_comparison(folder / COMPARISON)
    if comparison is not None:
        found = True
        run.comparison = comparison
    for path in sorted(folder.glob(MORE_COMPARISONS)):
        more = load_comparison(path)
        if more is not None:
            found = True
            run.more_comparisons[path.name] = more
    if not found:
        wanted = ", ".join([TRAJECTORIES, METRICS, EVAL_FILES[0], *EVOLVE_DBS, COMPARISON])
        raise UsageError(f"{folder}: nothing to report; expected at least one of {wanted}")
    return run
