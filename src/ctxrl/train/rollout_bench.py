"""``ctxrl bench rollout``: rollout throughput of the ``vllm`` and ``hf`` engines on long multi-turn episodes.

    ctxrl bench rollout [--quick] [--json FILE]

The workload: the tiny model (built into a temporary folder), two ``retention`` tasks (easy), G = 2 episodes
per task, file mode, a harness budget of 16k tokens (so nothing is rolled back), and every action exactly
``NEW_TOKENS`` tokens long (``ignore_eos``), so both engines run episodes of the same lengths. Each step
appends the action and the harness's note and readout (~170 tokens), so over ``STEPS`` steps every
context grows from ~1.2k to past 4k tokens: the regime where re-reading the prompt dominates and vLLM's
prefix cache pays. The same rollout loop runs both engines (transformers first, then vLLM, each on the
same tasks and batch).

Metrics:

- ``vllm_tokens_per_s``, ``hf_tokens_per_s``: generated tokens per second of time inside ``generate``;
- ``vllm_vs_hf_ratio``: their ratio (target: at least 3);
- ``env_steps_per_s``: environment steps per wall-clock second of the whole vLLM rollout (generation,
  harness steps, sandbox commands, scoring).

``--quick`` runs one task (2 episodes) instead of two; the episodes are as long. The transformers engine
dominates the run time (it re-reads every prompt in full): about 7 minutes per task on a loaded 2-core machine.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctxrl.env.config import HarnessConfig
from ctxrl.train.engines import SamplingConfig

NEW_TOKENS = 128
STEPS = 18
MIN_CONTEXT = 4096


def bench_rollout(args: argparse.Namespace) -> dict[str, float]:
    """Run the workload with the ``hf`` then the ``vllm`` engine; return the four metrics."""
    from tqdm import tqdm

    from ctxrl.env.tasks.registry import make_task
    from ctxrl.train.engines import make_engine
    from ctxrl.train.engines.model_dir import load_tokenizer
    from ctxrl.train.rollout import RolloutConfig, RolloutResult, rollout
    from ctxrl.train.tiny_model import build_tiny_model

    tasks = [make_task("retention", seed, "easy") for seed in range(1 if args.quick else 2)]
    config = RolloutConfig(
        group_size=2,
        mode="file",
        sampling=SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=NEW_TOKENS, ignore_eos=True),
        harness=HarnessConfig(budget=16384, reserve=1024, max_steps=STEPS),
    )
    results: dict[str, RolloutResult] = {}
    with tempfile.TemporaryDirectory(prefix="ctxrl-bench-rollout-") as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", seed=0)
        tokenizer = load_tokenizer(model_dir)
        for name in ("hf", "vllm"):
            engine = make_engine(name, model_dir, max_model_len=8192, seed=0)
            bar = tqdm(total=STEPS * len(tasks) * config.group_size, desc=f"{name} env steps", unit="step")
            try:
                results[name] = rollout(
                    engine,
                    tokenizer,
                    tasks,
                    config,
                    workdir=Path(tmp) / name,
                    on_step=_advance(bar),
                )
            finally:
                bar.close()
                engine.close()
    for name, result in results.items():
        longest = max(len(s.prompt_ids) for ep in result.episodes for s in ep.steps)
        assert longest >= MIN_CONTEXT, f"{name}: contexts reached only {longest} tokens"
    vllm, hf = results["vllm"].stats, results["hf"].stats
    return {
        "vllm_tokens_per_s": vllm.tokens_per_s,
        "hf_tokens_per_s": hf.tokens_per_s,
        "vllm_vs_hf_ratio": vllm.tokens_per_s / hf.tokens_per_s if hf.tokens_per_s > 0 else 0.0,
        "env_steps_per_s": vllm.env_steps_per_s,
    }


def _advance(bar: Any) -> Callable[[int, int], None]:
    """A rollout ``on_step`` callback that moves ``bar`` by the env steps taken."""

    def on_step(taken: int, ended: int) -> None:
        bar.update(taken)

    return on_step
