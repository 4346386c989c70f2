"""The processes of a training run: the accelerator, DeepSpeed's settings, when gradients all-reduce.

Without CUDA, ``accelerate launch --multi_gpu`` (or ``torchrun``) ranks are gloo processes on the CPU; the
trainer's loop is the same in one process and in many (:mod:`ctxrl.train.grpo`).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from ctxrl.train.config import TrainConfig


def make_accelerator() -> Any:
    """The accelerate ``Accelerator`` of this process (CPU where no CUDA device exists).

    Without CUDA, ``accelerate launch --multi_gpu`` (or ``torchrun``) ranks become gloo processes on the CPU.
    DeepSpeed on the CPU needs two things accelerate does not do by itself: ``cpu=True`` would switch
    DeepSpeed off, and without a device accelerate finds no process-group backend (every rank would then
    believe it is rank 0 of 1), so the backend is named: gloo.
    """
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    if torch.cuda.is_available():
        return Accelerator()
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        return Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
    return Accelerator(cpu=True)


def configure_deepspeed(acc: Any, config: TrainConfig) -> None:
    """Under DeepSpeed: one microbatch per forward (the trainer batches by token budget itself, with no
    dataloader for accelerate to read a batch size from) and the trainer's ``max_grad_norm`` as DeepSpeed's
    clipping, since DeepSpeed clips inside its own step."""
    plugin = getattr(acc.state, "deepspeed_plugin", None)
    if plugin is None:
        return
    ds = plugin.deepspeed_config
    if ds.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        ds["train_micro_batch_size_per_gpu"] = 1
    ds["gradient_accumulation_steps"] = 1
    ds["gradient_clipping"] = config.max_grad_norm or 0.0


def sync_context(acc: Any, model: Any, last: bool) -> Any:
    """DDP all-reduces on the last backward of an update only; DeepSpeed steps its engine at the boundary."""
    acc.sync_gradients = last
    return contextlib.nullcontext() if last else acc.no_sync(model)
