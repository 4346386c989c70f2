"""Time the suffixes' attention to a shared prefix, with the dense mask the update uses and without it.

    python scripts/probe_attention.py [PREFIX] [SUFFIX] [BATCH] [REPEATS]
    python scripts/probe_attention.py 1700 300 8 5
    python scripts/probe_attention.py --kernels [--fp32] [LENGTH ...]

In the shared-prefix layout (``ctxrl.train.update``) a microbatch of BATCH suffix lines of SUFFIX tokens
attends to PREFIX cached tokens: transformers hands SDPA queries ``(B, H, S, D)``, keys and values
``(B, H, P + S, D)`` and, because the query and key lengths differ, a dense boolean mask (every prefix key
visible, the suffix block causal). SDPA's CPU kernel computes every query-key pair under a mask; the causal
block it could skip is ``S² / 2`` of ``S · (P + S)`` pairs. This probe times one attention layer of
SmolLM2-135M's geometry (9 query heads of 64 over 3 key-value heads), forward and backward, three ways:

- ``mask``: the dense offset-causal mask, as the update runs it;
- ``nomask``: the same pairs without a mask (not the same numbers: a floor for what any kernel that reads
  no mask could reach on all the pairs);
- ``twopart``: :func:`ctxrl.train.attention.two_part_attention` on the same keys and values, as the update
  runs it with ``train.two_part_attention`` (prefix without a mask, the suffix block causal, merged by
  log-sum-exp).

and prints milliseconds per layer (median of REPEATS after one warm-up) and each against ``mask``. The
estimated attention share of a whole forward at these lengths is printed beside it, so the ratio can be read
as a bound on the update's gain: used for the "attention" section of docs/train_throughput.md.

``--kernels``: whether attention written as matmuls could beat the CPU flash kernel. For each LENGTH
(default 256 512 1024 2048) one causal layer of that geometry (query heads, key-value heads already repeated),
forward and backward under bfloat16, two ways: ``flash`` (SDPA with ``is_causal``, what every trainer here
runs) and ``blocks`` (:class:`BlockAttention`: queries in blocks of 256 against their keys so far, the scores
and products as bfloat16 matmuls at the matmul rate, the softmax in float32, a hand-written backward that
recomputes the probabilities from the saved log-sum-exp: the flash-attention algorithm with the CPU's own
matmuls as its tiles). Prints each one's milliseconds and attention GFLOP/s (forward 2 matmuls, backward 5
with the recomputation, half the square each), after checking in float32 that ``blocks`` gives SDPA's output
and gradients (the largest difference over each tensor's largest value). Used for the "Thirteenth run"
section of docs/train_throughput.md. With ``--fp32`` both run in float32 (configs/sft_smollm2*.yaml's
precision; the "Fourteenth run" section).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from ctxrl.train.attention import two_part_attention

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, LAYERS = 9, 3, 64, 576, 30
"""SmolLM2-135M's attention geometry."""
PARAMS = 134.5e6


def _inputs(prefix: int, suffix: int, batch: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, HEADS, suffix, HEAD_DIM, generator=g, requires_grad=True)
    k_prefix = torch.randn(1, KV_HEADS, prefix, HEAD_DIM, generator=g, requires_grad=True)
    v_prefix = torch.randn(1, KV_HEADS, prefix, HEAD_DIM, generator=g, requires_grad=True)
    k_suffix = torch.randn(batch, KV_HEADS, suffix, HEAD_DIM, generator=g, requires_grad=True)
    v_suffix = torch.randn(batch, KV_HEADS, suffix, HEAD_DIM, generator=g, requires_grad=True)
    return q, k_prefix, v_prefix, k_suffix, v_suffix


def _heads(x: torch.Tensor, batch: int) -> torch.Tensor:
    """Key-value heads repeated to the query heads and the prefix to the batch (copies, as repeat_kv makes)."""
    x = x.expand(batch, -1, -1, -1)
    return x.repeat_interleave(HEADS // KV_HEADS, dim=1)


def offset_causal_mask(prefix: int, suffix: int) -> torch.Tensor:
    """``(S, P + S)`` booleans: every prefix key, and the suffix keys up to the query's own position.

    >>> offset_causal_mask(2, 3).int().tolist()
    [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    """
    keys = torch.arange(prefix + suffix)
    return keys[None, :] <= (prefix + torch.arange(suffix))[:, None]


def variants(prefix: int, suffix: int, batch: int) -> dict[str, Callable[[], torch.Tensor]]:
    q, kp, vp, ks, vs = _inputs(prefix, suffix, batch)
    mask = offset_causal_mask(prefix, suffix)[None, None]

    def full_kv() -> tuple[torch.Tensor, torch.Tensor]:
        k = torch.cat([kp.expand(batch, -1, -1, -1), ks], dim=2)
        v = torch.cat([vp.expand(batch, -1, -1, -1), vs], dim=2)
        return _heads(k, batch), _heads(v, batch)

    def masked() -> torch.Tensor:
        k, v = full_kv()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def unmasked() -> torch.Tensor:
        k, v = full_kv()
        return F.scaled_dot_product_attention(q, k, v)

    def two_part() -> torch.Tensor:
        k, v = full_kv()
        return two_part_attention(q, k, v)

    return {"mask": masked, "nomask": unmasked, "twopart": two_part}


def time_ms(run: Callable[[], torch.Tensor], repeats: int) -> float:
    """Median milliseconds of ``run``'s forward and backward, after one untimed pass."""
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        run().sum().backward()
        if i:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def attention_share(prefix: int, suffix: int) -> float:
    """Estimated share of attention (scores and weighted sum) in a suffix token's forward FLOPs."""
    context = prefix + (suffix + 1) / 2
    attention = 4 * context * HEADS * HEAD_DIM * LAYERS
    return attention / (attention + 2 * PARAMS)


class BlockAttention(torch.autograd.Function):
    """Causal attention ``(B, H, T, D)`` → ``(B, H, T, D)`` in query blocks of ``block``, each against its
    keys so far (the diagonal block masked): matmuls in the inputs' dtype, softmax in float32."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int) -> torch.Tensor:
        scale = q.shape[-1] ** -0.5
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32)
        for s, e in _blocks(q.shape[2], block):
            p = _scores(q, k, s, e, scale)
            lse[:, :, s:e] = torch.logsumexp(p, -1)
            p = p.sub_(lse[:, :, s:e, None]).exp_()
            out[:, :, s:e] = torch.matmul(p.to(q.dtype), v[:, :, :e])
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.block, ctx.scale = block, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        grad = grad.contiguous()
        delta = (grad.float() * out.float()).sum(-1)  # rowsum(dO ∘ O): the softmax's backward term
        dq = torch.empty_like(q)
        dk = torch.zeros(k.shape, dtype=torch.float32)
        dv = torch.zeros(v.shape, dtype=torch.float32)
        for s, e in _blocks(q.shape[2], ctx.block):
            p = _scores(q, k, s, e, ctx.scale).sub_(lse[:, :, s:e, None]).exp_()
            dp = torch.matmul(grad[:, :, s:e], v[:, :, :e].transpose(-1, -2)).float()
            ds = dp.sub_(delta[:, :, s:e, None]).mul_(p).mul_(ctx.scale).to(q.dtype)
            dv[:, :, :e] += torch.matmul(p.to(q.dtype).transpose(-1, -2), grad[:, :, s:e])
            dq[:, :, s:e] = torch.matmul(ds, k[:, :, :e])
            dk[:, :, :e] += torch.matmul(ds.transpose(-1, -2), q[:, :, s:e])
        return dq, dk.to(k.dtype), dv.to(v.dtype), None


def _blocks(length: int, block: int) -> list[tuple[int, int]]:
    return [(s, min(length, s + block)) for s in range(0, length, block)]


def _scores(q: torch.Tensor, k: torch.Tensor, s: int, e: int, scale: float) -> torch.Tensor:
    """Float32 scores of queries ``s:e`` against keys ``:e``, the keys after each query at −inf."""
    scores = torch.matmul(q[:, :, s:e], k[:, :, :e].transpose(-1, -2)).float().mul_(scale)
    after = torch.arange(e)[None, :] > torch.arange(s, e)[:, None]
    return scores.masked_fill_(after, float("-inf"))


def kernels(
    lengths: list[int], repeats: int = 3, block: int = 256, dtype: torch.dtype = torch.bfloat16
) -> None:
    """The ``--kernels`` mode (module docstring)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, 300, HEAD_DIM, generator=g, requires_grad=True) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    out = BlockAttention.apply(q, k, v, 128)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    # Relative to each tensor's largest value: float32 matmuls summed in another order (or by a oneDNN that
    # trades precision for speed on some CPUs) move the gradients (up to ~14 here) by 1e-5 of that, a wrong
    # backward by 1e-2 and more.
    error = max(
        ((a - b).abs().max() / b.abs().max()).item()
        for a, b in zip((out, *grads), (ref, *ref_grads), strict=True)
    )
    print(
        f"blocks against SDPA, float32, 300 tokens: max difference relative to the largest value {error:.1e}"
    )
    print(
        f"one causal layer ({HEADS} heads of {HEAD_DIM}), forward + backward, {str(dtype).removeprefix('torch.')}, "
        f"median of {repeats}"
    )
    for length in lengths:
        q, k, v = (
            torch.randn(1, HEADS, length, HEAD_DIM, generator=g, dtype=dtype).requires_grad_()
            for _ in range(3)
        )
        flops = 7 * 2 * HEADS * HEAD_DIM * length * length / 2
        runs: dict[str, Callable[[], torch.Tensor]] = {
            "flash": partial(F.scaled_dot_product_attention, q, k, v, is_causal=True),
            "blocks": partial(BlockAttention.apply, q, k, v, block),
        }
        for name, run in runs.items():
            ms = time_ms(run, repeats)
            print(f"{length:6d} {name:7s} {ms:8.1f} ms {flops / ms / 1e6:6.0f} GFLOP/s", flush=True)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--kernels"]:
        lengths = [int(a) for a in argv[1:] if a != "--fp32"] or [256, 512, 1024, 2048]
        kernels(lengths, dtype=torch.float32 if "--fp32" in argv else torch.bfloat16)
        return
    prefix, suffix, batch, repeats = (int(a) for a in (argv + ["1700", "300", "8", "5"][len(argv) :]))
    print(f"prefix {prefix}, suffix {suffix} x {batch} lines, {torch.get_num_threads()} threads, "
          f"one layer forward + backward, median of {repeats}")  # fmt: skip
    base = None
    for name, run in variants(prefix, suffix, batch).items():
        ms = time_ms(run, repeats)
        base = base or ms
        print(f"{name:8s} {ms:9.1f} ms  x{ms / base:.2f}")
    pairs = suffix * (prefix + suffix)
    print(f"causal block {suffix * suffix / 2 / pairs:.1%} of the pairs; attention ~{attention_share(prefix, suffix):.0%} "
          f"of a suffix token's forward FLOPs")  # fmt: skip


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
    else:
        main(sys.argv[1:])
