"""Checkpoints of a GRPO run: written atomically, read back for an exact resume (the layout:
:mod:`ctxrl.train.run_folder`)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctxrl.errors import UsageError
from ctxrl.train.config import TrainConfig
from ctxrl.train.run_folder import ADAPTER_WEIGHTS, CHECKPOINTS, LATEST, latest_checkpoint

EARLIER = f"write an earlier step's folder name into {CHECKPOINTS}/{LATEST} to resume from there"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_sha256(policy: Any) -> str:
    """SHA-256 over the names, dtypes, shapes and bytes of the trainable parameters (in parameter order): equal
    on two ranks exactly when their trainable weights are bit-for-bit equal."""
    digest = hashlib.sha256()
    for name, p in policy.named_parameters():
        if p.requires_grad:
            t = p.detach().cpu().contiguous()
            digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def trainable_state(policy: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu().clone() for n, p in policy.named_parameters() if p.requires_grad}


def save_checkpoint(
    out: Path,
    step: int,
    policy: Any,
    optimizer: Any,
    acc: Any,
    config: TrainConfig,
    *,
    graded: bool | None = None,
) -> Path:
    """Write ``out/checkpoints/step-NNNNNN`` atomically (temporary folder, then rename) and point ``latest``
    at it. Holds ``model/`` (``save_pretrained``: the full model, or the adapter with LoRA), the trainable
    tensors and optimiser state for exact resume, every rank's RNG states, the step, whether the next step's
    task reward is graded (:attr:`TrainConfig.graded_until`) and the run config."""
    root = out / CHECKPOINTS
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.tmp"
    if acc.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        policy.save_pretrained(tmp / "model")
        torch.save(trainable_state(policy), tmp / "trainable.pt")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "state.json").write_text(
            json.dumps(
                {
                    "step": step,
                    "graded": config.reward.graded if graded is None else graded,
                    "config": asdict(config),
                },
                indent=1,
                default=str,
            )
        )
    acc.wait_for_everyone()
    torch.save(rng_state(), tmp / f"rng-{acc.process_index}.pt")
    acc.wait_for_everyone()
    if acc.is_main_process:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        pointer = root / f".{LATEST}.tmp"
        pointer.write_text(final.name)
        os.replace(pointer, root / LATEST)
    acc.wait_for_everyone()
    return final


def load_checkpoint(out: Path, policy: Any, optimizer: Any, rank: int) -> dict[str, Any]:
    """Restore the latest checkpoint under ``out`` into ``policy`` and ``optimizer`` and this rank's RNG (a
    kept checkpoint, :mod:`ctxrl.train.keep`: the adapter from ``model/``, fresh AdamW moments); returns its
    ``state.json`` (``step``: the steps already done; ``graded``: whether the next step's task
    reward is graded). Raises :class:`UsageError` when there is none."""
    root = out / CHECKPOINTS
    if not (root / LATEST).exists():
        raise UsageError(f"nothing to resume: {root / LATEST} does not exist (start without resume)")
    ckpt = latest_checkpoint(out)
    if (ckpt / "trainable.pt").is_file():
        trainable = _load(ckpt / "trainable.pt", weights_only=True)
        params = dict(policy.named_parameters())
        missing = [n for n in trainable if n not in params]
        if missing:
            raise UsageError(
                f"{ckpt} does not match the model (no parameter {missing[0]}); same model and lora?"
            )
        shapes = [n for n, t in trainable.items() if tuple(t.shape) != tuple(params[n].shape)]
        if shapes:
            name = shapes[0]
            raise UsageError(
                f"{ckpt} does not match the model: {name} is {tuple(trainable[name].shape)} there, "
                f"{tuple(params[name].shape)} here; same model and lora?"
            )
        with torch.no_grad():
            for name, tensor in trainable.items():
                params[name].copy_(tensor)
    else:  # a kept checkpoint (ctxrl.train.keep): the adapter alone, in bf16
        load_kept_adapter(policy, ckpt / "model")
    if (ckpt / "optimizer.pt").is_file():
        optimizer.load_state_dict(_load(ckpt / "optimizer.pt", weights_only=False))
    elif rank == 0:
        print(f"resuming {ckpt} without optimizer.pt (a kept run): AdamW's moments start at zero", flush=True)
    rng = ckpt / f"rng-{rank}.pt"
    if rng.exists():
        set_rng_state(_load(rng, weights_only=False))
    try:
        state: dict[str, Any] = json.loads((ckpt / "state.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{ckpt / 'state.json'} cannot be read ({exc}); {EARLIER}") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise UsageError(f"{ckpt / 'state.json'} holds no step number; {EARLIER}")
    return state


def _load(path: Path, *, weights_only: bool) -> Any:
    """``torch.load``, with a damaged file (a run killed while copying its folder, a disk error) a
    UsageError naming it. A checkpoint written by this module is whole or absent: ``latest`` moves only
    after every file of it is in place."""
    try:
        return torch.load(path, weights_only=weights_only)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as exc:
        raise UsageError(f"{path} cannot be read ({str(exc).splitlines()[0][:200]}); {EARLIER}") from None


def load_kept_adapter(policy: Any, model_dir: Path) -> None:
    """Load the adapter weights saved in ``model_dir`` into the peft ``policy`` (a kept checkpoint has no
    ``trainable.pt``); a UsageError when they do not fit the policy."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = model_dir / ADAPTER_WEIGHTS
    if not weights.is_file() or not hasattr(policy, "peft_config"):
        raise UsageError(
            f"{model_dir.parent} has no trainable.pt, and {weights} is no adapter of this LoRA policy to resume from"
        )
    result = set_peft_model_state_dict(policy, load_file(str(weights)))
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise UsageError(
            f"{weights} does not match the model (no parameter {unexpected[0]}); same model and lora?"
        )
