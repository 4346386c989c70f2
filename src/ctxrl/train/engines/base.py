"""The engine contract: what goes in (prompt token ids, sampling settings) and what comes out.

Token in, token out: an engine takes prompts as token ids and returns the ids it generated with the logprob
of each, so training never re-tokenises generated text (docs/architecture.md).

Contracts every engine keeps:

- ``generate`` returns exactly one :class:`Generation` per prompt, in prompt order.
- ``token_ids`` include the stop token (EOS or one of ``stop_token_ids``) that ended generation, so the
  trainer sees the model emit it.
- ``logprobs[i]`` is the log-probability of ``token_ids[i]`` under the model's *raw* distribution
  (``log_softmax`` of the logits, before temperature and top-p), i.e. what a training forward pass on the
  same ids computes.
- A prompt that leaves no room for a single new token under the engine's ``max_model_len`` is not run: it
  gets ``Generation([], [], "abort", 0)`` while the rest of the batch runs normally (the rollout loop ends
  that episode cleanly). A prompt with some room gets ``max_new_tokens`` clipped to the room left, and
  ``finish_reason == "length"`` when it runs out.
- An empty prompt or a token id outside the vocabulary is a caller bug: :class:`~ctxrl.errors.EngineError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from ctxrl.errors import ConfigError, EngineError

if TYPE_CHECKING:
    import torch

FinishReason = Literal["stop", "length", "abort"]
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort")

# What `update_weights` accepts: a model, a state dict, or (name, tensor) pairs under Hugging Face names.
Weights = Any


EngineName = Literal["vllm", "vllm-server", "hf", "scripted"]


@dataclass(frozen=True)
class EngineConfig:
    """Which generation engine to build and how (the ``engine`` section of a run config)."""

    name: EngineName = "vllm"
    """``vllm`` (in-process), ``vllm-server`` (OpenAI-compatible server), ``hf`` (transformers) or
    ``scripted`` (a Python policy, no model)."""
    max_model_len: int | None = None
    """Longest prompt + generation, in tokens; None: the engine's default (``vllm`` 8192, a started
    ``vllm-server`` 4096 — the KV cache is sized for it on a CPU —, ``hf`` the model's positions, ``scripted``
    the tokenizer's maximum length)."""
    seed: int = 0
    """Seeds the engine once (requests carry no seed, see :class:`SamplingConfig`); 0 to 2**31 - 1."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Weights' dtype of an engine that loads the model (``vllm``, ``hf``, a started ``vllm-server``); None:
    float32, except the in-process ``vllm`` engine on CUDA, which keeps the checkpoint's own dtype. On the
    2-core EPYC of this project's CPU machines bfloat16 generates faster than float32 (``ctxrl bench
    precision``); the trainer's logprobs then differ from the engine's by more (its ``train.dtype``)."""
    server_url: str | None = None
    """``vllm-server``: the base URL of a running server; None starts one on the model folder."""
    server_port: int | None = None
    """``vllm-server``: the port of the server it starts (None: a free one)."""
    startup_timeout_s: float = 180.0
    """``vllm-server``: seconds to wait for a started server to answer."""
    request_timeout_s: float = 600.0
    """``vllm-server``: seconds one request may take."""
    retries: int = 2
    """``vllm-server``: retries of a failed request."""
    batch_size: int = 64
    """``hf``: prompts per forward batch."""
    compile: bool = False
    """``vllm``: run the model under torch.compile (vLLM's ``enforce_eager=False``) instead of eagerly. The
    engine starts about a minute later. On a 2-core Xeon with AMX, bfloat16 weights, the smollm2 bench's 8
    episodes decoded 1.25× faster (120 against 150 s, ``scripts/probe_rollout.py``; docs/train_throughput.md,
    "Eighth run"); on 2026-12-04's AVX2 EPYC in float32, 1.03× (``ctxrl bench engine``). The other engines
    refuse it (ConfigError)."""
    policy: str | None = None
    """``scripted``: the policy, a scripted reference policy's name (``file-manager``, ...) or
    ``MODULE:FUNCTION`` of a factory ``f(tokenizer) -> policy(prompt_ids) -> text``; None: a probe policy."""

    def __post_init__(self) -> None:
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.startup_timeout_s <= 0 or self.request_timeout_s <= 0:
            raise ConfigError("startup_timeout_s and request_timeout_s must be > 0 (seconds)")
        if self.retries < 0 or self.batch_size < 1:
            raise ConfigError("retries must be >= 0 and batch_size >= 1")
        if self.server_url is not None:
            check_server_url(self.server_url)


def check_server_url(url: str) -> None:
    """A :class:`ConfigError` unless ``url`` is the root of an HTTP server: ``http(s)://host[:port]``, no
    ``/v1`` (the engine adds the OpenAI paths itself)."""
    import urllib.parse

    example = "e.g. http://127.0.0.1:8000"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError as exc:
        raise ConfigError(f"engine.server_url {url!r} is not a URL ({exc}); {example}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"engine.server_url must start with http:// or https:// and name a host; {example}, not {url!r}"
        )
    if parts.path.rstrip("/").endswith("/v1"):
        raise ConfigError(
            f"engine.server_url is the server's root, without /v1 (the engine adds it): {url!r}"
        )


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling settings of one batched ``generate`` call.

    There is deliberately no per-request seed: on the CPU vLLM build a per-request ``SamplingParams(seed=...)``
    with chunked prefill kills the engine, so every engine is seeded once when it is built.
    """

    temperature: float = 0.7
    """Softmax temperature; 0 means greedy."""
    top_p: float = 0.95
    """Nucleus sampling mass (1.0 disables it). Ignored when greedy."""
    max_new_tokens: int = 256
    """Most tokens generated per prompt (clipped further by the engine's ``max_model_len``)."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end generation in addition to the model's EOS; the stop token is kept in the output."""
    ignore_eos: bool = False
    """Keep generating past EOS and stop ids (benchmarks and tests that need a fixed length)."""
    json_schema: str | None = None
    """A JSON schema (as JSON text) the output must follow, enforced by constrained decoding; only engines
    whose registry entry has ``structured_outputs`` take it, the others raise :class:`EngineError`."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Generation:
    """One prompt's result: the generated ids, the logprob of each, why it ended, and prefix-cache hits."""

    token_ids: list[int]
    """Generated token ids, the ending stop token included."""
    logprobs: list[float]
    """Raw-model log-probability of each generated token (same length as ``token_ids``)."""
    finish_reason: FinishReason
    """``stop`` (EOS or a stop id), ``length`` (token budget or max length reached), ``abort`` (not run)."""
    num_cached_tokens: int = 0
    """Prompt tokens served from the engine's prefix cache (0 where the backend has none)."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Backend details that are not part of the contract (e.g. why a request was aborted)."""

    def __post_init__(self) -> None:
        assert len(self.token_ids) == len(self.logprobs), "one logprob per generated token"
        assert self.finish_reason in FINISH_REASONS, self.finish_reason


@runtime_checkable
class Engine(Protocol):
    """A generation backend. Implementations: vLLM in-process, vLLM server, transformers, scripted."""

    name: str
    """Factory name of the backend (``vllm``, ``vllm-server``, ``hf``, ``scripted``)."""
    max_model_len: int
    """Longest prompt + generation the engine accepts, in tokens."""
    supports_sleep: bool
    """True when ``sleep``/``wake`` free and restore memory; False means they are no-ops."""
    cache_block_size: int | None
    """KV-cache block size of the engine's prefix cache (read from the running vLLM engine); None where
    the engine has no prefix cache or cannot tell (the cost replay then prices as GPU vLLM, 16)."""

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[Generation]:
        """One batched call: a :class:`Generation` per prompt, in order (see the module contract)."""
        ...

    def update_weights(self, weights: Weights) -> None:
        """Replace the weights in place (a model, a state dict or ``(name, tensor)`` pairs, HF names).

        Give whole layers, normally the whole model: vLLM's in-place reload does not take a layer given only
        part of its tensors (layers not given keep their values). Cached prefixes computed with the old
        weights are dropped.
        """
        ...

    def sleep(self) -> None:
        """Free accelerator memory between rollouts (no-op where ``supports_sleep`` is False)."""
        ...

    def wake(self) -> None:
        """Undo ``sleep`` (no-op where ``supports_sleep`` is False)."""
        ...

    def close(self) -> None:
        """Release what the engine owns (engine, server process); the engine is unusable afterwards."""
        ...


def aborted(reason: str) -> Generation:
    """The result of a prompt that was not run (see the module contract)."""
    return Generation(
        token_ids=[], logprobs=[], finish_reason="abort", num_cached_tokens=0, extra={"reason": reason}
    )


def refuse_json_schema(sampling: SamplingConfig, engine: str) -> None:
    """Raise :class:`EngineError` when ``sampling`` asks for a JSON schema of an engine that cannot enforce one
    (generating unconstrained text instead would pass it off as constrained)."""
    if sampling.json_schema is not None:
        raise EngineError(
            f"the {engine} engine cannot constrain output to a JSON schema; use vllm or vllm-server "
            "(structured outputs), or leave sampling.json_schema unset"
        )


def new_token_budgets(
    prompts: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    max_model_len: int,
    vocab_size: int | None = None,
) -> list[int]:
    """Per prompt, how many new tokens it may generate: ``min(max_new_tokens, max_model_len - len(prompt))``.

    0 means the prompt fills the engine's length: the engine returns :func:`aborted` for it. Raises
    :class:`EngineError` for an empty prompt or an id outside ``[0, vocab_size)``.
    """
    budgets = []
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise EngineError(f"prompt {i} is empty; every prompt needs at least one token id")
        if vocab_size is not None:
            lo, hi = min(prompt), max(prompt)
            if lo < 0 or hi >= vocab_size:
                bad = lo if lo < 0 else hi
                raise EngineError(
                    f"prompt {i} has token id {bad}, outside the model's vocabulary [0, {vocab_size})"
                )
        budgets.append(max(0, min(sampling.max_new_tokens, max_model_len - len(prompt))))
    return budgets


def too_long(prompt_len: int, max_model_len: int) -> Generation:
    return aborted(f"prompt of {prompt_len} tokens leaves no room under max_model_len={max_model_len}")


def iter_named_weights(weights: Weights) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, tensor)`` for a model, a state dict, or an iterable of pairs.

    A peft model has its adapters merged while the weights are read (and unmerged afterwards), and its names
    mapped back to the base model's, so the engine receives plain base-model weights.
    """
    import torch

    if isinstance(weights, torch.nn.Module):
        if hasattr(weights, "peft_config") and hasattr(weights, "merge_adapter"):
            yield from _merged_peft_weights(weights)
        else:
            for name, tensor in weights.state_dict().items():
                yield name, tensor.detach()
    elif isinstance(weights, Mapping):
        for name, tensor in weights.items():
            yield name, tensor.detach()
    elif isinstance(weights, Iterable):
        for name, tensor in weights:
            yield name, tensor.detach()
    else:
        raise EngineError(
            f"update_weights takes a model, a state dict or (name, tensor) pairs, got {type(weights)}"
        )


def _merged_peft_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    prefix = f"{model.prefix}" if hasattr(model, "prefix") else "lora_"
    model.merge_adapter()
    try:
        for name, tensor in model.state_dict().items():
            if prefix in name or "original_module" in name:
                continue  # adapter tensors (already merged) and the shadow copy of modules_to_save
            name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            # a copy: unmerging below changes the merged tensors in place
            yield name.replace("modules_to_save.default.", ""), tensor.detach().clone()
    finally:
        model.unmerge_adapter()
