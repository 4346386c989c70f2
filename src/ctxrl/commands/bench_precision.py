"""``ctxrl bench precision``: bfloat16 against float32 on this machine, for the two halves of a GRPO step.

Every figure is a ratio of two runs of the same work side by side in one bench run, float32 ÷ bfloat16
wall time (above 1: bfloat16 is faster), or the size of the difference bfloat16 makes:

- ``bf16_matmul_speedup``: a ``T × width`` by ``width × 4·width`` product (the shape of the model's MLP at
  ``T`` tokens), best of three (:func:`ctxrl.commands.bench_train.matmul_flops_per_s`); ``matmul_fp32_gflops`` / ``matmul_bf16_gflops`` the rates.
- ``bf16_update_speedup``: the trainer's own backward pass (:func:`ctxrl.train.update.nll_backward` on the
  shared-prefix layout) over one group of rows, the model with a LoRA adapter loaded in each dtype
  (``train.dtype``), median of three.
- ``bf16_logprob_abs_diff_mean`` / ``_max``: how far the bfloat16 model's logprobs of the loss tokens of those
  rows are from the float32 model's (nats): the noise a bfloat16 trainer adds to every importance ratio.
- ``autocast_update_speedup``, ``autocast_logprob_abs_diff_mean`` / ``_max``: the same for the float32 model
  under bfloat16 autocast (``train.mixed_precision: bf16``: float32 weights, gradients and optimiser).
- ``bf16_rollout_speedup``: the in-process ``vllm`` engine (``engine.dtype``) generating for a group of
  prompts that share a long prefix, several turns each, prefix caching on; each dtype in its own process.

Full run: SmolLM2-135M-Instruct, 8 rows / prompts of ~1.5k tokens sharing a 1.3k-token prefix, 64 new tokens
a turn for 6 turns. ``--quick``: the tiny model on small sizes (says the path works, not what it saves).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PrecisionSizes:
    model: str
    """A registry name, or ``tiny`` (built into the bench's temporary folder)."""
    rows: int
    prefix_tokens: int
    suffix_tokens: int
    loss_tokens: int
    new_tokens: int
    turns: int
    repeats: int


FULL = PrecisionSizes("smollm2-135m-instruct", 8, 1300, 200, 64, 64, 6, 3)
QUICK = PrecisionSizes("tiny", 2, 64, 16, 8, 8, 2, 1)

DTYPES = ("float32", "bfloat16")
UPDATE_ARMS = {"fp32": ("float32", "no"), "bf16": ("bfloat16", "no"), "autocast": ("float32", "bf16")}
"""The update's arms, by the name their figures carry: (``train.dtype``, ``train.mixed_precision``)."""


def _rows(sizes: PrecisionSizes, vocab: int) -> list[Any]:
    """One group of rows that share a prefix, the loss on each row's last ``loss_tokens``."""
    import random

    from ctxrl.train.rows import Row

    rng = random.Random(0)
    prefix = [rng.randrange(100, vocab) for _ in range(sizes.prefix_tokens)]
    rows = []
    for i in range(sizes.rows):
        ids = prefix + [rng.randrange(100, vocab) for _ in range(sizes.suffix_tokens)]
        n = len(ids)
        mask = [0] * (n - sizes.loss_tokens) + [1] * sizes.loss_tokens
        rows.append(Row(ids, mask, [0.0] * n, [0.0] * n, [0] * n, [(n - sizes.loss_tokens, n)], i, 0, (0,)))
    return rows


def _update(model_dir: Path, sizes: PrecisionSizes) -> dict[str, float]:
    """Median seconds of the trainer's backward in each of :data:`UPDATE_ARMS`, and each bfloat16 arm's
    logprob error against float32's."""
    import torch

    from ctxrl.env.tokenizer import load_tokenizer_dir
    from ctxrl.train.config import LoraSettings, TrainConfig
    from ctxrl.train.policy import load_policy
    from ctxrl.train.update import layout_logprobs, layout_sizes, make_layout, nll_backward, precision_context

    pad_id = int(load_tokenizer_dir(model_dir).pad_token_id or 0)
    seconds: dict[str, float] = {}
    logprobs: dict[str, torch.Tensor] = {}
    figures: dict[str, float] = {}
    for arm, (dtype, mixed) in UPDATE_ARMS.items():
        config = TrainConfig(lora=LoraSettings(enabled=True, dropout=0.0), dtype=dtype, mixed_precision=mixed)  # type: ignore[arg-type]
        model = load_policy(model_dir, config).train()
        rows = _rows(sizes, int(model.config.vocab_size))
        units = make_layout(rows, "shared", 8192, pad_id, layout_sizes(model), packs=False)
        n_loss = float(sum(r.num_loss_tokens for r in rows))
        with precision_context(mixed, "cpu"):
            nll_backward(model, units, num_loss_tokens=n_loss)  # warm-up
            times = []
            for _ in range(sizes.repeats):
                model.zero_grad(set_to_none=True)
                start = time.perf_counter()
                nll_backward(model, units, num_loss_tokens=n_loss)
                times.append(time.perf_counter() - start)
            # the same rows give the same layout in every arm: its microbatches line up one to one
            per_batch = layout_logprobs(model, units, torch.device("cpu"))
        seconds[arm] = statistics.median(times)
        logprobs[arm] = torch.cat([lp.double().reshape(-1) for unit in per_batch for lp in unit])
        figures[f"update_{arm}_s"] = seconds[arm]
    at_loss = logprobs["fp32"] != 0  # every other position is 0 (no logit is taken there)
    for arm in ("bf16", "autocast"):
        diff = (logprobs[arm] - logprobs["fp32"])[at_loss].abs()
        figures[f"{arm}_update_speedup"] = seconds["fp32"] / seconds[arm]
        figures[f"{arm}_logprob_abs_diff_mean"] = float(diff.mean())
        figures[f"{arm}_logprob_abs_diff_max"] = float(diff.max())
    return figures


def rollout_work(
    model_dir: str, sizes: PrecisionSizes, dtype: str | None = None, llm_kwargs: dict[str, Any] | None = None
) -> dict[str, float]:
    """Wall ``seconds`` and model ``flops`` of the in-process ``vllm`` engine generating ``sizes.turns`` turns
    for ``sizes.rows`` prompts that share a prefix (each turn appends the completion and a short observation).

    The engine is built as a run builds it (``engine.dtype``); ``llm_kwargs`` are further ``vllm.LLM``
    settings (``ctxrl bench engine``). FLOPs count every call's prefilled (not cached) and generated tokens
    through the body and attention, plus the LM head at each generated token."""
    import random

    from ctxrl.rewards.cost import ModelGeometry, StepTokens, step_flops
    from ctxrl.train.engines import EngineConfig, SamplingConfig, make_engine
    from ctxrl.train.engines.vllm_engine import VLLMEngine

    config = json.loads((Path(model_dir) / "config.json").read_text())
    geometry = ModelGeometry.from_config(config)
    head = int(config["vocab_size"]) * int(config["hidden_size"])
    engine: Any
    if llm_kwargs:
        engine = VLLMEngine.load(Path(model_dir), max_model_len=4096, dtype=dtype, **llm_kwargs)
    else:
        engine = make_engine(EngineConfig(name="vllm", dtype=dtype, max_model_len=4096), Path(model_dir))  # type: ignore[arg-type]
    try:
        running = str(engine.llm.llm_engine.model_config.dtype).removeprefix("torch.")
        if dtype is not None and running != dtype:
            raise RuntimeError(f"engine.dtype={dtype} started a {running} engine")
        parts = vars(engine.llm.llm_engine.vllm_config).values()
        for key, want in (llm_kwargs or {}).items():
            found = [getattr(part, key) for part in parts if hasattr(part, key)]
            if not found or any(value != want for value in found):
                raise RuntimeError(f"vllm.LLM({key}={want!r}) started an engine with {key} = {found}")
        vocab = int(engine.vocab_size)
        rng = random.Random(0)
        prefix = [rng.randrange(100, vocab) for _ in range(sizes.prefix_tokens)]
        prompts = [
            prefix + [rng.randrange(100, vocab) for _ in range(sizes.suffix_tokens)]
            for _ in range(sizes.rows)
        ]
        sampling = SamplingConfig(max_new_tokens=sizes.new_tokens, ignore_eos=True)
        engine.generate(prompts[:1], SamplingConfig(max_new_tokens=2, ignore_eos=True))  # warm-up
        flops = 0.0
        start = time.perf_counter()
        for _ in range(sizes.turns):
            outs = engine.generate(prompts, sampling)
            for p, o in zip(prompts, outs, strict=True):
                tokens = StepTokens(len(p), o.num_cached_tokens, len(o.token_ids))
                flops += step_flops(tokens, geometry) + 2.0 * head * len(o.token_ids)
            prompts = [
                p + list(o.token_ids) + [rng.randrange(100, vocab) for _ in range(16)]
                for p, o in zip(prompts, outs, strict=True)
            ]
        return {"seconds": time.perf_counter() - start, "flops": flops}
    finally:
        engine.close()


def rollout_in_subprocess(
    model_dir: Path,
    quick: bool,
    *,
    dtype: str | None = None,
    llm_kwargs: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    what: str = "rollout",
) -> dict[str, float]:
    """:func:`rollout_work` in a fresh process (one vLLM engine per process, none left in this one), with
    ``env`` added to this process's environment."""
    import os

    code = (
        "import json, os, sys\n"
        "from ctxrl.commands.bench_precision import FULL, QUICK, rollout_work\n"
        "a = json.loads(sys.argv[1])\n"
        "assert all(os.environ.get(k) == v for k, v in a['env'].items()), 'the environment did not arrive'\n"
        "r = rollout_work(a['model'], QUICK if a['quick'] else FULL, a['dtype'], a['llm_kwargs'])\n"
        "print('RESULT', json.dumps(r))\n"
    )
    spec = {
        "model": str(model_dir),
        "quick": quick,
        "dtype": dtype,
        "llm_kwargs": llm_kwargs or {},
        "env": env or {},
    }
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
        env={**os.environ, **(env or {})},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"the {what} failed (exit {done.returncode}): " + " | ".join(tail))
    result: dict[str, float] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def bench_precision(args: argparse.Namespace) -> dict[str, float]:
    """``ctxrl bench precision``: the figures of the module docstring."""
    import torch

    from ctxrl.commands.bench_train import matmul_flops_per_s
    from ctxrl.train.models import get_model
    from ctxrl.train.tiny_model import build_tiny_model

    quick = bool(getattr(args, "quick", False))
    sizes = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="ctxrl-bench-precision-") as name:
        tmp = Path(name)
        model_dir = (
            build_tiny_model(tmp / "model", seed=0) if sizes.model == "tiny" else get_model(sizes.model)
        )
        width = int(json.loads((Path(model_dir) / "config.json").read_text())["hidden_size"])
        tokens = sizes.prefix_tokens + sizes.suffix_tokens
        fp32 = matmul_flops_per_s(4 * width, shape=(tokens, width), dtype=torch.float32)
        bf16 = matmul_flops_per_s(4 * width, shape=(tokens, width), dtype=torch.bfloat16)
        figures = {
            "bf16_matmul_speedup": bf16 / fp32,
            "matmul_fp32_gflops": fp32 / 1e9,
            "matmul_bf16_gflops": bf16 / 1e9,
        }
        figures.update(_update(Path(model_dir), sizes))
        rollout = {
            dtype: rollout_in_subprocess(Path(model_dir), quick, dtype=dtype, what=f"{dtype} rollout")[
                "seconds"
            ]
            for dtype in DTYPES
        }
        figures["bf16_rollout_speedup"] = rollout["float32"] / rollout["bfloat16"]
        figures["rollout_fp32_s"] = rollout["float32"]
        figures["rollout_bf16_s"] = rollout["bfloat16"]
    return figures
