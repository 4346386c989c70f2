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

``inflight_gain`` is the largest ``N``'s efficiency ÷ the smallest's.

Then one more group of 8 at 64 new tokens an action, the rollout case issue 22 states its target on ("8
SmolLM2 episodes of ``short`` retention in file mode on the in-process vLLM engine, 64 new tokens per action,
10 steps"), on tasks of its own: the same five figures, named ``inflight_8_new_tokens_64_*``. At 256 new
tokens the base model writes to the limit in every step, so its rollout is mostly decode passes, which memory
bounds; at 64 the same steps hold a larger share of prefill (the SFT start, which ends its actions with a tool
call, writes 31–41 tokens a step in the learning runs).

``--quick``: the tiny model on the ``hf`` engine, 1 and 2 groups of 2 episodes, 2 steps of 16 tokens, then 1
group at 8 tokens (says the path works, not what it is worth).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
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
    short_new_tokens: int
    """New tokens an action of the last rollout: one group, issue 22's stated case."""


FULL = InflightSizes("smollm2-135m-instruct", "vllm", "bfloat16", True, 8, (1, 2, 4), 256, None, 1536, 64)
"""8, 16 and 32 episodes in flight: the smollm2 bench's group, the ladder's 2 tasks a step, the wide runs' 4;
then 8 at 64 new tokens an action."""
QUICK = InflightSizes("tiny", "hf", None, False, 2, (1, 2), 16, 2, 256, 8)


@dataclass(frozen=True)
class InflightRun:
    """One rollout of the bench: ``groups`` groups, sampled with ``sampling``."""

    groups: int
    sampling: Any
    by_new_tokens: bool = False
    """Name its figures by its new tokens an action too: ``inflight_<N>_new_tokens_<T>_*``."""

    def label(self, group_size: int) -> str:
        n = self.groups * group_size
        return (
            f"inflight_{n}_new_tokens_{self.sampling.max_new_tokens}"
            if self.by_new_tokens
            else f"inflight_{n}"
        )


def bench_inflight(args: argparse.Namespace) -> dict[str, float]:
    """``ctxrl bench inflight``: the figures of the module docstring."""
    from ctxrl.commands.bench_train import GRPO_SAMPLING
    from ctxrl.train.engines import EngineConfig

    sizes = QUICK if getattr(args, "quick", False) else FULL
    engine = EngineConfig(name=sizes.engine, max_model_len=4096, dtype=sizes.dtype, compile=sizes.compile)
    sampling = replace(GRPO_SAMPLING, max_new_tokens=sizes.max_new_tokens)
    runs = [InflightRun(g, sampling) for g in sizes.groups]
    runs.append(InflightRun(1, replace(sampling, max_new_tokens=sizes.short_new_tokens), by_new_tokens=True))
    return rollouts_in_flight(sizes.model, engine, runs, sizes.group_size, sizes.max_steps, sizes.matmul_n)


def rollouts_in_flight(
    model: str,
    engine_config: Any,
    runs: Sequence[InflightRun],
    group_size: int,
    max_steps: int | None,
    matmul_n: int,
) -> dict[str, float]:
    """Roll out each of ``runs`` (``groups`` groups of ``group_size`` ``short`` retention episodes), one
    rollout after another on one engine (``engine_config``, on ``model``: a registry name or a folder), each on
    task seeds of its own; the figures of the module docstring, ``inflight_gain`` over the runs not named by
    their new tokens. ``scripts/probe_rollout.py`` calls it with other engine and sampling settings."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ctxrl.commands.bench_train import decode_passes, matmul_flops_per_s, rollout_flops
    from ctxrl.env.tasks.registry import make_task
    from ctxrl.env.tokenizer import load_tokenizer_dir
    from ctxrl.train.engines import make_engine
    from ctxrl.train.models import get_model
    from ctxrl.train.rollout import RolloutConfig, rollout

    figures: dict[str, float] = {}
    flops: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="ctxrl-bench-inflight-") as name:
        model_dir = get_model(model, Path(name) / "model" if model == "tiny" else None)
        tokenizer = load_tokenizer_dir(model_dir)
        with torch.device("meta"):  # the geometry prices the FLOPs; no weights needed
            shape = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
        engine = make_engine(engine_config, model_dir, tokenizer=tokenizer)
        try:
            first_task = 0
            for run in runs:
                g, label = run.groups, run.label(group_size)
                tasks = [make_task("retention", first_task + i, "short", split="train") for i in range(g)]
                first_task += g
                n = g * group_size
                config = RolloutConfig(group_size=group_size, mode="file", max_steps=max_steps, workers=n)
                start = time.perf_counter()
                result = rollout(engine, tokenizer, tasks, config, sampling=run.sampling)
                wall = time.perf_counter() - start
                passes = decode_passes(result.episodes)
                flops[label] = rollout_flops(result.episodes, shape)
                figures[f"{label}_rollout_s"] = wall
                figures[f"{label}_decode_passes"] = float(passes)
                figures[f"{label}_ms_per_pass"] = 1000.0 * wall / max(passes, 1)
                figures[f"{label}_generated_tokens"] = float(result.stats.generated_tokens)
                print(
                    f"inflight bench: {n} episodes at {run.sampling.max_new_tokens} new tokens an action in "
                    f"{wall:.1f} s, {passes} decode passes",
                    flush=True,
                )
        finally:
            engine.close()
    matmul = matmul_flops_per_s(matmul_n)
    for label, done in flops.items():
        figures[f"{label}_rollout_flops_efficiency"] = done / figures[f"{label}_rollout_s"] / matmul
    figures["matmul_gflops"] = matmul / 1e9
    by_count = sorted((r for r in runs if not r.by_new_tokens), key=lambda r: r.groups)
    if by_count:
        fewest, most = (
            f"{r.label(group_size)}_rollout_flops_efficiency" for r in (by_count[0], by_count[-1])
        )
        figures["inflight_gain"] = figures[most] / figures[fewest]
    return figures
