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
from pathlib import Path
from typing import Any

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

ENGINE_NAMES: tuple[str, ...] = typing.get_args(EngineName)

Policy = Callable[[list[int]], str]
"""A scripted engine's policy: prompt ids -> action text."""


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
    cfg = config if isinstance(config, EngineConfig) else _named(config)
    if cfg.name == "vllm":
        from ctxrl.train.engines.vllm_engine import VLLMEngine

        return VLLMEngine.load(_need_dir(cfg.name, model_dir), seed=cfg.seed, max_model_len=cfg.max_model_len)
    if cfg.name == "vllm-server":
        from ctxrl.train.engines.server import VLLMServer, VLLMServerEngine

        if cfg.server_url is not None:
            return VLLMServerEngine(cfg.server_url, timeout=cfg.request_timeout_s, retries=cfg.retries)
        server = VLLMServer(
            _need_dir(cfg.name, model_dir),
            port=cfg.server_port,
            dtype=cfg.dtype,
            seed=cfg.seed,
            startup_timeout=cfg.startup_timeout_s,
            max_model_len=cfg.max_model_len,
        ).start()
        try:
            return VLLMServerEngine(
                server.url, server=server, timeout=cfg.request_timeout_s, retries=cfg.retries
            )
        except BaseException:
            server.stop()
            raise
    if cfg.name == "hf":
        from ctxrl.train.engines.hf import HFEngine

        return HFEngine.load(
            _need_dir(cfg.name, model_dir),
            dtype=cfg.dtype,
            seed=cfg.seed,
            batch_size=cfg.batch_size,
            max_model_len=cfg.max_model_len,
        )
    from ctxrl.train.engines.scripted import ScriptedEngine

    if policy is None:
        raise ConfigError("the scripted engine needs a policy: callable(prompt_ids) -> action text")
    if tokenizer is None:
        tokenizer = load_tokenizer(_need_dir(cfg.name, model_dir))
    return ScriptedEngine(policy, tokenizer, max_model_len=cfg.max_model_len)


def _named(name: str) -> EngineConfig:
    if name not in ENGINE_NAMES:
        raise ConfigError(f"unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}")
    return EngineConfig(name=name)  # type: ignore[arg-type]  # checked against the Literal just above


def _need_dir(name: str, model_dir: str | Path | None) -> Path:
    if model_dir is None:
        raise ConfigError(f"the {name} engine needs a model folder")
    return Path(model_dir)


__all__ = [
    "ENGINE_NAMES",
    "Engine",
    "EngineConfig",
    "FinishReason",
    "Generation",
    "SamplingConfig",
    "Weights",
    "check_causal_lm_dir",
    "iter_named_weights",
    "load_tokenizer",
    "make_engine",
]
