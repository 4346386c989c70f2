"""Time the suffixes' attention to a shared prefix, with the dense mask the update uses and without it.

    python scripts/probe_attention.py [PREFIX] [SUFFIX] [BATCH] [REPEATS]
    python scripts/probe_attention.py 1700 300 8 5

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
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

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


def main(argv: list[str]) -> None:
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
    main(sys.argv[1:])
