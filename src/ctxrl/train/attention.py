"""Attention of suffix lines to a shared prefix without a dense mask: two parts merged by log-sum-exp.

    with prefix_attention(model):            # only around forwards that continue a prefix cache
        out = model(input_ids=suffixes, past_key_values=prefix_cache, ...)

In the shared-prefix layout (:mod:`ctxrl.train.update`) a batch of right-padded suffix lines continues a prefix
of ``P`` cached tokens. Given queries of ``S`` tokens and keys of ``P + S``, transformers builds a dense
``(S, P + S)`` mask for SDPA (every prefix key visible, the suffix block causal). The same attention is
exactly two unmasked pieces, which skip the mask, its construction and the per-line copies of the prefix:

- every suffix query against the prefix's keys, with no mask — all lines' queries in one batch against the
  one copy of the prefix;
- each line's queries against its own keys with the causal flag (the query and key positions line up);

each with its log-sum-exp ``l₁``, ``l₂``; the output is ``(e^{l₁} o₁ + e^{l₂} o₂) / (e^{l₁} + e^{l₂})``. The
backward gives each piece's kernel the merged output and log-sum-exp, from which it recomputes the true
attention probabilities of its keys, so the gradients are exact too (the flash-attention identity; tested
against the masked path within 1e-5).

It runs on the CPU flash-attention kernel (``aten._scaled_dot_product_flash_attention_for_cpu``, which returns
the log-sum-exp); on other devices, or under a model whose layers use sliding windows, :func:`prefix_attention`
leaves the model's own attention in place. Opt-in (``train.two_part_attention``, ``sft.two_part_attention``):
timed one after another on this project's 2-core CPU it was not measurably faster than the masked path
(``scripts/probe_attention.py``); alternated with it step by step it was faster by the median, on the ladder's
float32 SFT step (``scripts/probe_sft_step.py --pairs``) and on a recorded group's GRPO update
(``scripts/probe_layouts.py --pairs``: 7 % on an EPYC, 3 % on a Xeon with AMX), so the SmolLM2 configs turn it
on (docs/train_throughput.md).
Right padding needs no mask: a real token's keys all come before any
pad, and pads carry no loss.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn import functional as F

NAME = "ctxrl_prefix"
"""The name this attention is registered under with transformers' ``AttentionInterface``."""

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _prefix_queries(q: torch.Tensor) -> torch.Tensor:
    """``(B, H, S, D)`` → ``(1, H, B·S, D)``: every line's queries in one batch against the one prefix."""
    b, h, s, d = q.shape
    return q.transpose(0, 1).reshape(1, h, b * s, d)


def _lines(x: torch.Tensor, batch: int) -> torch.Tensor:
    """The inverse of :func:`_prefix_queries` (also for a log-sum-exp without the last dimension)."""
    h, bs = x.shape[1], x.shape[2]
    return x.reshape(h, batch, bs // batch, *x.shape[3:]).transpose(0, 1)


class _TwoPart(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k_prefix: torch.Tensor,
        v_prefix: torch.Tensor,
        k_lines: torch.Tensor,
        v_lines: torch.Tensor,
        scale: float | None,
    ) -> torch.Tensor:
        batch = q.shape[0]
        o1, l1 = _flash(_prefix_queries(q), k_prefix, v_prefix, 0.0, False, scale=scale)
        o1, l1 = _lines(o1, batch), _lines(l1, batch)
        o2, l2 = _flash(q, k_lines, v_lines, 0.0, True, scale=scale)
        lse = torch.logaddexp(l1, l2)
        out = torch.exp(l1 - lse).unsqueeze(-1) * o1.float() + torch.exp(l2 - lse).unsqueeze(-1) * o2.float()
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k_prefix, v_prefix, k_lines, v_lines, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k_prefix, v_prefix, k_lines, v_lines, out, lse = ctx.saved_tensors
        grad = grad.contiguous()
        dq1, dk_prefix, dv_prefix = _flash_backward(
            _prefix_queries(grad), _prefix_queries(q), k_prefix, v_prefix,
            _prefix_queries(out), _prefix_queries(lse.unsqueeze(-1)).squeeze(-1), 0.0, False, scale=ctx.scale,
        )  # fmt: skip
        dq2, dk_lines, dv_lines = _flash_backward(
            grad, q, k_lines, v_lines, out, lse, 0.0, True, scale=ctx.scale
        )
        return _lines(dq1, q.shape[0]) + dq2, dk_prefix, dv_prefix, dk_lines, dv_lines, None


def two_part_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, scale: float | None = None
) -> torch.Tensor:
    """Attention of ``query`` ``(B, H, S, D)`` to ``key``/``value`` ``(B, H, P + S, D)`` whose first ``P``
    positions are a prefix every line shares (the same values in every line) and whose last ``S`` are the
    lines' own, causal: what SDPA computes with the offset causal mask, without building it.

    >>> q, k, v = torch.randn(2, 3, 4, 8), torch.randn(1, 3, 9, 8).expand(2, -1, -1, -1).clone(), None
    >>> k[:, :, 5:] = torch.randn(2, 3, 4, 8); v = torch.randn_like(k); v[1, :, :5] = v[0, :, :5]
    >>> mask = torch.arange(9)[None, :] <= torch.arange(5, 9)[:, None]
    >>> ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    >>> bool(torch.allclose(two_part_attention(q, k, v), ref, atol=1e-6))
    True
    """
    s = query.shape[2]
    p = key.shape[2] - s
    if p <= 0:
        return F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale)
    # line 0's prefix stands for every line's (they are the same); its gradient flows back through line 0
    out: torch.Tensor = _TwoPart.apply(
        query.contiguous(), key[:1, :, :p].contiguous(), value[:1, :, :p].contiguous(),
        key[:, :, p:].contiguous(), value[:, :, p:].contiguous(), scale,
    )  # fmt: skip
    return out


def _repeat_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def prefix_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature around :func:`two_part_attention`; returns ``(B, S, H, D)``.

    transformers passes no mask to a function it has no mask builder for, so this one only runs where no
    mask is needed: right-padded lines after a prefix (see :func:`prefix_attention`)."""
    if attention_mask is not None or dropout or kwargs.get("sliding_window") is not None:
        raise RuntimeError(f"{NAME} attention takes no mask, dropout or sliding window")
    groups = int(getattr(module, "num_key_value_groups", 1))
    out = two_part_attention(query, _repeat_heads(key, groups), _repeat_heads(value, groups), scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, prefix_attention_forward)


def supports_prefix_attention(model: Any) -> bool:
    """Whether :func:`prefix_attention` replaces ``model``'s attention: SDPA on the CPU, no sliding windows."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) not in ("sdpa", NAME):
        return False
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return False
    try:
        device = next(model.parameters()).device
    except StopIteration:
        return False
    return device.type == "cpu"


@contextlib.contextmanager
def prefix_attention(model: Any, enabled: bool = True) -> Iterator[bool]:
    """Within the block, ``model``'s attention is :func:`prefix_attention_forward` (yields True) where
    :func:`supports_prefix_attention` allows; elsewhere, or with ``enabled`` False, nothing changes (False).

    Only forwards of right-padded lines (or one prefix) continuing a KV cache may run inside: transformers
    builds no mask for this attention, so packed rows would see each other."""
    if not enabled or not supports_prefix_attention(model):
        yield False
        return
    _register()
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield True
    finally:
        config._attn_implementation = before
