"""Generation engines behind one small protocol: vLLM in-process, vLLM server, transformers, scripted.

>>> from ctxrl.train.engines import SamplingConfig, make_engine
>>> engine = make_engine("hf", "path/to/model")  # doctest: +SKIP
>>> [gen] = engine.generate([[1, 2, 3]], SamplingConfig(temperature=0.0, max_new_tokens=8))  # doctest: +SKIP

The contract (token in, token out; raw logprobs; stop token kept; too-long prompts aborted) is in
:mod:`ctxrl.train.engines.base`. Heavy imports (torch, vllm, transformers) happen inside the engines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxrl.errors import ConfigError
from ctxrl.train.engines.base import (
    Engine,
    FinishReason,
    Generation,
    SamplingConfig,
    Weights,
    iter_named_weights,
)
from ctxrl.train.engines.model_dir import check_causal_lm_dir, load_tokenizer

ENGINE_NAMES = ("vllm", "vllm-server", "hf", "scripted")


def make_engine(name: str, model_dir: str | Path | None = None, **kwargs: Any) -> Engine:
    """Build the engine called ``name`` on ``model_dir``; ``kwargs`` go to the engine's constructor.

    - ``vllm``: :meth:`VLLMEngine.load` (``seed``, ``max_model_len``, other ``vllm.LLM`` arguments).
    - ``vllm-server``: with ``base_url=...`` connects to a running server; otherwise starts a
      :class:`VLLMServer` on ``model_dir`` (``port``, ``max_model_len``, ``extra_args``, ``startup_timeout``)
      that the engine's ``close`` stops.
    - ``hf``: :meth:`HFEngine.load` (``seed``, ``max_model_len``, ``batch_size``, ``dtype``).
    - ``scripted``: ``policy=`` (required) and ``tokenizer=`` (default: loaded from ``model_dir``).

    Every model-backed engine checks ``model_dir`` first: :class:`~ctxrl.errors.ModelLoadError` if it is not
    a causal LM, before anything starts.
    """
    if name == "vllm":
        from ctxrl.train.engines.vllm_engine import VLLMEngine

        return VLLMEngine.load(_need_dir(name, model_dir), **kwargs)
    if name == "vllm-server":
        from ctxrl.train.engines.server import VLLMServer, VLLMServerEngine

        base_url = kwargs.pop("base_url", None)
        if base_url is not None:
            return VLLMServerEngine(base_url, **kwargs)
        engine_keys = {"timeout", "connect_timeout", "retries", "max_concurrency"}
        engine_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in engine_keys}
        server = VLLMServer(_need_dir(name, model_dir), **kwargs).start()
        try:
            return VLLMServerEngine(server.url, server=server, **engine_kwargs)
        except BaseException:
            server.stop()
            raise
    if name == "hf":
        from ctxrl.train.engines.hf import HFEngine

        return HFEngine.load(_need_dir(name, model_dir), **kwargs)
    if name == "scripted":
        from ctxrl.train.engines.scripted import ScriptedEngine

        if "policy" not in kwargs:
            raise ConfigError("the scripted engine needs policy=callable(prompt_ids) -> action text")
        if kwargs.get("tokenizer") is None:
            kwargs["tokenizer"] = load_tokenizer(_need_dir(name, model_dir))
        return ScriptedEngine(**kwargs)
    raise ConfigError(f"unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}")


def _need_dir(name: str, model_dir: str | Path | None) -> Path:
    if model_dir is None:
        raise ConfigError(f"the {name} engine needs a model folder")
    return Path(model_dir)


__all__ = [
    "ENGINE_NAMES",
    "Engine",
    "FinishReason",
    "Generation",
    "SamplingConfig",
    "Weights",
    "check_causal_lm_dir",
    "iter_named_weights",
    "load_tokenizer",
    "make_engine",
]
