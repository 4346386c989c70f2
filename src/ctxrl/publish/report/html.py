"""The report page: one self-contained HTML file (every plot an embedded SVG), and writing it."""

from __future__ import annotations

import base64
import datetime as dt
import html
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ctxrl.errors import UsageError
from ctxrl.publish.report.load import (
    CANDIDATE_COLUMNS,
    METRICS,
    Candidate,
    MetricRow,
    RunData,
    is_number,
    read_run,
)
from ctxrl.publish.report.plots import (
    HEADLINE,
    Plot,
    binomial_se,
    flat_metrics,
    plot_arms,
    plot_headline,
    plot_lineage,
    plot_metrics,
    plot_pareto,
    plot_rounds,
    plot_skill_length,
    plot_timeline,
)
from ctxrl.publish.report.views import eval_points, pick_episodes, rollout_points
from ctxrl.train.eval_table import COLUMNS

# --------------------------------------------------------------------------------------------------- HTML

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1180px;
padding:0 16px;color:#222}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;border-bottom:1px solid #ddd;padding-bottom:3px;
margin-top:32px}summary h2{display:inline-block;cursor:pointer}.meta{color:#666}figure{margin:14px 0}figure img.plot{max-width:100%;height:auto;
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
    return format(value, spec) if is_number(value) else "—"


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


def answer_table(summary: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """Every policy's overall row, best success first: success ± SE, compute per episode and per success."""
    rows = [
        (policy, rows["overall"])
        for policy, rows in summary.items()
        if rows.get("overall", {}).get("episodes")
    ]
    rows.sort(key=lambda item: -(item[1].get("success") or 0.0))
    out = [
        '<table id="answer-table"><thead><tr><th class="l">policy</th><th>episodes</th><th>success ± SE</th>'
        "<th>GFLOP / episode</th><th>GFLOP / success</th><th>prompt tokens / episode</th></tr></thead><tbody>"
    ]
    for policy, row in rows:
        per = row.get("cost_per_success")
        cells = [
            _fmt(row.get("episodes"), ".0f"),
            f"{_fmt(row.get('success'), '.2f')} ± {_fmt(row.get('success_se'), '.2f')}",
            _fmt(row["cost"] / 1e9 if is_number(row.get("cost")) else None, ",.1f"),
            _fmt(per / 1e9 if is_number(per) else None, ",.1f"),
            _fmt(row.get("tokens"), ",.0f"),
        ]
        out.append(
            f'<tr><td class="l">{_e(policy)}</td>' + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


def comparison_table(summary: Mapping[str, Any], ident: str = "comparison-table") -> str:
    """``ctxrl compare``'s summary: each policy's held-out success ± SE and compute per success with its
    bootstrap CI, then the paired difference of the trained arm against the start. The rows are named by
    the summary's keys, with the evaluation each key stands for when the summary records it (the list of
    them for a pool of replicates)."""
    n = float(summary["heldout_tasks"])
    intervals = summary.get("cost_per_success_ci") or {}
    given = summary.get("compared")
    compared: Mapping[str, Any] = given if isinstance(given, dict) else {}
    se_given = summary.get("success_se")
    errors: Mapping[str, Any] = se_given if isinstance(se_given, dict) else {}
    out = [
        f"<p class=meta>Held out: {n:.0f} tasks at level {_e(summary.get('level', '?'))}, every policy on the "
        "same tasks (<code>ctxrl compare</code>).</p>"
        f'<table id="{_e(ident)}"><thead><tr><th class="l">policy</th><th>success ± SE</th>'
        f"<th>{_e(summary.get('unit', 'GFLOP'))} / success [95 % CI]</th></tr></thead><tbody>"
    ]
    for key in ("sft", "grpo", "grpo_w0"):
        success = summary.get(f"{key}_success")
        if not is_number(success):
            continue
        per, ci = summary.get(f"{key}_cost_per_success"), intervals.get(key)
        span = f" [{_fmt(ci[0], ',.0f')}, {_fmt(ci[1], ',.0f')}]" if isinstance(ci, list | tuple) else ""
        se = errors.get(key) if is_number(errors.get(key)) else binomial_se(success, n)
        cells = [f"{success:.2f} ± {se:.2f}", f"{_fmt(per, ',.0f')}{span}"]
        name = key
        if isinstance(compared.get(key), str):
            name = f"{key} ({compared[key]})"
        elif isinstance(compared.get(key), list):  # a pool of replicates
            name = f"{key} (pool of {len(compared[key])}: {', '.join(map(str, compared[key]))})"
        out.append(
            f'<tr><td class="l">{_e(name)}</td>' + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>"
        )
    out.append("</tbody></table>")
    for label, prefix, ratio in (
        ("grpo − sft", "success_diff", "grpo_over_sft_cost_per_success"),
        ("grpo − grpo_w0", "grpo_vs_w0_success_diff", "grpo_over_w0_cost_per_success"),
    ):
        diff, low, high, p, test = (
            summary.get(prefix + k) for k in ("", "_ci_low", "_ci_high", "_p", "_test")
        )
        if not (is_number(diff) and is_number(low) and is_number(high)):
            continue
        times, bounds = summary.get(ratio), summary.get(ratio + "_ci")
        out.append(
            f"<p>{label} success: {diff:+.3f}, 95 % CI [{low:+.3f}, {high:+.3f}]"
            + (f", {test if isinstance(test, str) else 'exact McNemar'} p = {p:.3f}" if is_number(p) else "")
            + (f"; compute per success ×{times:.2f}" if is_number(times) else "")
            + (
                f" [{bounds[0]:.2f}, {bounds[1]:.2f}]"
                if isinstance(bounds, list | tuple) and len(bounds) == 2
                else ""
            )
            + ".</p>"
        )
    return "".join(out)


def trend_line(rows: Sequence[MetricRow]) -> str:
    """One sentence: success and compute per success over the first and the last fifth of the steps."""
    k = max(1, len(rows) // 5)
    first, last = rows[:k], rows[-k:]
    parts = []
    for key, label in HEADLINE:
        # a step without a success logs 0 compute per success: not a cost, left out of the mean
        keep = (lambda v: v > 0) if key.endswith("per_success") else (lambda v: True)
        a, b = (
            [r.values[key] for r in rows_ if key in r.values and keep(r.values[key])]
            for rows_ in (first, last)
        )
        if a and b:
            parts.append(f"{label} {statistics.fmean(a):,.3g} → {statistics.fmean(b):,.3g}")
    span = f"steps {first[0].step}–{first[-1].step} vs {last[0].step}–{last[-1].step}"
    return f"Training ({span}, means): " + "; ".join(parts) if parts else "No success or cost metrics logged."


def _candidate_table(candidates: Sequence[Candidate], limit: int = 200) -> str:
    columns = [*CANDIDATE_COLUMNS, "chars", "pool"]
    out = ['<table id="evolve-table"><thead><tr>']
    out += [
        f'<th class="{"l" if c in ("id", "parent", "decision", "pool") else ""}">{c}</th>' for c in columns
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
            ("—" if c.chars is None else f"{c.chars:,}", ""),
            ("—" if c.in_pool is None else ("in the pool" if c.in_pool else ""), "l"),
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

    # ---- the first screen: did it get better, and at what cost -------------------------------------------
    answer: list[str] = []
    if run.comparison is not None:
        answer.append(comparison_table(run.comparison))
    for i, (name, more) in enumerate(run.more_comparisons.items()):
        answer.append(f"<h3>{_e(name)}</h3>" + comparison_table(more, f"comparison-table-{i + 2}"))
    if run.arms:
        arms_plot = plot_arms(run.arms, run.comparison)
        plots.append(arms_plot)
        answer.append(_figure_html(arms_plot))
    # with arms side by side, the first screen compares them; one stage's eval and curves stay below
    if run.eval is not None and not run.arms:
        answer.append(answer_table(run.eval["summary"]))
    headline = plot_headline(run.metrics) if run.metrics and not run.arms else None
    if headline is not None:
        plots.append(headline)
        answer += [f"<p class=meta>{_e(trend_line(run.metrics or []))}</p>", _figure_html(headline)]
    side: list[str] = []
    if run.eval is not None:
        pts = eval_points(run.eval["summary"])
        if pts:
            p = plot_pareto(pts, "FLOPs", "eval", "plot-pareto-eval")
            plots.append(p)
            side.append(_figure_html(p))
    elif run.episodes:
        pts, unit = rollout_points(run.episodes)
        p = plot_pareto(pts, unit, "rollout, by mode and skill", "plot-pareto-rollout")
        plots.append(p)
        side.append(_figure_html(p))
    shown = pick_episodes(run.episodes or [], max_episodes)
    timelines = [plot_timeline(ep) for ep in shown]
    if timelines:
        plots.append(timelines[0])
        side.append(_figure_html(timelines[0]))
    if side:
        answer += ['<div class="row">', *side, "</div>"]
    if answer:
        section("Did it get better, and at what cost?", "answer", answer)

    # ---- below: everything else ----------------------------------------------------------------------------
    if run.metrics:
        new = plot_metrics(run.metrics)
        plots += new
        smooth = (
            "; with 20 points or more, thin: raw, thick: trailing moving mean"
            if len(run.metrics) >= 20
            else ""
        )
        flat = flat_metrics(run.metrics)
        hidden = (
            "<p class=meta>Flat over the run, not plotted: "
            + ", ".join(f"{_e(k)} = {_fmt(v, '.4g')}" for k, v in flat.items())
            + ".</p>"
            if flat
            else ""
        )
        intro = f"<p>From {METRICS}, one figure per metric namespace{smooth}.</p>{hidden}"
        sections.append(
            f'<section id="training"><details id="all-metrics"><summary><h2>All training curves '
            f'({len(new)} figures)</h2></summary>{intro}<div class="row">'
            + "".join(_figure_html(p) for p in new)
            + "</div></details></section>"
        )
    if len(timelines) > 1:
        plots += timelines[1:]
        intro = (
            f"<p>{len(shown)} of {len(run.episodes or [])} episodes (per mode the one with the most context "
            "events first; the first is above). Bars: the context after each step, in the engine's tokens; "
            "hatched: what the step freed. Markers: edits, refused edits, evictions by the model or the harness, "
            "overflow rollbacks.</p>"
        )
        section("Context usage per episode", "context", [intro, *(_figure_html(p) for p in timelines[1:])])
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
        if any(c.chars is not None for c in run.candidates):
            new.append(plot_skill_length(run.candidates))
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
