"""``ctxrl report``: one static HTML page of a run folder's plots and tables.

    ctxrl report runs/r1                      # writes runs/r1/report.html
    ctxrl report runs/r1 --out r1.html --episodes 3

See :mod:`ctxrl.publish.report` for the inputs it reads and what each plot shows.
"""

from __future__ import annotations

import argparse


def run_report(args: argparse.Namespace) -> int:
    """Entry point of ``ctxrl report``: write the page, print its path and what it holds."""
    from ctxrl.errors import UsageError
    from ctxrl.publish.report import read_run, render_report, write_page

    if args.episodes < 0:
        raise UsageError(f"--episodes must be >= 0, not {args.episodes}")
    run = read_run(args.folder)
    page, plots = render_report(run, max_episodes=args.episodes)
    path = write_page(page, args.out if args.out is not None else args.folder / "report.html")
    n = len(plots)
    print(f"wrote {path} ({n} plot{'' if n == 1 else 's'}, {path.stat().st_size / 1e3:,.0f} kB)")
    for note in run.notes:
        print(f"  note: {note}")
    return 0
