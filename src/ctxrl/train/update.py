"""The update: one optimiser step's forward, loss and backward over a layout of rows.

    sizes = layout_sizes(policy)                                      # geometry for pricing layouts
    units = make_layout(rows, "auto", 8192, pad_id, sizes)            # shared prefixes / packed / padded
    result = backward_layout(model, units, loss_config, num_loss_tokens=n)   # gradients accumulate
    optimizer.step()

The trainer (:func:`ctxrl.train.grpo.train`, through :func:`grpo_update`: the parts, layouts, global token
count, clip and optimiser step of one rollout), the TRL parity test and ``ctxrl bench train`` all call
:func:`backward_layout`, so what is tested and timed is what trains.

**A shared prefix, computed once.** A :class:`ctxrl.train.rows.LayoutUnit` with a prefix runs it once, with
the KV cache on. Its keys and values become leaf tensors that every suffix microbatch attends to (expanded to
the batch, not copied), so each suffix's backward leaves the gradient of the prefix's keys and values in those
leaves; after the unit's last suffix, one backward through the prefix carries the summed gradient into the
weights. The result is the gradient of the rows laid out whole, exactly (within float rounding): the prefix's
activations are the same for every row, and the chain rule sums over their uses.

**Logits only where the loss is.** Every forward passes the microbatch's loss mask to
:func:`ctxrl.train.logprobs.token_logprobs`, which runs the LM head and log-softmax at the positions that
predict a loss token only. Entropy, the old and the reference logprobs are taken at the same positions.

**Processes.** Under DDP every rank must run the same number of backward passes (DDP all-reduces on the
last): the caller pads the units to the same count with :func:`empty_unit` and gives ``sync(last)``, the
context each pass runs in (``accelerator.no_sync`` until the last). A shared prefix adds a second backward
per unit, which DDP's once-per-forward reducer does not allow, so :func:`make_layout` shares prefixes only in
a single process (``shared_ok``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ctxrl.errors import ConfigError
from ctxrl.rewards.cost import ModelGeometry
from ctxrl.train.attention import prefix_attention, supports_prefix_attention
from ctxrl.train.compile import eager_cache_class
from ctxrl.train.config import TrainConfig
from ctxrl.train.logprobs import packing_supported, token_logprobs
from ctxrl.train.loss import LossConfig, LossStats, policy_loss, token_mean_scale
from ctxrl.train.rows import (
    LayoutKind,
    LayoutSizes,
    LayoutUnit,
    Microbatch,
    Row,
    build_layout,
    cheapest_layout,
    pad_rows,
    plain_units,
    split_by_episode,
)

Packing = str
"""``auto``, ``shared``, ``packed`` or ``padded`` (``TrainConfig.packing``)."""


def layout_sizes(model: Any) -> LayoutSizes | None:
    """The geometry :func:`ctxrl.train.rows.cheapest_layout` prices with; None when it is unknown (e.g. a
    mixture of experts)."""
    try:
        geometry = ModelGeometry.from_config(model.config)
    except ConfigError:
        return None
    head = model.get_output_embeddings()
    return LayoutSizes(
        body_params=geometry.n_body,
        head_params=int(head.weight.numel()) if head is not None else 0,
        n_layers=geometry.n_layers,
        attn_width=geometry.attn_width,
    )


def two_part_runs(model: Any, enabled: bool) -> bool:
    """Whether an update of ``model`` with ``train.two_part_attention`` / ``sft.two_part_attention`` set to
    ``enabled`` really attends in two parts (:func:`ctxrl.train.attention.prefix_attention` leaves other
    devices and sliding-window models to their own attention): how :func:`make_layout` should price it."""
    return enabled and supports_prefix_attention(model)


def make_layout(
    rows: Sequence[Row],
    packing: Packing,
    max_tokens: int,
    pad_id: int,
    sizes: LayoutSizes | None,
    *,
    packs: bool = True,
    shared_ok: bool = True,
    two_part: bool = False,
) -> list[LayoutUnit]:
    """The units of one update. ``packing: auto`` prices every layout the model and the process allow (shared
    prefixes when ``shared_ok``, packed lines when the model honours packing, ``packs``) and takes the
    cheapest; with unknown ``sizes`` it takes the first allowed of shared, packed, padded. ``two_part``: the
    update will attend to shared prefixes in two parts (:func:`two_part_runs`), so they are priced so."""
    kinds: list[LayoutKind] = []
    if shared_ok:
        kinds.append("shared")
    if packs:
        kinds.append("packed")
    kinds.append("padded")
    if packing != "auto":
        if packing not in ("shared", "packed", "padded"):
            raise ConfigError(f"packing must be auto, shared, packed or padded, got {packing!r}")
        if packing not in kinds:
            why = "a single process" if packing == "shared" else "a model that honours position-id packing"
            raise ConfigError(f"packing: {packing} needs {why}; use packing: auto")
        return build_layout(rows, packing, max_tokens, pad_id)
    if sizes is None:
        return build_layout(rows, kinds[0], max_tokens, pad_id)
    return cheapest_layout(rows, max_tokens, pad_id, sizes, kinds, two_part=two_part)


def empty_unit(pad_id: int) -> LayoutUnit:
    """Two pad tokens with no loss: keeps a rank with fewer microbatches in step with DDP's syncs."""
    empty = Row([pad_id, pad_id], [0, 0], [0.0, 0.0], [0.0, 0.0], [0, 0], [], -1, -1, ())
    return plain_units(pad_rows([empty], 2, pad_id))[0]


def microbatch_tensors(mb: Microbatch, device: Any) -> dict[str, torch.Tensor]:
    """The arrays of ``mb`` as tensors on ``device`` (the model's attention mask covers a shared prefix)."""
    tensors = {
        "input_ids": torch.from_numpy(mb.input_ids).to(device),
        "position_ids": torch.from_numpy(mb.position_ids).to(device),
        "loss_mask": torch.from_numpy(mb.loss_mask).float().to(device),
        "old_logprobs": torch.from_numpy(mb.old_logprobs).float().to(device),
        "advantages": torch.from_numpy(mb.advantages).float().to(device),
    }
    if mb.attention_mask is not None:
        mask = torch.from_numpy(mb.attention_mask).to(device)
        if mb.prefix_len:
            mask = torch.cat([mask.new_ones(mask.shape[0], mb.prefix_len), mask], dim=1)
        tensors["attention_mask"] = mask
    return tensors


# ---- the shared prefix: its keys and values, once ------------------------------------------------------


@dataclass
class PrefixState:
    """A prefix's forward: its keys and values per layer, and leaves that collect their gradients."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    """The prefix's keys and values as computed (attached to its graph when gradients flow)."""
    leaves: list[tuple[torch.Tensor, torch.Tensor]]
    """Detached copies the suffixes attend to; their ``.grad`` sums every suffix's gradient."""

    config: Any = None
    """The model's config (a cache built from it knows each layer's kind)."""
    redo: Callable[[], list[tuple[torch.Tensor, torch.Tensor]]] | None = None
    """Set when the forward ran without a graph (``recompute``): runs it again with one, for the backward."""
    two_part: bool = False
    """Forwards that continue this prefix attend to it in two parts, without a mask
    (:mod:`ctxrl.train.attention`; ``train.two_part_attention``)."""

    def cache(self, batch: int) -> Any:
        """A transformers cache holding the prefix once per line of a ``batch``-line microbatch (views)."""
        cache = eager_cache_class()(config=self.config)
        for i, (k, v) in enumerate(self.leaves):
            cache.update(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1), i)
        return cache

    def backward(self) -> None:
        """Carry the leaves' summed gradient through the prefix into the weights (after recomputing the
        prefix's forward with a graph, when it ran without one)."""
        kv = self.redo() if self.redo is not None else self.kv
        outputs, grads = [], []
        for (k, v), (lk, lv) in zip(kv, self.leaves):
            for t, leaf in ((k, lk), (v, lv)):
                if leaf.grad is not None and t.requires_grad:
                    outputs.append(t)
                    grads.append(leaf.grad)
        if outputs:
            torch.autograd.backward(outputs, grads)


def _cache_pairs(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers]
    return list(zip(cache.key_cache, cache.value_cache))  # older transformers


def prefix_forward(
    model: Any,
    prefix_ids: np.ndarray,
    device: Any,
    parent: PrefixState | None = None,
    offset: int = 0,
    *,
    recompute: bool = False,
    two_part: bool = False,
) -> PrefixState:
    """Run ``prefix_ids`` ``(1, P)`` once with the cache on (no logits); gradients flow if enabled. After a
    ``parent`` prefix of ``offset`` tokens, it attends to the parent's leaves, and its keys and values hold
    the parent's and its own (so its backward hands the parent's share to the parent's leaves).

    ``recompute``: the forward runs without a graph and again, with one, in :meth:`PrefixState.backward`
    — the prefix's activations are not held while every row below it runs (one more forward of its tokens).
    ``two_part``: this prefix's forward after its parent, and every forward that continues it, attends in two
    parts without a mask where the model allows (:func:`ctxrl.train.attention.prefix_attention`).
    """
    ids = torch.from_numpy(prefix_ids).to(device)

    def run() -> list[tuple[torch.Tensor, torch.Tensor]]:
        # the root's cache is one of ours too: its update stays out of compiled graphs (ctxrl.train.compile)
        cache = eager_cache_class()(config=model.config) if parent is None else parent.cache(1)
        with prefix_attention(model, enabled=two_part and parent is not None):
            out = model(
                input_ids=ids,
                position_ids=torch.arange(offset, offset + ids.shape[1], device=device)[None],
                use_cache=True,
                logits_to_keep=torch.zeros(0, dtype=torch.long, device=device),
                past_key_values=cache,
            )
        return _cache_pairs(out.past_key_values)

    grad = torch.is_grad_enabled()
    redo: Callable[[], list[tuple[torch.Tensor, torch.Tensor]]] | None = None
    if recompute and grad:
        with torch.no_grad():
            kv = run()
        redo = run
    else:
        kv = run()
    leaves = [(k.detach().requires_grad_(grad), v.detach().requires_grad_(grad)) for k, v in kv]
    return PrefixState(
        kv=[] if redo is not None else kv,
        leaves=leaves,
        config=getattr(model, "config", None),
        redo=redo,
        two_part=two_part,
    )


def microbatch_logprobs(
    model: Any,
    mb: Microbatch,
    tensors: dict[str, torch.Tensor],
    prefix: PrefixState | None,
    *,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs (and entropies) of ``mb`` at its loss positions, after ``prefix`` for a suffix batch."""
    two_part = prefix is not None and prefix.two_part and mb.kind != "packed"
    with prefix_attention(model, enabled=two_part):
        return token_logprobs(
            model,
            tensors["input_ids"],
            tensors["position_ids"],
            tensors.get("attention_mask"),
            with_entropy=with_entropy,
            loss_mask=tensors["loss_mask"],
            past_key_values=None if prefix is None else prefix.cache(mb.input_ids.shape[0]),
            right_padded=mb.kind != "packed",
        )


@torch.no_grad()
def layout_logprobs(
    model: Any, units: Sequence[LayoutUnit], device: Any, *, two_part: bool = False
) -> list[list[torch.Tensor]]:
    """Logprobs at the loss positions of every microbatch of ``units``, without gradients (old or
    reference logprobs), ``[unit][microbatch]``. ``two_part``: as :func:`prefix_forward`'s."""

    def visit(unit: LayoutUnit, parent: PrefixState | None, into: list[torch.Tensor]) -> None:
        prefix = (
            prefix_forward(model, unit.prefix_ids, device, parent, unit.offset, two_part=two_part)
            if unit.prefix_len
            else parent
        )
        for child in unit.children:
            visit(child, prefix, into)
        into.extend(
            microbatch_logprobs(model, mb, microbatch_tensors(mb, device), prefix)[0] for mb in unit.batches
        )

    out: list[list[torch.Tensor]] = []
    for unit in units:
        out.append([])
        visit(unit, None, out[-1])
    return out


# ---- the backward over a layout -------------------------------------------------------------------------


@dataclass
class BackwardResult:
    """Sums over the layout's loss tokens (add across ranks before dividing)."""

    stats: LossStats
    entropy_sum: float
    loss: float
    """The step's loss (this process's share of the token mean)."""


def _no_context(last: bool) -> contextlib.AbstractContextManager[Any]:
    return contextlib.nullcontext()


MicrobatchLoss = Callable[[int, int, dict[str, torch.Tensor], torch.Tensor], tuple[torch.Tensor, LossStats]]
"""``loss(unit_index, microbatch_index, tensors, logprobs) -> (loss, stats)`` of one microbatch."""


def _backward_units(
    model: Any,
    units: Sequence[LayoutUnit],
    loss_of: MicrobatchLoss,
    *,
    device: Any,
    scale: float,
    backward: Callable[[torch.Tensor], None] | None,
    sync: Callable[[bool], contextlib.AbstractContextManager[Any]],
    before_unit: Callable[[LayoutUnit], None] | None = None,
    with_entropy: bool = True,
    recompute_prefixes: bool = False,
    two_part: bool = False,
) -> BackwardResult:
    """The loop every update runs: per unit its prefix once, its children (each after its own prefix, which
    attends to the parent's), each microbatch's forward, loss and backward, then the prefix's own backward —
    after everything below it, so its leaves hold every use's gradient. Microbatches are numbered in that
    order within a unit (:meth:`LayoutUnit.all_batches`)."""
    run_backward = backward or (lambda loss: loss.backward())
    sums = {"entropy": 0.0, "loss": 0.0}
    stats = LossStats()

    def visit(
        u: int, unit: LayoutUnit, parent: PrefixState | None, counter: list[int], last_unit: bool
    ) -> None:
        nonlocal stats
        own = (
            prefix_forward(
                model,
                unit.prefix_ids,
                device,
                parent,
                unit.offset,
                recompute=recompute_prefixes,
                two_part=two_part,
            )
            if unit.prefix_len
            else None
        )
        prefix = own if own is not None else parent
        for child in unit.children:
            visit(u, child, prefix, counter, False)
        for j, mb in enumerate(unit.batches):
            i = counter[0]
            counter[0] += 1
            last = last_unit and j == len(unit.batches) - 1 and prefix is None
            with sync(last):
                tensors = microbatch_tensors(mb, device)
                logprobs, entropy = microbatch_logprobs(model, mb, tensors, prefix, with_entropy=with_entropy)
                loss, mb_stats = loss_of(u, i, tensors, logprobs)
                run_backward(loss * scale)
            stats += mb_stats
            if entropy is not None:
                sums["entropy"] += float((entropy * tensors["loss_mask"]).sum())
            sums["loss"] += float(loss.detach())
        if own is not None:
            with sync(last_unit and parent is None):
                own.backward()

    for u, unit in enumerate(units):
        if before_unit is not None:
            before_unit(unit)
        visit(u, unit, None, [0], u == len(units) - 1)
    return BackwardResult(stats=stats, entropy_sum=sums["entropy"], loss=sums["loss"])


def backward_layout(
    model: Any,
    units: Sequence[LayoutUnit],
    loss_config: LossConfig,
    *,
    num_loss_tokens: float,
    device: Any = None,
    scale: float = 1.0,
    old_logprobs: Sequence[Sequence[torch.Tensor]] | None = None,
    reference: Callable[[LayoutUnit], list[torch.Tensor]] | None = None,
    backward: Callable[[torch.Tensor], None] | None = None,
    sync: Callable[[bool], contextlib.AbstractContextManager[Any]] = _no_context,
    recompute_prefixes: bool = False,
    two_part: bool = False,
) -> BackwardResult:
    """The policy-gradient update: forward, :func:`ctxrl.train.loss.policy_loss` and backward over every
    microbatch of ``units``; gradients accumulate in ``model``.

    ``num_loss_tokens``: the loss-token count of the whole optimiser step (every rank); ``scale`` multiplies
    each loss before its backward (DDP: the world size, :func:`ctxrl.train.loss.token_mean_scale`).
    ``old_logprobs[u][i]``: the trainer's logprobs before this step (None: on-policy). ``reference(unit)``:
    reference logprobs of the unit's microbatches (required when ``loss_config.kl_coef > 0``).
    ``backward(loss)`` runs a backward (default ``loss.backward()``; pass ``accelerator.backward``);
    ``sync(last)`` is the context of each pass (see the module docstring). ``recompute_prefixes``: each
    shared prefix's forward runs again in its backward instead of holding its graph
    (``train.recompute_prefixes``, :func:`prefix_forward`). ``two_part``: suffixes attend to their prefix
    in two parts without a mask where the model allows (``train.two_part_attention``, :func:`prefix_forward`).
    """
    refs: list[torch.Tensor] | None = None

    def take_reference(unit: LayoutUnit) -> None:
        nonlocal refs
        refs = reference(unit) if reference is not None else None

    def loss_of(
        u: int, i: int, tensors: dict[str, torch.Tensor], logprobs: torch.Tensor
    ) -> tuple[torch.Tensor, LossStats]:
        out = policy_loss(
            logprobs,
            None if old_logprobs is None or u >= len(old_logprobs) else old_logprobs[u][i],
            tensors["old_logprobs"],
            tensors["advantages"],
            tensors["loss_mask"],
            loss_config,
            num_loss_tokens=num_loss_tokens,
            ref_logprobs=None if refs is None else refs[i],
        )
        return out.loss, out.stats

    return _backward_units(
        model,
        units,
        loss_of,
        device=device if device is not None else next(model.parameters()).device,
        scale=scale,
        backward=backward,
        sync=sync,
        before_unit=take_reference,
        recompute_prefixes=recompute_prefixes,
        two_part=two_part,
    )


def nll_backward(
    model: Any,
    units: Sequence[LayoutUnit],
    *,
    num_loss_tokens: float,
    device: Any = None,
    two_part: bool = False,
) -> BackwardResult:
    """The supervised update: token-mean cross-entropy ``−Σ mask · log p / num_loss_tokens`` over the loss
    tokens of ``units`` (the same layouts, prefixes and LM-head positions as :func:`backward_layout`);
    ``loss`` is this pass's share of the mean NLL, ``stats.loss_sum`` the summed NLL. ``two_part``: rows
    attend to their shared prefixes in two parts (:mod:`ctxrl.train.attention`, ``train.two_part_attention``)."""

    def loss_of(
        u: int, i: int, tensors: dict[str, torch.Tensor], logprobs: torch.Tensor
    ) -> tuple[torch.Tensor, LossStats]:
        mask = tensors["loss_mask"]
        nll = -(logprobs * mask).sum()
        return nll / num_loss_tokens, LossStats(tokens=float(mask.sum()), loss_sum=float(nll.detach()))

    return _backward_units(
        model,
        units,
        loss_of,
        device=device if device is not None else next(model.parameters()).device,
        scale=1.0,
        backward=None,
        sync=_no_context,
        with_entropy=False,  # supervised training logs no entropy: no second pass over the logits
        two_part=two_part,
    )


@dataclass
class UpdateResult:
    """One rollout's optimiser step(s): the summed loss statistics, entropy and gradient norms, and the
    layouts the rows ran in (for the cost metrics)."""

    stats: LossStats
    entropy_sum: float
    grad_norms: list[float]
    layouts: list[list[LayoutUnit]]


def packs_lines(config: TrainConfig, model: Any) -> bool:
    """Whether the update may pack rows into one line: asked for (``packed``), or allowed (``auto`` /
    ``shared``) and the model honours position-id packing (:func:`ctxrl.train.logprobs.packing_supported`)."""
    return config.packing == "packed" or (config.packing in ("auto", "shared") and packing_supported(model))


def precision_context(mixed_precision: str, device: Any) -> contextlib.AbstractContextManager[Any]:
    """The context the update's passes run in: bfloat16 autocast for ``mixed_precision="bf16"`` (matmuls and
    attention in bfloat16, weights and gradients float32; the log-softmax of :func:`token_logprobs` runs on
    float32 logits), nothing for ``"no"``."""
    if mixed_precision == "no":
        return contextlib.nullcontext()
    if mixed_precision != "bf16":
        raise ValueError(f"mixed_precision must be 'no' or 'bf16', got {mixed_precision!r}")
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def grpo_update(
    acc: Any,
    model: Any,
    optimizer: Any,
    rows: Sequence[Row],
    config: TrainConfig,
    *,
    pad_id: int,
    sizes: LayoutSizes | None,
    packs: bool,
    shared_ok: bool,
    reference: Callable[[LayoutUnit], list[torch.Tensor]] | None = None,
) -> UpdateResult:
    """The update of one rollout: ``rows`` in ``config.updates_per_rollout`` parts of whole episodes, each
    laid out (``config.packing``, at most ``max_tokens_per_microbatch`` tokens a pass), run through
    :func:`backward_layout` with the token mean over every rank's loss tokens, clipped and stepped.

    ``acc`` is the run's accelerate ``Accelerator`` (one process: ``Accelerator(cpu=True)``); the trainer
    and ``ctxrl bench train`` / ``smollm2`` call this (the TRL parity test calls :func:`backward_layout`, its
    core, to read the gradients before the step). ``reference(unit)``: the KL term's reference logprobs
    (None without a KL). ``config.mixed_precision``: every pass runs in :func:`precision_context`."""
    layouts = [
        make_layout(
            part,
            config.packing,
            config.max_tokens_per_microbatch,
            pad_id,
            sizes,
            packs=packs,
            shared_ok=shared_ok,
            two_part=two_part_runs(model, config.two_part_attention),
        )
        for part in split_by_episode(rows, config.updates_per_rollout)
    ]
    with precision_context(config.mixed_precision, acc.device):
        return _grpo_update(acc, model, optimizer, layouts, config, pad_id=pad_id, reference=reference)


def _grpo_update(
    acc: Any,
    model: Any,
    optimizer: Any,
    layouts: list[list[LayoutUnit]],
    config: TrainConfig,
    *,
    pad_id: int,
    reference: Callable[[LayoutUnit], list[torch.Tensor]] | None,
) -> UpdateResult:
    """:func:`grpo_update` past the layout: old logprobs, then each part's backward and optimiser step."""
    from ctxrl.train.distributed import sync_context

    world = acc.num_processes
    olds = (
        [layout_logprobs(model, units, acc.device, two_part=config.two_part_attention) for units in layouts]
        if config.updates_per_rollout > 1
        else None
    )
    result = UpdateResult(LossStats(), 0.0, [], layouts)
    for u, units in enumerate(layouts):
        local = torch.tensor(sum(x.num_loss_tokens for x in units), dtype=torch.float64, device=acc.device)
        n_tokens = float(acc.reduce(local, "sum").item())
        if n_tokens == 0:
            continue  # every rank sees the same global count, so every rank skips together
        # every rank runs the same number of backward passes (DDP syncs on the last one)
        n_units = int(acc.reduce(torch.tensor(len(units), device=acc.device), "max").item())
        units = [*units, *[empty_unit(pad_id)] * (n_units - len(units))]
        out = backward_layout(
            model,
            units,
            config.loss,
            num_loss_tokens=n_tokens,
            device=acc.device,
            scale=token_mean_scale(world),
            old_logprobs=None if olds is None else olds[u],
            reference=reference,
            backward=acc.backward,
            sync=lambda last: sync_context(acc, model, last),
            recompute_prefixes=config.recompute_prefixes,
            two_part=config.two_part_attention,
        )
        result.stats += out.stats
        result.entropy_sum += out.entropy_sum
        if config.max_grad_norm is not None:
            norm = acc.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            if norm is not None:  # None under DeepSpeed before its first step
                result.grad_norms.append(float(norm))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return result
