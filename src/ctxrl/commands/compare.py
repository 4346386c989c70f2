"""``ctxrl compare``: the paired comparison of policies evaluated on the same held-out tasks.

    ctxrl compare runs/eval_sft runs/eval_grpo runs/eval_grpo_w0 --out docs/results/learning/summary.json

See :mod:`ctxrl.train.compare` for the figures and tests.
"""

from __future__ import annotations

import argparse
import json


def run_compare(args: argparse.Namespace) -> int:
    """Entry point of ``ctxrl compare``: print the summary, and write it with ``--out``."""
    from ctxrl.commands.common import check_writable_file, write_text
    from ctxrl.train.compare import compare, load_outcomes

    if args.out is not None:
        check_writable_file(args.out)
    start, trained = load_outcomes(args.start), load_outcomes(args.trained)
    ablation = load_outcomes(args.ablation) if args.ablation is not None else None
    summary = compare(start, trained, ablation)
    # which evaluation each key of the summary is, as given (a folder may hold several summaries)
    given = {"sft": args.start, "grpo": args.trained, "grpo_w0": args.ablation}
    summary["compared"] = {key: None if path is None else str(path) for key, path in given.items()}
    text = json.dumps(summary, indent=1) + "\n"
    print(text, end="")
    if args.out is not None:
        write_text(args.out, text)
        print(f"wrote {args.out}")
    return 0
