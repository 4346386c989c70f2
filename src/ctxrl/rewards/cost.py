"""Prefix-reuse cost: replay an episode's prompts through a vLLM-style prefix cache, then price it.

What is modelled, and where it comes from (vLLM 0.32, ``vllm/v1/core/``):

- **Blocks and hashes.** The KV cache is split into blocks of ``block_size`` tokens. A block's key chains
  its parent's key and its own tokens (``kv_cache_utils``), so a block can only hit when every token
  before it matches too: an edit at token ``k`` invalidates every block from ``k // block_size`` on.
  Only full blocks are keyed; a partial tail block is never reused.
- **The hit cap.** ``KVCacheManager.get_computed_blocks`` looks up at most ``num_tokens - 1`` tokens
  (the last prompt token must run to give logits), and ``find_longest_cache_hit`` walks
  ``(num_tokens - 1) // block_size`` whole blocks. So the hit is ``block_size * ((P - 1) // block_size)``
  at most: a fully cached prompt of exactly ``n`` blocks hits ``n - 1`` blocks and recomputes the last
  one whole (the recomputed block is cached again as a duplicate key; both copies count against capacity).
- **Generated tokens are cached too.** As decode runs, every block that fills is keyed with the request's
  full token sequence (``cache_blocks`` after each ``allocate_slots``). The last sampled token is never fed
  back, so a request with ``P`` prompt and ``G`` generated tokens leaves the full blocks of its first
  ``P + G - 1`` tokens cached. A next prompt that extends ``prompt + generated`` hits those blocks.
- **Eviction.** Freed blocks keep their keys and wait in a free queue: keyed blocks are appended to its
  tail (LRU), unkeyed ones prepended (reused first), and a request frees its blocks tail first
  (``free_blocks(reversed(...))``), so within one request the deepest block is evicted first. A hit
  removes the block from the queue (``touch``). New blocks are taken from the front; taking a keyed block
  evicts its key. ``capacity_blocks`` is the number of usable blocks (vLLM's ``num_gpu_blocks - 1``: block
  0 is a reserved null block).
- **Block size differs by platform.** The reference (and vLLM on GPUs) uses 16-token blocks; vLLM's CPU
  backend defaults to 128 (``platforms/cpu.py``) unless ``block_size`` is passed. Pass the engine's value.

Not modelled: preemption and the admission watermark (they only matter when running requests do not fit),
chunked prefill splitting a batch (it changes nothing unless episodes of one batch share blocks that an
earlier request has not reached yet), LoRA ids and cache salts (they only split keys; replay one adapter
per cache), and partial-block hits (only hybrid Mamba models enable them).

Units (:func:`episode_cost`): ``tokens`` = prefilled + generated tokens; ``flops`` = linear
``2 * N_body * (prefilled + generated)`` plus attention ``4 * n_layers * attn_width * pairs`` with
``((P + G)^2 - m^2) / 2`` query-key pairs per call (decode attends over the growing context);
``usd`` = a prompt-cache price (uncached input, cache reads at a fraction, output).
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ctxrl.errors import ConfigError, UsageError

__all__ = [
    "ModelGeometry",
    "PrefixCache",
    "Prices",
    "Step",
    "StepTokens",
    "episode_cost",
    "replay_episode",
    "replay_suffix_reuse",
    "step_flops",
]

Unit = Literal["tokens", "flops", "usd"]


@dataclass(frozen=True)
class Step:
    """One model call: the prompt ids it consumed and what it generated.

    ``generated`` is the generated token ids, or only their count when the ids are not kept; with a count,
    the generated blocks still take cache capacity but can never be hit (their content is unknown).
    """

    prompt_ids: Sequence[int]
    generated: Sequence[int] | int

    @property
    def num_generated(self) -> int:
        """Number of generated tokens."""
        return self.generated if isinstance(self.generated, int) else len(self.generated)


@dataclass(frozen=True)
class StepTokens:
    """Token counts of one call: ``prefilled = prompt - cached``."""

    prompt: int
    cached: int
    generated: int

    @property
    def prefilled(self) -> int:
        """Prompt tokens computed in this call (not served from the cache)."""
        return self.prompt - self.cached


def _as_step(step: Step | tuple[Sequence[int], Sequence[int] | int]) -> Step:
    return step if isinstance(step, Step) else Step(step[0], step[1])


def block_keys(token_ids: Sequence[int], block_size: int, n_blocks: int | None = None) -> list[bytes]:
    """Chained keys of the full blocks of ``token_ids``: key ``i`` depends on tokens ``[0, (i+1)*block_size)``."""
    n = len(token_ids) // block_size if n_blocks is None else n_blocks
    keys: list[bytes] = []
    parent = b""
    for i in range(n):
        block = array("q", token_ids[i * block_size : (i + 1) * block_size]).tobytes()
        parent = hashlib.blake2b(parent + block, digest_size=16).digest()
        keys.append(parent)
    return keys


class _Request:
    """A request in flight: its blocks and how many of them are keyed."""

    def __init__(self, tokens: list[int] | None, prompt_len: int, num_generated: int) -> None:
        self.tokens = tokens  # prompt + generated ids; None when the generated ids are unknown
        self.prompt_len = prompt_len
        self.num_generated = num_generated
        self.blocks: list[int] = []
        self.num_keyed = 0
        self.computed = 0
        self.keys: list[bytes] = []


class PrefixCache:
    """A vLLM-style prefix cache (see the module docstring for the rules and their sources).

    ``capacity_blocks=None`` never evicts. State persists across calls, so one cache can replay several
    episodes (or a shared engine's history); :meth:`reset` empties it like ``LLM.reset_prefix_cache``.

    >>> cache = PrefixCache(block_size=4)
    >>> cache.step(list(range(10)), [100, 101, 102]).cached   # cold cache
    0
    >>> cache.step(list(range(10)) + [100, 101, 102, 7], 1).cached  # 12 computed tokens = 3 full blocks
    12
    """

    def __init__(self, block_size: int = 16, capacity_blocks: int | None = None) -> None:
        if block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {block_size}")
        if capacity_blocks is not None and capacity_blocks < 1:
            raise ConfigError(f"capacity_blocks must be >= 1 or None, got {capacity_blocks}")
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self.reset()

    def reset(self) -> None:
        """Forget every cached block (all blocks become free and unkeyed)."""
        self._next_id = 0
        self._opaque = 0
        self._plain_free = math.inf if self.capacity_blocks is None else float(self.capacity_blocks)
        self._lru: OrderedDict[int, None] = OrderedDict()  # free keyed blocks, front = evicted first
        self._by_key: dict[bytes, dict[int, None]] = {}  # key -> blocks holding it, oldest first
        self._key_of: dict[int, bytes] = {}
        self._refs: dict[int, int] = {}

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that currently hold a key (in use or free)."""
        return len(self._key_of)

    def cached_prefix_blocks(self, token_ids: Sequence[int]) -> int:
        """How many leading full blocks of ``token_ids`` are cached now (no cap, no state change)."""
        n = 0
        for key in block_keys(token_ids, self.block_size):
            if key not in self._by_key:
                break
            n += 1
        return n

    # -- block pool ---------------------------------------------------------------------------------
    def _num_free(self) -> float:
        return self._plain_free + len(self._lru)

    def _take_block(self) -> int:
        if self._plain_free >= 1:
            self._plain_free -= 1
        elif self._lru:
            victim, _ = self._lru.popitem(last=False)
            self._drop_key(victim)
        else:
            raise UsageError(
                f"the prefix cache ran out of blocks (capacity {self.capacity_blocks}); the running "
                "requests need more blocks than that, which vLLM would resolve by queueing or preemption "
                "(not modelled): raise capacity_blocks or replay fewer requests at once"
            )
        block = self._next_id
        self._next_id += 1
        self._refs[block] = 1
        return block

    def _drop_key(self, block: int) -> None:
        key = self._key_of.pop(block)
        holders = self._by_key[key]
        del holders[block]
        if not holders:
            del self._by_key[key]

    def _set_key(self, block: int, key: bytes) -> None:
        self._key_of[block] = key
        self._by_key.setdefault(key, {})[block] = None

    def _touch(self, block: int) -> None:
        if self._refs[block] == 0:
            del self._lru[block]
        self._refs[block] += 1

    def _free(self, blocks: Iterable[int]) -> None:
        for block in blocks:
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if block in self._key_of:
                    self._lru[block] = None
                else:
                    del self._refs[block]
                    self._plain_free += 1

    # -- requests -----------------------------------------------------------------------------------
    def _admit(self, step: Step) -> tuple[_Request, int]:
        """Look up, touch the hit, allocate and key the prompt blocks (vLLM does this at scheduling)."""
        bs = self.block_size
        prompt = list(step.prompt_ids)
        if not prompt:
            raise UsageError("a step has an empty prompt; every model call consumes at least one token")
        tokens = None if isinstance(step.generated, int) else prompt + list(step.generated)
        req = _Request(tokens, len(prompt), step.num_generated)
        req.keys = block_keys(prompt, bs)
        hit: list[int] = []
        for key in req.keys[: (len(prompt) - 1) // bs]:
            holders = self._by_key.get(key)
            if not holders:
                break
            hit.append(next(iter(holders)))
        for block in hit:
            self._touch(block)
        req.blocks = hit
        req.num_keyed = len(hit)
        cached = len(hit) * bs
        self._grow(req, len(prompt))
        return req, cached

    def _grow(self, req: _Request, computed: int) -> None:
        """Give ``req`` slots for ``computed`` tokens and key the blocks that are full."""
        need = -(-computed // self.block_size) - len(req.blocks)
        if need > self._num_free():
            raise UsageError(
                f"the prefix cache ran out of blocks (capacity {self.capacity_blocks}): a request needs "
                f"{need} more blocks, {int(self._num_free())} are free; vLLM would queue or preempt "
                "(not modelled): raise capacity_blocks or replay fewer requests at once"
            )
        req.blocks.extend(self._take_block() for _ in range(need))
        req.computed = computed
        n_full = computed // self.block_size
        if n_full > len(req.keys):
            req.keys = self._keys_for(req, n_full)
        for i in range(req.num_keyed, n_full):
            self._set_key(req.blocks[i], req.keys[i])
        req.num_keyed = max(req.num_keyed, n_full)

    def _keys_for(self, req: _Request, n_full: int) -> list[bytes]:
        if req.tokens is not None:
            return block_keys(req.tokens, self.block_size, n_full)
        # Unknown generated ids: keys unique to this request, so they never hit.
        extra = []
        for _ in range(len(req.keys), n_full):
            self._opaque += 1
            extra.append(b"opaque" + self._opaque.to_bytes(8, "little"))
        return req.keys + extra

    def batch(self, steps: Sequence[Step | tuple[Sequence[int], Sequence[int] | int]]) -> list[StepTokens]:
        """Run requests submitted together (one ``LLM.generate`` call) and return their token counts.

        Each request is looked up and its prompt blocks keyed in submission order, so a later request hits
        an earlier one's prompt blocks; decode then advances all requests one token per round, and each
        request frees its blocks (tail first) when its last token is sampled, in submission order.
        """
        reqs: list[_Request] = []
        out: list[StepTokens] = []
        for raw in steps:
            step = _as_step(raw)
            req, cached = self._admit(step)
            reqs.append(req)
            out.append(StepTokens(prompt=req.prompt_len, cached=cached, generated=req.num_generated))
        # Round 0 is the prefill (it samples token 1); round r >= 1 feeds token r and samples token r + 1.
        # Slots for a round are allocated for every request before any request of that round is freed.
        for rnd in range(max((max(r.num_generated, 1) for r in reqs), default=0)):
            for req in reqs:
                if 1 <= rnd < req.num_generated:
                    self._grow(req, req.prompt_len + rnd)
            for req in reqs:
                if rnd == max(req.num_generated, 1) - 1:
                    self._free(reversed(req.blocks))
        return out

    def step(self, prompt_ids: Sequence[int], generated: Sequence[int] | int) -> StepTokens:
        """Run one request alone; return its prompt, cached and generated token counts."""
        return self.batch([Step(prompt_ids, generated)])[0]


def replay_episode(
    steps: Iterable[Step | tuple[Sequence[int], Sequence[int] | int]],
    *,
    block_size: int = 16,
    capacity_blocks: int | None = None,
    cache: PrefixCache | None = None,
) -> list[StepTokens]:
    """Replay an episode's calls one at a time through a prefix cache; return per-step token counts.

    ``steps`` are ``Step``s or ``(prompt_ids, generated_ids_or_count)`` pairs in call order. A fresh cache
    is used unless ``cache`` is given (then ``block_size`` and ``capacity_blocks`` are ignored and the
    cache keeps its state).

    >>> sys = list(range(40))
    >>> [s.cached for s in replay_episode([(sys, 8), (sys + list(range(8)) + [1, 2], 8)], block_size=16)]
    [0, 32]
    """
    sim = cache if cache is not None else PrefixCache(block_size, capacity_blocks)
    return [sim.step(s.prompt_ids, s.generated) for s in map(_as_step, steps)]


def replay_suffix_reuse(
    steps: Iterable[Step | tuple[Sequence[int], Sequence[int] | int]],
    *,
    block_size: int = 16,
    max_spans_per_step: int = 4,
) -> list[StepTokens]:
    """What-if: a prefix cache (unbounded) plus reuse of spans that survive an edit elsewhere in the prompt.

    After the usual prefix hit, the rest of the prompt is matched greedily against every token sequence
    computed earlier in the episode (each call's prompt and generated ids, less the never-fed last token):
    at each position the most recent earlier occurrence of the next ``block_size`` tokens is extended as far
    as it matches. A span counts in whole blocks (its length rounded down to a multiple of ``block_size``),
    at most ``max_spans_per_step`` spans count per call (the longest), and the last prompt token is always
    computed. This is an upper bound on what a serving stack that relocates KV (position re-encoding) saves;
    it never caches less than :func:`replay_episode` with unbounded capacity.

    >>> a, b, c = list(range(0, 32)), list(range(100, 132)), list(range(200, 264))
    >>> [s.cached for s in replay_suffix_reuse([(a + b + c, 1), (a + [7] + c + [9], 1)], block_size=16)]
    [0, 96]
    """
    if max_spans_per_step < 0:
        raise ConfigError(f"max_spans_per_step must be >= 0, got {max_spans_per_step}")
    bs = block_size
    prefix = PrefixCache(bs)
    # Every earlier computed sequence, compactly; each block-long gram points at its most recent occurrence
    # (re-pointing keeps the index as large as the distinct content, not steps × context).
    seqs: list[array[int]] = []
    index: dict[tuple[int, ...], tuple[int, int]] = {}
    out: list[StepTokens] = []
    for step in map(_as_step, steps):
        prompt = list(step.prompt_ids)
        base = prefix.step(prompt, step.generated)
        limit = len(prompt) - 1  # the last prompt token always runs
        spans: list[int] = []
        j = base.cached
        while j + bs <= limit:
            found = index.get(tuple(prompt[j : j + bs]))
            if found is None:
                j += 1
                continue
            seq = seqs[found[0]]
            k, n = found[1], bs
            while j + n < limit and k + n < len(seq) and seq[k + n] == prompt[j + n]:
                n += 1
            spans.append(n // bs * bs)
            j += n
        reused = sum(sorted(spans, reverse=True)[:max_spans_per_step])
        out.append(StepTokens(prompt=len(prompt), cached=base.cached + reused, generated=base.generated))
        computed = array("q", prompt)
        if not isinstance(step.generated, int):  # the last generated token is never fed back
            computed.extend(list(step.generated)[: max(step.num_generated - 1, 0)])
        seqs.append(computed)
        for off in range(len(computed) - bs + 1):
            index[tuple(computed[off : off + bs])] = (len(seqs) - 1, off)
    return out


@dataclass(frozen=True)
class ModelGeometry:
    """What the FLOPs formula needs: non-embedding parameters, layers, and query width (heads × head dim)."""

    n_body: int
    n_layers: int
    attn_width: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | Any) -> ModelGeometry:
        """Geometry of a dense decoder (Llama / Qwen2 / Qwen3 / Mistral style) from its HF config.

        ``config`` is a ``config.json`` dict or a ``transformers`` config. ``n_body`` counts attention
        (q, k, v, o, their biases when ``attention_bias``, Qwen3's q/k norms), a gated MLP
        (3 × hidden × intermediate), two norms per layer and the final norm; embeddings and the LM head are
        excluded. Raises ``ConfigError`` for mixture-of-experts configs or missing fields (build a
        ``ModelGeometry`` by hand, or use :meth:`from_model`).

        >>> g = ModelGeometry.from_config({"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2,
        ...     "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4})
        >>> (g.n_body, g.n_layers, g.attn_width)
        (1192, 2, 8)
        """
        cfg = dict(config) if isinstance(config, Mapping) else config.to_dict()
        if "text_config" in cfg and "hidden_size" not in cfg:
            cfg = dict(cfg["text_config"])
        for moe in ("num_experts", "num_local_experts", "n_routed_experts"):
            if (cfg.get(moe) or 0) > 1:
                raise ConfigError(
                    f"config has {moe}={cfg[moe]}: mixture-of-experts FLOPs are not derived from a config; "
                    "pass ModelGeometry(n_body=<active non-embedding params>, n_layers=..., attn_width=...)"
                )
        try:
            h = int(cfg["hidden_size"])
            inter = int(cfg["intermediate_size"])
            layers = int(cfg["num_hidden_layers"])
            heads = int(cfg["num_attention_heads"])
        except KeyError as err:
            raise ConfigError(
                f"model config lacks {err.args[0]!r}; cannot derive the FLOPs geometry"
            ) from None
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or h // heads)
        q, kv = heads * head_dim, kv_heads * head_dim
        attn = h * q + 2 * h * kv + q * h
        if cfg.get("attention_bias") or cfg.get("model_type") == "qwen2":
            attn += q + 2 * kv
        if cfg.get("model_type") == "qwen3":
            attn += 2 * head_dim  # q_norm, k_norm
        per_layer = attn + 3 * h * inter + 2 * h
        return cls(n_body=layers * per_layer + h, n_layers=layers, attn_width=q)

    @classmethod
    def from_model(cls, model: Any) -> ModelGeometry:
        """Geometry by counting a loaded model's parameters (anything with ``named_parameters`` and ``config``).

        Parameters whose name contains ``embed`` or ``lm_head`` are excluded from ``n_body``.
        """
        n_body = sum(
            p.numel() for name, p in model.named_parameters() if "embed" not in name and "lm_head" not in name
        )
        geo = cls.from_config(model.config)
        return cls(n_body=int(n_body), n_layers=geo.n_layers, attn_width=geo.attn_width)


@dataclass(frozen=True)
class Prices:
    """A prompt-cache price list, per million tokens (relative units unless you plug in a vendor's)."""

    input_per_mtok: float = 1.0
    """Uncached prompt tokens."""
    output_per_mtok: float = 4.0
    """Generated tokens."""
    cache_read_fraction: float = 0.1
    """Cached prompt tokens cost this fraction of the input price (Anthropic: 0.1)."""
    cache_write_factor: float = 1.0
    """Uncached prompt tokens cost this multiple of the input price (Anthropic 5-minute cache: 1.25)."""


def step_flops(step: StepTokens, geometry: ModelGeometry) -> float:
    """FLOPs of one call: ``2·N_body·(prefilled+generated) + 4·n_layers·attn_width·((P+G)² − m²)/2``.

    >>> step_flops(StepTokens(prompt=10, cached=4, generated=2), ModelGeometry(100, 2, 8))
    5696.0
    """
    linear = 2.0 * geometry.n_body * (step.prefilled + step.generated)
    length = step.prompt + step.generated
    pairs = (length * length - step.cached * step.cached) / 2.0
    return linear + 4.0 * geometry.n_layers * geometry.attn_width * pairs


def episode_cost(
    steps: Sequence[StepTokens],
    unit: Unit = "tokens",
    *,
    geometry: ModelGeometry | None = None,
    prices: Prices | None = None,
) -> float:
    """Price an episode's calls in ``unit``: ``tokens``, ``flops`` (needs ``geometry``) or ``usd``.

    ``tokens`` counts computed tokens (prefilled + generated); ``usd`` applies ``prices`` (default
    :class:`Prices`) with cache reads discounted.

    >>> steps = [StepTokens(prompt=100, cached=0, generated=10), StepTokens(prompt=150, cached=96, generated=10)]
    >>> episode_cost(steps, "tokens")
    174.0
    >>> round(episode_cost(steps, "usd") * 1e6, 2)   # 154 uncached + 0.1·96 cached + 4·20 generated
    243.6
    """
    if unit == "tokens":
        return float(sum(s.prefilled + s.generated for s in steps))
    if unit == "flops":
        if geometry is None:
            raise UsageError("episode_cost(unit='flops') needs geometry=ModelGeometry.from_config(...)")
        return float(sum(step_flops(s, geometry) for s in steps))
    if unit == "usd":
        p = prices or Prices()
        total = sum(
            s.prefilled * p.input_per_mtok * p.cache_write_factor
            + s.cached * p.input_per_mtok * p.cache_read_fraction
            + s.generated * p.output_per_mtok
            for s in steps
        )
        return total / 1e6
    raise UsageError(f"unknown cost unit {unit!r}; use 'tokens', 'flops' or 'usd'")
