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
from typing import Literal


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
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ctxrl.commands.bench_train import GRPO_SAMPLING, decode_passes, matmul_flops_per_s, rollout_flops
    from ctxrl.env.tasks.registry import make_task
    from ctxrl.env.tokenizer import load_tokenizer_dir
    from ctxrl.train.engines import EngineConfig, make_engine
    from ctxrl.train.models import get_model
    from ctxrl.train.rollout import RolloutConfig, rollout

    sizes = QUICK if getattr(args, "quick", False) else FULL
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="ctxrl-bench-inflight-") as name:
        model_dir = get_model(sizes.model, Path(name) / "model" if sizes.model == "tiny" else None)
        tokenizer = load_tokenizer_dir(model_dir)
        with torch.device("meta"):  # the geometry prices the FLOPs; no weights needed
            shape = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
        engine = make_engine(
            EngineConfig(name=sizes.engine, max_model_len=4096, dtype=sizes.dtype, compile=sizes.compile),
            model_dir,
            tokenizer=tokenizer,
        )
        try:
            first_task = 0
            for groups in sizes.groups:
                tasks = [
                    make_task("retention", first_task + i, "short", split="train") for i in range(groups)
                ]
                first_task += groups
                config = RolloutConfig(
                    group_size=sizes.group_size,
                    mode="file",
                    max_steps=sizes.max_steps,
                    workers=groups * sizes.group_size,
                )
                start = time.perf_counter()
                result = rollout(
                    engine,
                    tokenizer,
                    tasks,
                    config,
                    sampling=replace(GRPO_SAMPLING, max_new_tokens=sizes.max_new_tokens),
                )
                wall = time.perf_counter() - start
                n = groups * sizes.group_size
                passes = decode_passes(result.episodes)
                figures[f"inflight_{n}_flops"] = rollout_flops(result.episodes, shape)
                figures[f"inflight_{n}_rollout_s"] = wall
                figures[f"inflight_{n}_decode_passes"] = float(passes)
                figures[f"inflight_{n}_ms_per_pass"] = 1000.0 * wall / max(passes, 1)
                figures[f"inflight_{n}_generated_tokens"] = float(result.stats.generated_tokens)
                print(f"inflight bench: {n} episodes in {wall:.1f} s, {passes} decode passes", flush=True)
        finally:
            engine.close()
    matmul = matmul_flops_per_s(sizes.matmul_n)
    counts = [g * sizes.group_size for g in sizes.groups]
    for n in counts:
        flops = figures.pop(f"inflight_{n}_flops")
        figures[f"inflight_{n}_rollout_flops_efficiency"] = (
            flops / figures[f"inflight_{n}_rollout_s"] / matmul
        )
    figures["matmul_gflops"] = matmul / 1e9
    figures["inflight_gain"] = (
        figures[f"inflight_{counts[-1]}_rollout_flops_efficiency"]
        / figures[f"inflight_{counts[0]}_rollout_flops_efficiency"]
    )
    return figures
