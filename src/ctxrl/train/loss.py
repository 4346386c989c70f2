"""The policy loss: token-level clipped ratio, token-mean, optional KL, truncated importance weights.

    out = policy_loss(logprobs, batch_old, engine_logprobs, advantages, loss_mask,
                      LossConfig(epsilon_low=0.2, epsilon_high=0.28, kl_coef=0.0, tis_cap=2.0),
                      num_loss_tokens=total_loss_tokens_of_the_step)
    out.loss.backward(); stats += out.stats

Per loss token ``t`` (all tensors ``(B, T)``, aligned token by token, entries outside ``loss_mask`` ignored):

- ``ratio = exp(logprobs − old)``, where ``old`` are the trainer's logprobs before this optimiser step
  (``None``: ``logprobs.detach()``, the on-policy case where the ratio is 1 in value and only its gradient
  matters);
- ``pg = −min(ratio · A, clip(ratio, 1 − ε_low, 1 + ε_high) · A)`` (DAPO's clip-higher: ``ε_high > ε_low``);
- truncated importance sampling (TIS) for the engine-vs-trainer mismatch: ``pg ·= min(exp(old − engine), C)``
  (detached), with ``engine`` the logprobs the rollout engine reported; off when ``tis_cap`` is None;
- optional KL to a reference policy, the k3 estimator ``exp(ref − logp) − (ref − logp) − 1`` (always ≥ 0),
  added as ``kl_coef · kl``;
- ``loss = Σ_t mask · (pg + kl_coef · kl) / num_loss_tokens``: the token mean over the *whole* optimiser
  step (every microbatch, every rank), so microbatches can be summed and the result does not depend on how
  rows were packed. Pass the global count; under DDP, which averages gradients over ranks, also multiply
  the loss by the world size (:func:`token_mean_scale`).

:class:`LossStats` holds sums, so microbatches and ranks add up before dividing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ctxrl.errors import ConfigError


@dataclass(frozen=True)
class LossConfig:
    """Hyper-parameters of :func:`policy_loss`; defaults follow the reference run (clip 0.2 / 0.28)."""

    epsilon_low: float = 0.2
    """Lower clip: the ratio is clipped at ``1 − epsilon_low``."""
    epsilon_high: float = 0.28
    """Upper clip: the ratio is clipped at ``1 + epsilon_high`` (clip-higher)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to the reference policy (the initial model; with LoRA the adapter disabled); 0
    disables it (no reference forward is needed)."""
    tis_cap: float | None = 2.0
    """Cap C of the truncated importance weight ``min(π_trainer / π_engine, C)`` for the engine-vs-trainer
    mismatch; None disables it."""

    def __post_init__(self) -> None:
        if not 0 <= self.epsilon_low < 1:
            raise ConfigError(f"epsilon_low must be in [0, 1), got {self.epsilon_low}")
        if self.epsilon_high < 0:
            raise ConfigError(f"epsilon_high must be >= 0, got {self.epsilon_high}")
        if self.kl_coef < 0:
            raise ConfigError(f"kl_coef must be >= 0 (0 disables the KL), got {self.kl_coef}")
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise ConfigError(f"tis_cap must be > 0 (or null to disable TIS), got {self.tis_cap}")


@dataclass
class LossStats:
    """Sums over loss tokens, to be added across microbatches and ranks; :meth:`metrics` divides."""

    tokens: float = 0.0
    loss_sum: float = 0.0
    """Σ mask · per-token loss (before dividing by the step's token count)."""
    clipped_low: float = 0.0
    """Tokens where the lower clip took effect (ratio < 1 − ε_low with A < 0)."""
    clipped_high: float = 0.0
    """Tokens where the upper clip took effect (ratio > 1 + ε_high with A > 0)."""
    ratio_sum: float = 0.0
    kl_sum: float = 0.0
    tis_sum: float = 0.0
    tis_capped: float = 0.0
    """Tokens whose importance weight hit the cap."""
    gap_sum: float = 0.0
    """Σ |trainer logprob − engine logprob| (the engine-vs-trainer mismatch)."""

    def __iadd__(self, other: LossStats) -> LossStats:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def as_tensor(self) -> torch.Tensor:
        """The sums as one float64 vector (for an all-reduce across ranks)."""
        return torch.tensor([getattr(self, f.name) for f in fields(self)], dtype=torch.float64)

    @classmethod
    def from_tensor(cls, values: torch.Tensor) -> LossStats:
        return cls(*[float(v) for v in values.tolist()])

    def metrics(self, prefix: str = "loss/") -> dict[str, float]:
        """Per-token means; zeros when there were no loss tokens."""
        n = self.tokens or 1.0
        return {
            f"{prefix}loss": self.loss_sum / n,
            f"{prefix}clip_frac": (self.clipped_low + self.clipped_high) / n,
            f"{prefix}clip_low_frac": self.clipped_low / n,
            f"{prefix}clip_high_frac": self.clipped_high / n,
            f"{prefix}ratio_mean": self.ratio_sum / n,
            f"{prefix}kl": self.kl_sum / n,
            f"{prefix}tis_mean": self.tis_sum / n,
            f"{prefix}tis_capped_frac": self.tis_capped / n,
            f"{prefix}logprob_gap": self.gap_sum / n,
            f"{prefix}tokens": self.tokens,
        }


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor
    """Scalar to backpropagate: this microbatch's share of the step's token mean."""
    stats: LossStats


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(π ‖ π_ref): ``exp(ref − logp) − (ref − logp) − 1``.

    >>> k3_kl(torch.tensor([0.0]), torch.tensor([0.0])).tolist()
    [0.0]
    """
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


def token_mean_scale(world_size: int) -> float:
    """Factor on the loss so that DDP's gradient *average* over ranks becomes the global token mean.

    Each rank divides its token sum by the global loss-token count; DDP then averages the ranks'
    gradients (divides by ``world_size``), so multiply by ``world_size`` to get the sum back.
    """
    return float(world_size)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    engine_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: LossConfig,
    *,
    num_loss_tokens: float,
    ref_logprobs: torch.Tensor | None = None,
) -> LossOutput:
    """The clipped policy-gradient loss of one microbatch (see the module docstring).

    ``num_loss_tokens`` is the loss-token count of the whole optimiser step (all microbatches, all ranks);
    ``ref_logprobs`` is required when ``config.kl_coef > 0``.
    """
    if config.kl_coef > 0 and ref_logprobs is None:
        raise ConfigError("kl_coef > 0 needs reference logprobs; set kl_coef: 0 or give a reference model")
    if num_loss_tokens <= 0:
        raise ValueError(f"num_loss_tokens must be > 0, got {num_loss_tokens}")
    mask = loss_mask.to(logprobs.dtype)
    old = logprobs.detach() if old_logprobs is None else old_logprobs.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old)
    clipped = torch.clamp(ratio, 1.0 - config.epsilon_low, 1.0 + config.epsilon_high)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    engine = engine_logprobs.to(logprobs.dtype)
    if config.tis_cap is not None:
        raw_w = torch.exp(old - engine)
        weight = torch.clamp(raw_w, max=config.tis_cap).detach()
        per_token = per_token * weight
    else:
        raw_w = weight = torch.ones_like(logprobs)
    kl = torch.zeros_like(logprobs)
    if ref_logprobs is not None:
        kl = k3_kl(logprobs, ref_logprobs.to(logprobs.dtype))
        if config.kl_coef > 0:
            per_token = per_token + config.kl_coef * kl
    total = (per_token * mask).sum()
    with torch.no_grad():
        r = ratio.detach()
        stats = LossStats(
            tokens=float(mask.sum()),
            loss_sum=float(total.detach()),
            clipped_low=float(((r < 1.0 - config.epsilon_low) & (adv < 0)).to(mask.dtype).mul(mask).sum()),
            clipped_high=float(((r > 1.0 + config.epsilon_high) & (adv > 0)).to(mask.dtype).mul(mask).sum()),
            ratio_sum=float((r * mask).sum()),
            kl_sum=float((kl.detach() * mask).sum()),
            tis_sum=float((weight * mask).sum()) if config.tis_cap is not None else float(mask.sum()),
            tis_capped=float(((raw_w >= config.tis_cap) * mask).sum()) if config.tis_cap is not None else 0.0,
            gap_sum=float(((logprobs.detach() - engine).abs() * mask).sum()),
        )
    return LossOutput(loss=total / num_loss_tokens, stats=stats)
