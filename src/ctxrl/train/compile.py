"""Regional compilation: each decoder layer through ``torch.compile``, the rest of the model eager.

    from ctxrl.train.compile import compile_layers
    compile_layers(model)          # train.compile / sft.compile: before the first forward

A decoder layer is most of a model's work, and every layer runs the same code, so one compiled graph serves
them all (transformers' and torch's "regional compilation"): the first forward of each kind (with or without
gradients, with or without a prefix cache) compiles once (22–33 s for a SmolLM2 SFT step on 2 cores, about
2 minutes for a GRPO update), and every later call runs Inductor's fused kernels. What that buys is the
elementwise work between the matmuls — the casts bfloat16 autocast puts around every projection, RMSNorm, the
rotary embedding, the LoRA scaling and the residual adds — which eager runs as hundreds of small ops a layer.
On a 2-core Xeon with AMX a LoRA SFT step of SmolLM2 on one 2,048-token row took 3.58 s against 4.37 s under
bf16 autocast and 7.38 s against 7.50 s in float32 (``scripts/probe_sft_step.py 2048 600 [--compile]``); a
GRPO update of the bench's group gained 1.07×, inside the machine's noise (``ctxrl bench
smollm2_bf16_compiled`` against ``smollm2_bf16``; docs/train_throughput.md, "Seventh run").

Two settings keep one graph for all layers instead of one per layer: a layer's index is not a constant of its
graph (``allow_unspec_int_on_nn_module``), and the prefix cache's ``update`` — Python bookkeeping keyed by the
layer index — runs outside the graph (:class:`ctxrl.train.update.PrefixState` builds its caches from
:func:`eager_cache_class`). Names of parameters and the state dict do not change: checkpoints, the engine's
weight sync and export see the same model.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

from ctxrl.errors import ConfigError

RECOMPILE_LIMIT = 64
"""Graphs torch keeps per compiled function. A training run needs about a dozen (forward with and without
gradients, prefix, suffix and plain passes, packed or padded); torch's default of 8 would silently fall back to
eager for the rest."""


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The model's repeated blocks: the modules of the classes transformers lists in ``_no_split_modules``
    (``LlamaDecoderLayer``, ``Qwen3DecoderLayer``, ...), through a peft wrapper."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [m for m in base.modules() if type(m).__name__ in names]
    if not layers:
        raise ConfigError(
            f"compile: found no decoder layers in {type(base).__name__} (it lists no _no_split_modules); "
            "set compile: false for this model"
        )
    return layers


def compile_layers(model: Any) -> int:
    """Compile each decoder layer of ``model`` in place (dynamic shapes) and return how many. Sets this
    process's dynamo options the layers need (module-level, as every ``torch.compile`` setting is)."""
    import torch._dynamo.config as dynamo

    dynamo.allow_unspec_int_on_nn_module = True
    dynamo.recompile_limit = max(dynamo.recompile_limit, RECOMPILE_LIMIT)
    dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile(dynamic=True)
    return len(layers)


def is_compiled(model: Any) -> bool:
    """Whether :func:`compile_layers` ran on ``model``."""
    try:
        return all(getattr(m, "_compiled_call_impl", None) is not None for m in decoder_layers(model))
    except ConfigError:
        return False


@cache
def eager_cache_class() -> type:
    """transformers' ``DynamicCache`` with its ``update`` kept out of compiled graphs: the update branches on
    the layer's index and state, which would give every layer (and every cache state) a graph of its own. The
    attention after it still compiles. Outside ``torch.compile`` it is the plain cache."""
    from transformers import DynamicCache

    class EagerUpdateCache(DynamicCache):
        update = torch.compiler.disable(DynamicCache.update, recursive=True)

    return EagerUpdateCache
