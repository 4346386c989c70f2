"""``ctxrl tiny-model``: build the tiny offline model and tokenizer into a folder."""

from __future__ import annotations

import argparse
import time

from ctxrl.errors import UsageError


def run_tiny_model(args: argparse.Namespace) -> int:
    """Entry point of ``ctxrl tiny-model``."""
    from ctxrl.train.tiny_model import build_tiny_model

    if not 0 <= args.seed < 2**32:  # what torch and numpy take
        raise UsageError(f"--seed must be an integer from 0 to {2**32 - 1}, not {args.seed}")
    t0 = time.perf_counter()
    try:
        out = build_tiny_model(args.out, seed=args.seed, force=args.force)
    except OSError as exc:
        raise UsageError(f"cannot write the tiny model to {args.out}: {exc.strerror or exc}") from None
    size = sum(f.stat().st_size for f in out.iterdir()) / 1e6
    print(
        f"tiny model (seed {args.seed}) written to {out} ({size:.1f} MB) in {time.perf_counter() - t0:.1f} s"
    )
    return 0
