"""Generation engines behind one small protocol: vLLM in-process, vLLM server, transformers, scripted.

>>> from ctxrl.train.engines import EngineConfig, SamplingConfig, make_engine
>>> engine = make_engine(EngineConfig(name="hf", seed=3), "path/to/model")  # doctest: +SKIP
>>> [gen] = engine.generate([[1, 2, 3]], SamplingConfig(temperature=0.0, max_new_tokens=8))  # doctest: +SKIP

The contract (token in, token out; raw logprobs; stop token kept; too-long prompts aborted) is in
:mod:`ctxrl.train.engines.base`. Heavy imports (torch, vllm, transformers) happen inside the engines.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ctxrl.errors import ConfigError
from ctxrl.train.engines.base import (
    Engine,
    EngineConfig,
    EngineName,
    FinishReason,
    Generation,
    SamplingConfig,
    Weights,
    iter_named_weights,
)
from ctxrl.train.engines.model_dir import check_causal_lm_dir, load_tokenizer

Policy = Callable[[list[int]], str]
"""A scripted engine's policy: prompt ids -> action text."""

Builder = Callable[[EngineConfig, Path | None, Any, Policy | None], Engine]
"""``(config, model_dir, tokenizer, policy) -> engine``."""


@dataclass(frozen=True)
class EngineSpec:
    """One engine in the registry: how it is built and what it can do.

    Callers ask the capabilities (``ENGINES[config.name].has_model``), never the name: a new engine is one
    entry here.
    """

    name: str
    build: Builder
    has_model: bool
    """Generates from model weights (False: a scripted policy; it cannot summarise or be trained)."""
    needs_policy: bool
    """Built around a Python policy (``engine.policy``), not a model."""
    connects: bool
    """Can attach to a running server (``engine.server_url``) instead of loading ``model_dir``."""
    token_io: bool
    """Takes prompt ids and returns generated ids (every engine here: the trainer never re-tokenises)."""
    logprobs: bool
    """Returns each generated token's raw logprob (False: zeros)."""
    weight_sync: Literal["in-process", "nccl", "none"]
    """How ``update_weights`` reaches the generator: in this process, over NCCL to a ``trl vllm-serve``
    server (CUDA only), or not at all."""
    cached_tokens: bool
    """Reports ``num_cached_tokens`` from a real prefix cache (a server: when it runs with the flag)."""
    structured_outputs: bool
    """Constrains decoding to ``SamplingConfig.json_schema`` (vLLM's structured outputs); the others refuse a
    schema."""
    compiles: bool = False
    """Runs its model under torch.compile when ``engine.compile`` is set (the others refuse the setting)."""

    def loads_weights(self, config: EngineConfig) -> bool:
        """Whether building it reads the weights in ``model_dir`` (checked first as a causal LM)."""
        return self.has_model and not (self.connects and config.server_url is not None)


def _vllm(cfg: EngineConfig, model_dir: Path | None, tokenizer: Any, policy: Policy | None) -> Engine:
    from ctxrl.train.engines.vllm_engine import VLLMEngine

    return VLLMEngine.load(
        _need_dir(cfg.name, model_dir),
        seed=cfg.seed,
        max_model_len=cfg.max_model_len,
        dtype=cfg.dtype,
        enforce_eager=not cfg.compile,
    )


def _vllm_server(cfg: EngineConfig, model_dir: Path | None, tokenizer: Any, policy: Policy | None) -> Engine:
    from ctxrl.train.engines.server import VLLMServer, VLLMServerEngine

    if cfg.server_url is not None:
        return VLLMServerEngine(cfg.server_url, timeout=cfg.request_timeout_s, retries=cfg.retries)
    server = VLLMServer(
        _need_dir(cfg.name, model_dir),
        port=cfg.server_port,
        dtype=cfg.dtype or "float32",
        seed=cfg.seed,
        startup_timeout=cfg.startup_timeout_s,
        max_model_len=cfg.max_model_len,
    ).start()
    try:
        return VLLMServerEngine(server.url, server=server, timeout=cfg.request_timeout_s, retries=cfg.retries)
    except BaseException:
        server.stop()
        raise


def _hf(cfg: EngineConfig, model_dir: Path | None, tokenizer: Any, policy: Policy | None) -> Engine:
    from ctxrl.train.engines.hf import HFEngine

    return HFEngine.load(
        _need_dir(cfg.name, model_dir),
        dtype=cfg.dtype or "float32",
        seed=cfg.seed,
        batch_size=cfg.batch_size,
        max_model_len=cfg.max_model_len,
    )


def _scripted(cfg: EngineConfig, model_dir: Path | None, tokenizer: Any, policy: Policy | None) -> Engine:
    from ctxrl.train.engines.scripted import ScriptedEngine

    if policy is None:
        raise ConfigError("the scripted engine needs a policy: callable(prompt_ids) -> action text")
    if tokenizer is None:
        tokenizer = load_tokenizer(_need_dir(cfg.name, model_dir))
    return ScriptedEngine(policy, tokenizer, max_model_len=cfg.max_model_len)


ENGINES: dict[str, EngineSpec] = {
    spec.name: spec
    for spec in (
        EngineSpec("vllm", _vllm, True, False, False, True, True, "in-process", True, True, compiles=True),
        EngineSpec("vllm-server", _vllm_server, True, False, True, True, True, "nccl", True, True),
        EngineSpec("hf", _hf, True, False, False, True, True, "in-process", False, False),
        EngineSpec("scripted", _scripted, False, True, False, True, False, "none", False, False),
    )
}
ENGINE_NAMES: tuple[str, ...] = tuple(ENGINES)
assert set(ENGINE_NAMES) == set(typing.get_args(EngineName)), "EngineName and ENGINES name the same engines"


def engine_spec(name: str) -> EngineSpec:
    """The registry entry of ``name``; :class:`~ctxrl.errors.ConfigError` naming the choices if unknown."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ConfigError(f"unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}") from None


def make_engine(
    config: EngineConfig | str,
    model_dir: str | Path | None = None,
    *,
    tokenizer: Any = None,
    policy: Policy | None = None,
) -> Engine:
    """Build the engine ``config`` describes (a bare name means that engine with the defaults).

    - ``vllm``: :meth:`VLLMEngine.load` on ``model_dir``.
    - ``vllm-server``: connects to ``config.server_url``, or starts a :class:`VLLMServer` on ``model_dir``
      that the engine's ``close`` stops.
    - ``hf``: :meth:`HFEngine.load` on ``model_dir``.
    - ``scripted``: runs ``policy`` (prompt ids -> text); ``tokenizer`` defaults to ``model_dir``'s.

    Every model-backed engine checks ``model_dir`` first: :class:`~ctxrl.errors.ModelLoadError` if it is not
    a causal LM, before anything starts.
    """
    if not isinstance(config, EngineConfig):
        config = EngineConfig(name=typing.cast(EngineName, engine_spec(config).name))
    spec = engine_spec(config.name)
    if config.compile and not spec.compiles:
        compiling = ", ".join(name for name, s in ENGINES.items() if s.compiles)
        raise ConfigError(
            f"engine.compile: the {config.name} engine does not compile its model (only {compiling})"
        )
    folder = None if model_dir is None else Path(model_dir)
    return spec.build(config, folder, tokenizer, policy)


def _need_dir(name: str, model_dir: str | Path | None) -> Path:
    if model_dir is None:
        raise ConfigError(f"the {name} engine needs a model folder")
    return Path(model_dir)


__all__ = [
    "ENGINES",
    "ENGINE_NAMES",
    "Engine",
    "EngineConfig",
    "EngineSpec",
    "FinishReason",
    "Generation",
    "SamplingConfig",
    "Weights",
    "check_causal_lm_dir",
    "engine_spec",
    "iter_named_weights",
    "load_tokenizer",
    "make_engine",
]
