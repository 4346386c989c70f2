"""``ctxrl bench engine``: the in-process vLLM engine's CPU settings, each against today's defaults.

The work is the rollout half of a GRPO step in the shape of the SmolLM2 bench's 8-episode group: 8 prompts
that share a 1.3k-token prefix, 6 turns of 64 new tokens each, every turn appending the completion and a
short observation, prefix caching on (:func:`ctxrl.commands.bench_precision.rollout_work`; generation runs
to its length, so every setting does the same work). Each setting runs in a process of its own, one after
another, and is compared with the defaults measured in the same bench run:

- ``engine_<setting>_s``: wall seconds of the work;
- ``engine_<setting>_speedup``: the defaults' seconds ÷ the setting's (above 1: faster);
- ``engine_<setting>_flops_efficiency``: model FLOPs of the work ÷ its seconds ÷ this machine's fp32 matmul
  rate measured in the same run as ``ctxrl bench smollm2`` measures it (``matmul_gflops``): the figure ``rollout_flops_efficiency`` of
  ``ctxrl bench smollm2`` on a fixed workload.

The settings (:data:`SETTINGS`) are the knobs vLLM's CPU guide names: the weights' dtype, torch.compile
instead of eager mode, OpenMP thread binding, the KV-cache space and the chunked-prefill token budget. The
engine core stays in this process in every setting: the trainer's in-place weight sync needs it there
(:mod:`ctxrl.train.engines.vllm_engine`). ``--quick``: the tiny model on small sizes, the defaults and one
setting of each kind (says the path works, not what a setting is worth).
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class EngineSetting:
    """One way to start the engine: ``engine.dtype``, further ``vllm.LLM`` keyword arguments, environment."""

    dtype: str | None = None
    llm_kwargs: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


SETTINGS: dict[str, EngineSetting] = {
    "default": EngineSetting(),
    "bf16": EngineSetting(dtype="bfloat16"),
    "compiled": EngineSetting(llm_kwargs={"enforce_eager": False}),
    "nobind": EngineSetting(env={"VLLM_CPU_OMP_THREADS_BIND": "nobind"}),
    "kv_4gib": EngineSetting(env={"VLLM_CPU_KVCACHE_SPACE": "4"}),
    "batched_16k": EngineSetting(llm_kwargs={"max_num_batched_tokens": 16384}),
}
"""The settings measured, by name; ``default`` is what ``ctxrl train`` starts today."""

QUICK_SETTINGS = ("default", "bf16", "nobind", "batched_16k")
"""``--quick``: one setting of each kind (dtype, environment, ``vllm.LLM`` argument); torch.compile takes a
minute to start and is left to the full run."""


def bench_engine(args: argparse.Namespace) -> dict[str, float]:
    """``ctxrl bench engine``: the figures of the module docstring."""
    from ctxrl.commands.bench_precision import rollout_in_subprocess
    from ctxrl.commands.bench_train import matmul_flops_per_s
    from ctxrl.train.models import get_model
    from ctxrl.train.tiny_model import build_tiny_model

    quick = bool(getattr(args, "quick", False))
    names = QUICK_SETTINGS if quick else tuple(SETTINGS)
    with tempfile.TemporaryDirectory(prefix="ctxrl-bench-engine-") as name:
        model_dir = (
            build_tiny_model(Path(name) / "model", seed=0) if quick else get_model("smollm2-135m-instruct")
        )
        matmul = matmul_flops_per_s(256 if quick else 1536)  # as `ctxrl bench smollm2` measures it
        figures = {"matmul_gflops": matmul / 1e9}
        work: dict[str, dict[str, float]] = {}
        for setting in names:
            s = SETTINGS[setting]
            work[setting] = rollout_in_subprocess(
                Path(model_dir),
                quick,
                dtype=s.dtype,
                llm_kwargs=s.llm_kwargs,
                env=s.env,
                what=f"engine setting {setting!r}",
            )
            print(f"engine {setting}: {work[setting]['seconds']:.1f} s", flush=True)
    base = work["default"]["seconds"]
    for setting, w in work.items():
        figures[f"engine_{setting}_s"] = w["seconds"]
        figures[f"engine_{setting}_flops_efficiency"] = w["flops"] / w["seconds"] / matmul
        if setting != "default":
            figures[f"engine_{setting}_speedup"] = base / w["seconds"]
    return figures
