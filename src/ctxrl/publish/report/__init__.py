"""One static HTML report of a run folder: training curves, context graphs, the Pareto plot, eval, evolution.

In four modules: :mod:`~ctxrl.publish.report.load` (the inputs), :mod:`~ctxrl.publish.report.views` (what is
derived from them), :mod:`~ctxrl.publish.report.plots` (the figures) and :mod:`~ctxrl.publish.report.html`
(the page).

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
- Arms side by side (an ablation, as the learning benchmark's folder holds them): two or more stage subfolders
  whose ``metrics.jsonl`` logs ``reward/success``, and ``summary.json`` of ``ctxrl compare``. Gives the first
  screen's held-out table (success ± SE, compute per success with its bootstrap CI, the paired difference)
  and one figure of every arm's training success by step with ± SE bands and the held-out points.

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

from ctxrl.publish.report.html import eval_table, render_report, write_page, write_report
from ctxrl.publish.report.load import (
    Candidate,
    EpisodeView,
    MetricRow,
    RunData,
    StepView,
    load_candidates,
    load_episodes,
    load_eval,
    load_metrics,
    parse_readout,
    read_run,
)
from ctxrl.publish.report.plots import Plot
from ctxrl.publish.report.views import (
    PolicyPoint,
    TimelinePoint,
    context_timeline,
    eval_points,
    pareto_front,
    pick_episodes,
    rollout_points,
    step_events,
)

__all__ = [
    "Candidate",
    "EpisodeView",
    "MetricRow",
    "Plot",
    "PolicyPoint",
    "RunData",
    "StepView",
    "TimelinePoint",
    "context_timeline",
    "eval_points",
    "eval_table",
    "load_candidates",
    "load_episodes",
    "load_eval",
    "load_metrics",
    "pareto_front",
    "parse_readout",
    "pick_episodes",
    "read_run",
    "render_report",
    "rollout_points",
    "step_events",
    "write_page",
    "write_report",
]
