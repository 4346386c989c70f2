"""``ctxrl bench inflight``: the rollout's FLOP efficiency against the number of sequences in flight.

``ctxrl bench smollm2`` rolls out one group of 8 episodes, and there a decode pass is bound by memory, not by
FLOPs: each pass reads all the weights and every sequence's KV cache to produce one token per sequence
(docs/train_throughput.md). More sequences a pass share the weight reads. This bench measures how far that
goes on this machine: it rolls out 1, 2 and 4 groups of 8 SmolLM2-135M-Instruct episodes (one ``short``
retention task a group, file mode, 256 new tokens an action, sampled as the GRPO configs sample: the
smollm2 bench's group, its engine in bfloat16 and compiled as in ``ctxrl bench smollm2_bf16_compiled``) on one
in-process vLLM engine, one rollout after another, each on tasks of its own, so no rollout starts from
another's cached prompts. For each number ``N`` of episodes:

- ``inflight_<N>_rollout_flops_efficiency``: the rollout's model FLOPs (every call's uncached prompt tokens
  and generated tokens, :func:`~ctxrl.commands.bench_train.rollout_flops`) ÷ its wall time ÷ this machine's
  fp32 matmul rate measured in the same run (``matmul_gflops``): ``rollout_flops_efficiency`` of the smollm2
  bench at ``N`` episodes;
- ``inflight_<N>_rollout_s``: the rollout's wall seconds;
- ``inflight_<N>_decode_passes``: the engine's decode passes (:func:`~ctxrl.commands.bench_train.decode_passes`);
- ``inflight_<N>_ms_per_pass``: wall milliseconds per decode pass (prefill and the harness's steps included);
- ``inflight_<N>_generated_tokens``: tokens generated.

``inflight_gain`` is the largest ``N``'s efficiency ÷ the smallest's. ``--quick``: the tiny model on the
``hf`` engine, 1 and 2 groups of 2 episodes, 2 steps of 16 tokens (says the path works, not what it is worth).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal


@dataclass(frozen=True)
class InflightSizes:
    """One run of the bench: the model and engine, the group, and the numbers of groups rolled out."""

    model: str
    engine: Literal["vllm", "hf"]
    dtype: Literal["bfloat16"] | None
    compile: bool
    group_size: int
    groups: tuple[int, ...]
    max_new_tokens: int
    max_steps: int | None
    matmul_n: int


FULL = InflightSizes("smollm2-135m-instruct", "vllm", "bfloat16", True, 8, (1, 2, 4), 256, None, 1536)
"""8, 16 and 32 episodes in flight: the smollm2 bench's group, the ladder's 2 tasks a step, the wide runs' 4."""
QUICK = InflightSizes("tiny", "hf", None, False, 2, (1, 2), 16, 2, 256)


def bench_inflight(args: argparse.Namespace) -> dict[str, float]:
    """``ctxrl bench inflight``: the figures of the module docstring."""
    from ctxrl.commands.bench_train import GRPO_SAMPLING
    from ctxrl.train.engines import EngineConfig

    sizes = QUICK if getattr(args, "quick", False) else FULL
    engine = EngineConfig(name=sizes.engine, max_model_len=4096, dtype=sizes.dtype, compile=sizes.compile)
    sampling = replace(GRPO_SAMPLING, max_new_tokens=sizes.max_new_tokens)
    return rollouts_in_flight(
        sizes.model, engine, sampling, sizes.group_size, sizes.groups, sizes.max_steps, sizes.matmul_n
    )


def rollouts_in_flight(
    model: str,
    engine_config: Any,
    sampling: Any,
    group_size: int,
    groups: tuple[int, ...],
    max_steps: int | None,
    matmul_n: int,
) -> dict[str, float]:
    """Roll out ``g`` groups of ``group_size`` ``short`` retention episodes for each ``g`` in ``groups``, one
    rollout after another on one engine (``engine_config``, on ``model``: a registry name or a folder), each on
    task seeds of its own; the figures of the module docstring. ``scripts/probe_rollout.py`` calls it with other
    engine and sampling settings."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ctxrl.commands.bench_train import decode_passes, matmul_flops_per_s, rollout_flops
    from ctxrl.env.tasks.registry import make_task
    from ctxrl.env.tokenizer import load_tokenizer_dir
    from ctxrl.train.engines import make_engine
    from ctxrl.train.models import get_model
    from ctxrl.train.rollout import RolloutConfig, rollout

    figures: dict[str, float] = {}
    flops: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="ctxrl-bench-inflight-") as name:
        model_dir = get_model(model, Path(name) / "model" if model == "tiny" else None)
        tokenizer = load_tokenizer_dir(model_dir)
        with torch.device("meta"):  # the geometry prices the FLOPs; no weights needed
            shape = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
        engine = make_engine(engine_config, model_dir, tokenizer=tokenizer)
        try:
            first_task = 0
            for g in groups:
                tasks = [make_task("retention", first_task + i, "short", split="train") for i in range(g)]
                first_task += g
                n = g * group_size
                config = RolloutConfig(group_size=group_size, mode="file", max_steps=max_steps, workers=n)
                start = time.perf_counter()
                result = rollout(engine, tokenizer, tasks, config, sampling=sampling)
                wall = time.perf_counter() - start
                passes = decode_passes(result.episodes)
                flops[n] = rollout_flops(result.episodes, shape)
                figures[f"inflight_{n}_rollout_s"] = wall
                figures[f"inflight_{n}_decode_passes"] = float(passes)
                figures[f"inflight_{n}_ms_per_pass"] = 1000.0 * wall / max(passes, 1)
                figures[f"inflight_{n}_generated_tokens"] = float(result.stats.generated_tokens)
                print(f"inflight bench: {n} episodes in {wall:.1f} s, {passes} decode passes", flush=True)
        finally:
            engine.close()
    matmul = matmul_flops_per_s(matmul_n)
    for n, done in flops.items():
        figures[f"inflight_{n}_rollout_flops_efficiency"] = done / figures[f"inflight_{n}_rollout_s"] / matmul
    figures["matmul_gflops"] = matmul / 1e9
    first, last = min(flops), max(flops)
    figures["inflight_gain"] = (
        figures[f"inflight_{last}_rollout_flops_efficiency"]
        / figures[f"inflight_{first}_rollout_flops_efficiency"]
    )
    return figures
