"""``ctxrl model``: list the registry, get a model folder.

ctxrl model list
ctxrl model get smollm2-135m-instruct --out runs/smol [--force]
ctxrl model get tiny --out runs/tiny
"""

from __future__ import annotations

import argparse
import time

from ctxrl.errors import UsageError


def run_model(args: argparse.Namespace) -> int:
    """Dispatch ``ctxrl model list`` / ``ctxrl model get``; returns the exit status."""
    from ctxrl.train.models import MODELS

    if args.model_command == "list":
        width = max(len(name) for name in MODELS)
        for name, entry in MODELS.items():
            print(f"{name:<{width}}  {entry.summary}")
            if entry.notes:
                print(f"{'':<{width}}  {entry.notes}")
        return 0
    if args.model_command == "get":
        return _get(args)
    raise UsageError(f"unknown model command {args.model_command!r}")


def _get(args: argparse.Namespace) -> int:
    from ctxrl.train.models import MODELS, geometry, get_model

    if args.name not in MODELS:
        raise UsageError(f"unknown model {args.name!r}; `ctxrl model list` shows {', '.join(MODELS)}")
    t0 = time.perf_counter()
    folder = get_model(
        args.name, args.out, force=args.force, progress=lambda msg: print(f"  {msg}", flush=True)
    )
    geo = geometry(folder)
    print(
        f"{args.name} ready in {folder} ({time.perf_counter() - t0:.1f} s): {geo.n_layers} layers, "
        f"{geo.n_body / 1e6:.1f} M non-embedding parameters"
    )
    return 0
