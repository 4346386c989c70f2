"""Per-token logprobs of a causal LM over packed or padded microbatches.

    lp = token_logprobs(model, input_ids, position_ids)                        # packed: (1, T), no mask
    lp = token_logprobs(model, input_ids, position_ids, attention_mask=mask)   # padded: (B, T)

Output ``lp[b, t] = log p(input_ids[b, t] | input_ids[b, :t])`` aligned with the input (the layout of
:class:`ctxrl.train.rows.Microbatch`); ``lp[b, 0]`` and the first token of every packed row have no context
and are 0 (they are prompt tokens, never loss tokens).

**Logits only where they are used.** With a ``loss_mask`` the LM head runs only at the positions that
predict a loss token (transformers' ``logits_to_keep`` with an index tensor), so a prompt of thousands of
tokens costs the model body and nothing of the ``[T, V]`` head and log-softmax.

**Packing.** transformers (5.x) builds a block-diagonal causal mask from ``position_ids`` when no attention
mask and no KV cache are given (``masking_utils.find_packed_sequence_indices``: a new row starts wherever the
position does not increase by one), for the eager and SDPA attention paths as well as flash-attention. So a
packed forward must pass ``attention_mask=None`` and ``use_cache=False``. :func:`packing_supported` checks a
model once on two short rows; the tests check it on the tiny Qwen3 model within 1e-5.
"""

from __future__ import annotations

from typing import Any

import torch


def _row_starts(position_ids: torch.Tensor) -> torch.Tensor:
    """True where a new packed row starts (the position does not follow the previous one)."""
    prev = torch.nn.functional.pad(position_ids[:, :-1], (1, 0), value=-2)
    return position_ids != prev + 1


def head_indices(loss_mask: torch.Tensor | None, length: int) -> torch.Tensor:
    """Positions ``t`` whose logits are needed: those predicting a loss token at ``t + 1`` in any line
    (all of ``0 .. length-2`` when ``loss_mask`` is None)."""
    if loss_mask is None:
        return torch.arange(max(length - 1, 0))
    return torch.nonzero(loss_mask[:, 1:].bool().any(dim=0), as_tuple=False).flatten().cpu()


def token_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    loss_mask: torch.Tensor | None = None,
    past_key_values: Any = None,
    right_padded: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token logprobs (and optionally entropies) of ``input_ids`` under ``model``.

    Packed layout: ``attention_mask=None`` and ``position_ids`` restarting at 0 per row. Padded layout:
    ``attention_mask`` 1 on real tokens (right padding); padded positions get logprob 0. The entropy at ``t``
    is that of the distribution that predicted token ``t`` (0 where the logprob is 0). Gradients flow when
    the caller has them enabled. ``temperature`` divides the logits (1.0 for the raw distribution, which is
    what engines report).

    ``loss_mask`` (same shape): the LM head and the log-softmax run only at the positions that predict a
    loss token (the model's ``logits_to_keep``), and every other entry is 0 — no ``[T, V]`` logits for the
    prompt. ``past_key_values``: a cache of a shared prefix the lines continue (``position_ids`` then start
    at its length and ``attention_mask`` covers prefix + lines).

    ``right_padded``: the lines are right-padded, so causal attention alone keeps every real token from seeing
    a pad (pads only follow it); ``attention_mask`` then only zeroes the pads' entries and is not given to the
    model, whose attention kernel takes the causal path that skips the upper triangle instead of a dense mask.
    """
    length = input_ids.shape[1]
    keep = head_indices(loss_mask, length).to(input_ids.device)
    kwargs: dict[str, Any] = {}
    if past_key_values is not None:
        kwargs["past_key_values"] = past_key_values
    out = model(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=None if right_padded else attention_mask,
        use_cache=past_key_values is not None,
        logits_to_keep=keep,
        **kwargs,
    )
    logits = out.logits
    if logits.shape[1] != keep.numel():  # a model that ignores logits_to_keep returns every position
        logits = logits[:, keep]
    scores = logits.float()
    if temperature != 1.0:
        scores = scores / temperature
    targets = input_ids[:, keep + 1].unsqueeze(-1)
    # gather then subtract the logsumexp: no second (B, N, V) tensor for the normalised distribution
    picked = scores.gather(-1, targets).squeeze(-1) - torch.logsumexp(scores, dim=-1)
    lp = picked.new_zeros(input_ids.shape).index_copy(1, keep + 1, picked)
    valid = (
        ~_row_starts(position_ids)
        if past_key_values is None
        else torch.ones_like(input_ids, dtype=torch.bool)
    )
    valid[:, 0] = False
    if attention_mask is not None:
        valid = valid & attention_mask[:, -length:].bool()
    if loss_mask is not None:
        valid = valid & loss_mask.bool()
    lp = lp * valid
    entropy = None
    if with_entropy:
        with torch.no_grad():
            logp = torch.log_softmax(scores.detach(), dim=-1)
            ent = -(logp.exp() * logp).sum(-1)
            entropy = ent.new_zeros(input_ids.shape).index_copy(1, keep + 1, ent) * valid
    return lp, entropy


def packing_supported(model: Any, vocab_size: int | None = None, *, atol: float = 1e-5) -> bool:
    """Whether ``model`` honours position-id packing: two rows packed give the logprobs of each alone.

    Runs four forward passes of a few tokens each, without gradients. In float32 the packed logprobs must
    match within ``atol``. In a 16-bit dtype, where a different batch shape alone moves a logprob by ~1e-2,
    the packed rows must instead be ten times closer to the rows alone than the same tokens concatenated
    without the restart are (what a model that ignores packing computes).
    """
    vocab = int(vocab_size or model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(0, vocab, (1, 7), generator=gen)
    b = torch.randint(0, vocab, (1, 5), generator=gen)
    device = next(model.parameters()).device
    a, b = a.to(device), b.to(device)
    ab = torch.cat([a, b], dim=1)
    with torch.no_grad():
        lp_a, _ = token_logprobs(model, a, torch.arange(7, device=device)[None])
        lp_b, _ = token_logprobs(model, b, torch.arange(5, device=device)[None])
        packed_pos = torch.cat([torch.arange(7), torch.arange(5)])[None].to(device)
        lp_ab, _ = token_logprobs(model, ab, packed_pos)
        alone = torch.cat([lp_a, lp_b], dim=1)
        if next(model.parameters()).dtype == torch.float32:
            return bool(torch.allclose(lp_ab, alone, atol=atol))
        lp_joined, _ = token_logprobs(model, ab, torch.arange(12, device=device)[None])
    error = (lp_ab - alone)[0, 8:].abs().max()  # b's tokens after its first, which has no context
    contamination = (lp_joined - alone)[0, 8:].abs().max()
    return bool(error * 10 <= contamination)
