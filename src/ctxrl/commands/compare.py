"""``ctxrl compare``: the paired comparison of policies evaluated on the same held-out tasks.

    ctxrl compare runs/eval_sft runs/eval_grpo runs/eval_grpo_w0 --out docs/results/learning/summary.json
    ctxrl compare final_start final_wide,final_wide_s1,final_wide_s2 final_wide_w0   # a pool of replicates

See :mod:`ctxrl.train.compare` for the figures and tests.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ctxrl.train.compare import Pool


def folders(slot: Path) -> list[Path]:
    """The eval folders one argument names: itself, or a comma-separated list of replicates' folders (a folder
    whose own name holds a comma is taken whole when it exists)."""
    if slot.exists() or "," not in str(slot):
        return [slot]
    return [Path(part) for part in str(slot).split(",") if part]


def load_slot(slot: Path) -> Pool:
    """One compared policy: the evaluations its argument names, pooled."""
    from ctxrl.train.compare import Pool, load_outcomes

    return Pool(tuple(load_outcomes(folder) for folder in folders(slot)))


def run_compare(args: argparse.Namespace) -> int:
    """Entry point of ``ctxrl compare``: print the summary, and write it with ``--out``."""
    from ctxrl.commands.common import check_writable_file, write_text
    from ctxrl.train.compare import compare

    if args.out is not None:
        check_writable_file(args.out)
    start, trained = load_slot(args.start), load_slot(args.trained)
    ablation = load_slot(args.ablation) if args.ablation is not None else None
    summary = compare(start, trained, ablation)
    # which evaluation each key of the summary is, as given (a folder may hold several summaries); a pool's
    # folders as a list
    given = {"sft": args.start, "grpo": args.trained, "grpo_w0": args.ablation}
    summary["compared"] = {key: _named(path) for key, path in given.items()}
    text = json.dumps(summary, indent=1) + "\n"
    print(text, end="")
    if args.out is not None:
        write_text(args.out, text)
        print(f"wrote {args.out}")
    return 0


def _named(slot: Path | None) -> str | list[str] | None:
    if slot is None:
        return None
    parts = folders(slot)
    return str(parts[0]) if len(parts) == 1 else [str(p) for p in parts]
