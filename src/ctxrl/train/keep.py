"""A LoRA training run slimmed to what a later session needs to go on: small enough to commit.

    python -m ctxrl.train.keep runs/ladder/grpo docs/results/learning/grpo             # keep
    python -m ctxrl.train.keep --restore docs/results/learning/grpo runs/ladder/grpo   # and bring back

On a 2-core machine a GRPO run spans sessions, and between sessions only what is committed survives. The kept
folder holds the run's ``config.yaml`` and ``metrics.jsonl`` and its latest checkpoint without the two large
files (``trainable.pt``, ``optimizer.pt``): ``model/`` (the LoRA adapter, in bf16: about 10 MB for SmolLM2-135M
at r = 16), ``state.json`` and the RNG states. Restored, ``ctxrl train --resume`` continues from it: the
adapter's weights load from ``model/`` (bf16-rounded) and AdamW's moments start at zero, which the resume
prints; the step, the graded-reward switch and the RNG states are exact. ``ctxrl export --run`` works on a
restored run as on any other. A full-model run cannot be kept this way (its weights are the whole model).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from ctxrl.errors import CtxrlError, UsageError
from ctxrl.train.run_folder import ADAPTER_WEIGHTS, CHECKPOINTS, LATEST, latest_checkpoint

RUN_FILES = ("config.yaml", "metrics.jsonl")


def keep_run(run: Path, dest: Path) -> Path:
    """Write the slim copy of ``run`` (see the module doc) to ``dest``, replacing what was kept there before;
    returns the kept checkpoint folder."""
    import torch
    from safetensors.torch import load_file, save_file

    run, dest = Path(run), Path(dest)
    ckpt = latest_checkpoint(run)
    weights = ckpt / "model" / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise UsageError(f"{ckpt / 'model'} holds no LoRA adapter; only a LoRA run can be kept")
    tmp = dest.with_name(f".{dest.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    kept = tmp / CHECKPOINTS / ckpt.name
    kept.mkdir(parents=True)
    for name in RUN_FILES:
        if (run / name).is_file():
            shutil.copy2(run / name, tmp / name)
    shutil.copytree(
        ckpt / "model", kept / "model", ignore=shutil.ignore_patterns("README.md")
    )  # peft's blank card
    state = {k: t.to(torch.bfloat16).contiguous() for k, t in load_file(str(weights)).items()}
    save_file(state, str(kept / "model" / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    for path in ckpt.iterdir():
        if path.name == "state.json" or (path.name.startswith("rng-") and path.suffix == ".pt"):
            shutil.copy2(path, kept / path.name)
    (tmp / CHECKPOINTS / LATEST).write_text(ckpt.name, encoding="utf-8")
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp.replace(dest)
    return dest / CHECKPOINTS / ckpt.name


def restore_run(kept: Path, run: Path) -> Path:
    """Copy a kept run into ``run`` (which must not exist yet) for ``ctxrl train --resume``; returns ``run``."""
    kept, run = Path(kept), Path(run)
    latest_checkpoint(kept)
    if run.exists():
        raise UsageError(f"{run} exists; restore a kept run into a new folder")
    shutil.copytree(kept, run)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ctxrl.train.keep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--restore", action="store_true", help="copy the kept SOURCE back into the run DEST")
    parser.add_argument("source", type=Path, help="the run folder (or, with --restore, the kept folder)")
    parser.add_argument("dest", type=Path, help="the kept folder (or, with --restore, the new run folder)")
    args = parser.parse_args(argv)
    try:
        if args.restore:
            print(f"restored {restore_run(args.source, args.dest)} from {args.source}")
        else:
            folder = keep_run(args.source, args.dest)
            step = json.loads((folder / "state.json").read_text(encoding="utf-8")).get("step")
            print(f"kept {args.source} (step {step}) in {args.dest}")
    except CtxrlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
