"""The CUDA paths: vLLM generating on a GPU, and DeepSpeed with a ZeRO config. Marked ``gpu``: they run where
``torch.cuda.is_available()`` and skip cleanly elsewhere (``tests/conftest.py``); DeepSpeed is optional and
skips when it is not installed.

Run (on a GPU machine): .venv/bin/python -m pytest tests/test_gpu.py -q -m gpu
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu


def test_vllm_engine_generates_on_cuda(tiny_model_dir: Path, tiny_tokenizer: Any) -> None:
    from vllm.platforms import current_platform

    from ctxrl.env.episode import PromptBuilder
    from ctxrl.train.engines import EngineConfig, SamplingConfig, make_engine

    assert current_platform.is_cuda()
    engine = make_engine(EngineConfig(name="vllm", max_model_len=2048), tiny_model_dir)
    try:
        prompt = PromptBuilder(tiny_tokenizer).full([{"role": "user", "content": "hello"}], None)
        sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=8, ignore_eos=True)
        gens = engine.generate([prompt, prompt], sampling)
        assert len(gens) == 2
        gen = gens[0]
        assert len(gen.token_ids) == 8 and len(gen.logprobs) == 8
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in gen.logprobs)
        # the block size comes from the running engine (the cost replay prices prefix reuse with it)
        assert isinstance(engine.cache_block_size, int) and engine.cache_block_size > 0
    finally:
        engine.close()


def test_deepspeed_imports_and_loads_a_zero2_config() -> None:
    pytest.importorskip("deepspeed", reason="DeepSpeed is optional: pip install deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": 2, "overlap_comm": True},
        "bf16": {"enabled": True},
    }
    loaded = DeepSpeedConfig(config)
    assert loaded.zero_enabled and loaded.zero_optimization_stage == 2
    assert loaded.train_batch_size == 4 * 2  # one process: micro batch x accumulation x world size 1
    assert loaded.bfloat16_enabled


def test_hf_engine_on_cuda_samples_from_its_own_seed(tiny_model_dir: Path, tiny_tokenizer: Any) -> None:
    """On a CUDA model sampling draws from the device's generator: the engine's seed must govern it, and a
    call must leave the global CUDA RNG where it was."""
    import torch

    from ctxrl.env.episode import PromptBuilder
    from ctxrl.train.engines import EngineConfig, SamplingConfig, make_engine

    prompt = PromptBuilder(tiny_tokenizer).full([{"role": "user", "content": "hello"}], None)
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=24, ignore_eos=True)

    def sample(seed: int) -> list[list[int]]:
        engine = make_engine(EngineConfig(name="hf", seed=seed), tiny_model_dir)
        assert engine.model.device.type == "cuda"  # type: ignore[attr-defined]
        return [g.token_ids for g in engine.generate([prompt, prompt], sampling)]

    torch.cuda.manual_seed(123)
    before = torch.cuda.get_rng_state()
    first = sample(3)
    assert torch.equal(torch.cuda.get_rng_state(), before)
    torch.cuda.manual_seed(456)  # a different global state changes nothing
    assert sample(3) == first
    assert sample(4) != first
