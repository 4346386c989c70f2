"""The policy loss on small tensors whose loss, gradient and metrics are worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from ctxrl.errors import ConfigError
from ctxrl.train.loss import LossConfig, LossStats, k3_kl, policy_loss

CFG = LossConfig(epsilon_low=0.2, epsilon_high=0.28)


def leaf(values: list[float]) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float64, requires_grad=True)


def t(values: list[float]) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float64)


def test_clipped_ratio_loss_gradient_and_clip_metrics() -> None:
    # ratios 1.5, 0.5, 1.0, 1.5, 1.1 against old logprobs 0; the last token is masked out
    lp = leaf([math.log(1.5), math.log(0.5), 0.0, math.log(1.5), math.log(1.1)])
    adv = t([1.0, -1.0, 2.0, -1.0, -1.0])
    mask = t([1, 1, 1, 1, 0])
    out = policy_loss(lp, t([0.0] * 5), t([0.0] * 5), adv, mask, CFG, num_loss_tokens=4)
    # token 0: min(1.5*1, 1.28*1) = 1.28 -> -1.28 (high clip, no gradient)
    # token 1: min(0.5*-1, 0.8*-1) = -0.8 -> 0.8 (low clip, no gradient)
    # token 2: ratio 1 -> -2, d/dlp = -A * ratio = -2
    # token 3: min(1.5*-1, 1.28*-1) = -1.5 -> 1.5 (unclipped side), d/dlp = -A * ratio = 1.5
    assert out.loss.item() == pytest.approx((-1.28 + 0.8 - 2.0 + 1.5) / 4)
    out.loss.backward()
    assert lp.grad is not None
    assert lp.grad[0].tolist() == pytest.approx([0.0, 0.0, -2.0 / 4, 1.5 / 4, 0.0])
    m = out.stats.metrics()
    assert m["loss/clip_high_frac"] == 0.25 and m["loss/clip_low_frac"] == 0.25
    assert m["loss/clip_frac"] == 0.5
    assert m["loss/ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.0 + 1.5) / 4)
    assert m["loss/tokens"] == 4.0
    assert m["loss/tis_mean"] == 1.0 and m["loss/kl"] == 0.0


def test_on_policy_ratio_is_one_and_gradient_is_minus_advantage() -> None:
    lp = leaf([-0.7, -2.0])
    out = policy_loss(lp, None, t([-0.7, -2.0]), t([0.5, -1.5]), t([1, 1]), CFG, num_loss_tokens=2)
    assert out.loss.item() == pytest.approx((-0.5 + 1.5) / 2)
    out.loss.backward()
    assert lp.grad is not None and lp.grad[0].tolist() == pytest.approx([-0.25, 0.75])
    assert out.stats.ratio_sum == 2.0 and out.stats.gap_sum == 0.0


def test_truncated_importance_weight() -> None:
    # trainer logprob 0; engine logprobs log 0.25 and log 2 -> weights min(4, 2) = 2 and 0.5
    lp = leaf([0.0, 0.0])
    engine = t([math.log(0.25), math.log(2.0)])
    cfg = LossConfig(tis_cap=2.0)
    out = policy_loss(lp, None, engine, t([1.0, 1.0]), t([1, 1]), cfg, num_loss_tokens=2)
    assert out.loss.item() == pytest.approx((-2.0 - 0.5) / 2)
    out.loss.backward()
    assert lp.grad is not None and lp.grad[0].tolist() == pytest.approx([-1.0, -0.25])
    m = out.stats.metrics()
    assert m["loss/tis_mean"] == pytest.approx(1.25)
    assert m["loss/tis_capped_frac"] == 0.5
    assert m["loss/logprob_gap"] == pytest.approx((math.log(4) + math.log(2)) / 2)


def test_k3_kl_term() -> None:
    # delta = ref - lp = log 2: k3 = 2 - log 2 - 1 = 0.3068528; d k3 / d lp = 1 - exp(delta) = -1
    assert k3_kl(t([0.0]), t([math.log(2.0)])).item() == pytest.approx(1 - math.log(2))
    lp = leaf([0.0])
    cfg = LossConfig(kl_coef=0.1)
    out = policy_loss(
        lp, None, t([0.0]), t([0.0]), t([1]), cfg, num_loss_tokens=1, ref_logprobs=t([math.log(2)])
    )
    assert out.loss.item() == pytest.approx(0.1 * (1 - math.log(2)))
    out.loss.backward()
    assert lp.grad is not None and lp.grad.item() == pytest.approx(-0.1)
    assert out.stats.metrics()["loss/kl"] == pytest.approx(1 - math.log(2))
    with pytest.raises(ConfigError, match="reference"):
        policy_loss(leaf([0.0]), None, t([0.0]), t([0.0]), t([1]), cfg, num_loss_tokens=1)


def test_token_mean_does_not_depend_on_the_split_into_microbatches() -> None:
    gen = torch.Generator().manual_seed(0)
    lp_all = torch.randn(1, 10, generator=gen, dtype=torch.float64) - 1
    old = lp_all + 0.3 * torch.randn(1, 10, generator=gen, dtype=torch.float64)
    adv = torch.randn(1, 10, generator=gen, dtype=torch.float64)
    mask = t([0, 1, 1, 0, 1, 1, 1, 0, 1, 1])
    whole = leaf(lp_all[0].tolist())
    ref = policy_loss(whole, old, old, adv, mask, CFG, num_loss_tokens=7)
    ref.loss.backward()
    parts = leaf(lp_all[0].tolist())
    stats = LossStats()
    total = torch.zeros((), dtype=torch.float64)
    for sl in (slice(0, 4), slice(4, 10)):
        o = policy_loss(parts[:, sl], old[:, sl], old[:, sl], adv[:, sl], mask[:, sl], CFG, num_loss_tokens=7)
        o.loss.backward()
        total = total + o.loss.detach()
        stats += o.stats
    assert total.item() == pytest.approx(ref.loss.item())
    assert parts.grad is not None and whole.grad is not None
    assert torch.allclose(parts.grad, whole.grad)
    assert stats.metrics() == pytest.approx(ref.stats.metrics())
    assert LossStats.from_tensor(stats.as_tensor()) == stats


def test_config_checks() -> None:
    with pytest.raises(ConfigError, match="epsilon_low"):
        LossConfig(epsilon_low=1.0)
    with pytest.raises(ConfigError, match="tis_cap"):
        LossConfig(tis_cap=0.0)
    with pytest.raises(ConfigError, match="kl_coef"):
        LossConfig(kl_coef=-0.1)
