"""``ctxrl train``: stepwise GRPO of a model on built-in tasks (:mod:`ctxrl.train.grpo`).

    ctxrl train --config configs/train_tiny.yaml --out runs/train                 # the tiny model, on CPU
    ctxrl train --config configs/train_tiny.yaml train.steps=50 train.lr=1e-4 --out runs/t --overwrite
    ctxrl train --out runs/train --resume        # continue a killed run, with the config.yaml stored in it
    accelerate launch --config_file configs/accelerate/ddp.yaml -m ctxrl.cli train ...   # several ranks

Writes into ``--out``: ``config.yaml`` (the resolved run config), ``metrics.jsonl`` (one line per step, keys
``rollout/``, ``reward/``, ``loss/``, ``cost/``, ``time/``), ``checkpoints/`` and, with
``train.tracker=wandb``, an offline wandb run in ``wandb/``. Without ``model`` the tiny model is built into
``<out>/model``. Settings that do not fit together (``rollout.group_size=1``, more updates than episodes) are
a one-line error before the model loads or the engine starts.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from ctxrl.commands.common import (
    build_engine,
    prepare_out,
    resolve_model,
    resumed_run_config,
    run_config,
    save_config,
)
from ctxrl.commands.config import RunConfig, to_dict
from ctxrl.errors import UsageError
from ctxrl.train.engines import engine_spec

RESUMABLE_CHANGES = (
    "model",
    "train.steps",
    "train.save_every",
    "train.log_every",
    "train.tracker",
    "train.wandb_project",
    "train.compile",
    "train.packing",
    "train.max_tokens_per_microbatch",
    "train.recompute_prefixes",
    "train.two_part_attention",
    "engine.compile",
    "engine.server_url",
    "engine.server_port",
    "engine.startup_timeout_s",
    "engine.request_timeout_s",
    "engine.retries",
)
"""Keys ``--resume`` may change: where the model folder is now (the checkpoint is checked against its shapes),
how long the run goes, its bookkeeping, where its server is, and switches that change the speed of a step but
not its result (the layout of the update is exact in every packing)."""


def run_train(args: argparse.Namespace) -> int:
    """Entry point of ``ctxrl train`` (see the module docstring)."""
    if args.resume and (args.out / "config.yaml").is_file():
        config = resumed_run_config(args, args.out, RESUMABLE_CHANGES)
    else:
        config = run_config(args)
    train_command(config, args.out, overwrite=args.overwrite, resume=args.resume)
    return 0


def check_train_config(config: RunConfig) -> None:
    """The settings training cannot run with, as a one-line error before anything loads: a group of one,
    more updates than episodes (:func:`ctxrl.train.grpo.check_setup`), an engine that does not sample from
    the trained weights."""
    from ctxrl.train.grpo import check_setup

    check_setup(config.train, config.rollout, config.tasks.count)
    if not engine_spec(config.engine.name).loads_weights(config.engine):
        raise UsageError(
            "training needs an engine that samples from the trained weights; set engine.name=vllm or hf"
        )


def train_command(config: RunConfig, out: Path, *, overwrite: bool = False, resume: bool = False) -> Any:
    """Train as ``config`` says into the run folder ``out``; returns the :class:`TrainResult`.

    Under ``accelerate launch`` the main rank prepares the folder (and builds the tiny model) while the
    others wait; every rank then builds its own engine, seeded ``engine.seed + rank``.
    """
    from ctxrl.train.distributed import make_accelerator
    from ctxrl.train.grpo import TaskBatches, train

    check_train_config(config)
    if resume and overwrite:
        raise UsageError("--resume continues the run in --out; --overwrite would erase it: pass one of them")
    if resume and not (out / "config.yaml").is_file():
        raise UsageError(f"nothing to resume in {out} (no config.yaml); start the run without --resume")
    acc = make_accelerator()
    if acc.is_main_process:
        if not resume:
            prepare_out(out, overwrite=overwrite, inputs=[config.model])
            save_config(config, out)
        resolve_model(config, out)  # builds the tiny model once, before the other ranks look for it
    acc.wait_for_everyone()
    folder, tokenizer, _ = resolve_model(config, out)
    assert folder is not None  # only a scripted engine runs without a model folder
    engine_config = replace(config.engine, seed=config.engine.seed + acc.process_index)
    engine = build_engine(replace(config, engine=engine_config), folder, tokenizer)
    tc = config.tasks
    try:
        return train(
            config.train,
            model_dir=folder,
            engine=engine,
            tokenizer=tokenizer,
            tasks=TaskBatches(tc.families, tc.split, tc.difficulty, tc.count),
            rollout_config=config.rollout,
            advantages=config.advantages,
            harness=config.harness,
            sampling=config.sampling,
            out=out,
            resume=resume,
            accelerator=acc,
            run_config=to_dict(config),
        )
    finally:
        engine.close()
