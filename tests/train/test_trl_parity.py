"""Parity with TRL: on single-step episodes with no edits and ``w_eff = 0``, ctxrl's advantages, loss and
gradients equal TRL ``GRPOTrainer``'s on the same batch within 1e-5 (gradients also within 1e-4 of their
largest value: :data:`RTOL`).

Both sides start from the tiny model's weights and see the same batch (:func:`parity_batch`: 2 prompts x 4
completions of different lengths, graded rewards). TRL runs its own path: a ``rollout_func`` hands it the
batch's ids, its reward function the rewards, ``_generate_and_score_completions`` computes the group
advantages and pads (prompts left, completions right) and ``compute_loss`` runs its fused log-prob head and
DAPO loss. ctxrl runs the trainer's: ``assign_credit`` -> ``episode_rows`` -> ``grpo_update`` (packed, padded or
shared-prefix microbatches -> ``token_logprobs`` -> ``policy_loss``, one backward per microbatch, then the
optimiser's step, here one that keeps the gradients); the clipped (off-policy) cases run ``backward_layout``,
the core ``grpo_update`` runs, with shifted old logprobs, as a rollout's later updates see them.

The settings under which the two compute the same thing (see ``ctxrl.commands.bench_train``):

- TRL ``loss_type="dapo"`` (its default: token mean over the whole batch) is ctxrl's only normalisation;
  ``beta=0`` / ``kl_coef=0``; ``epsilon=0.2``, ``epsilon_high=0.28`` as ctxrl's ``epsilon_low/high``;
  ``importance_sampling_level="token"``; ``num_iterations=1`` (old logprobs are the detached current ones).
- TRL ``bf16=False``: its default ``bf16=True`` autocasts the log-prob head to bfloat16 even on CPU, which
  moves its gradients by ~1 % (measured: 8e-4 on gradients of size 0.09).
- ctxrl ``tis_cap=None``: TRL corrects for the engine/trainer mismatch only when it generates with vLLM.
- Advantages: TRL ``scale_rewards="none"`` equals ctxrl ``scale_by_std=False`` exactly. With std scaling
  the two differ by convention, not by a bug: TRL divides by the *sample* std + 1e-4, ctxrl by the
  *population* std + ``eps`` (1e-6); :func:`test_std_scaling_differs_only_in_the_std_convention` pins that
  down and checks the loss on TRL's own advantages.

Run: .venv/bin/python -m pytest tests/train/test_trl_parity.py -q
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
import torch

from ctxrl.commands.bench_train import (
    ParityBatch,
    ctxrl_backward,
    parity_batch,
    parity_episodes,
    trainer_update,
    trl_generation_batch,
    trl_trainer,
)
from ctxrl.rewards.advantages import AdvantageConfig
from ctxrl.train.config import TrainConfig
from ctxrl.train.credit import CreditConfig, assign_credit
from ctxrl.train.loss import LossConfig
from ctxrl.train.policy import load_policy
from ctxrl.train.rows import Microbatch, Row, episode_rows, layout_kind

ATOL = 1e-5
RTOL = 1e-4
"""Gradients also within RTOL of each tensor's largest value (float32 sums in another order)."""
LOSS = LossConfig(epsilon_low=0.2, epsilon_high=0.28, kl_coef=0.0, tis_cap=None)
SHIFTS = (0.4, -0.4, 0.1, -0.1, 0.0)
"""Old logprob = current + shift: ratios exp(-shift) of 0.67 and 1.49 lie outside [0.8, 1.28], so both
clips engage; 0.90 and 1.11 lie inside."""


def shift(b: int, t: int) -> float:
    """The old-logprob offset of completion token ``t`` of completion ``b`` (off-policy cases)."""
    return SHIFTS[(b + t) % len(SHIFTS)]


@pytest.fixture(scope="module")
def batch(tiny_tokenizer: Any) -> ParityBatch:
    return parity_batch(
        tiny_tokenizer, groups=2, group_size=4, prompt_tokens=(6, 20), completion_tokens=(3, 9)
    )


@pytest.fixture(scope="module")
def trl_plain(tiny_model_dir: Path, tiny_tokenizer: Any, batch: ParityBatch, tmp_path_factory: Any) -> Any:
    return trl_trainer(
        tiny_model_dir, tiny_tokenizer, batch, scale_rewards="none", out=tmp_path_factory.mktemp("trl")
    )


def run_trl(
    trainer: Any, batch: ParityBatch, *, off_policy: bool
) -> tuple[float, dict[str, Any], list[float]]:
    """TRL's loss, every parameter's gradient and its advantages (one per completion, in batch order)."""
    inputs = trainer._generate_and_score_completions(trl_generation_batch(batch))
    if off_policy:
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        width = inputs["completion_ids"].size(1)
        with torch.no_grad():
            current, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, width)
        offsets = torch.tensor([[shift(b, t) for t in range(width)] for b in range(ids.size(0))])
        inputs["old_per_token_logps"] = current + offsets * inputs["completion_mask"]
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters()}
    return float(loss.detach()), grads, inputs["advantages"].tolist()


def old_from_shifts(rows: Sequence[Row]) -> Callable[[Microbatch, torch.Tensor], torch.Tensor]:
    """Old logprobs for a microbatch of ``rows``: its current logprobs plus :func:`shift` on each span."""

    def old(mb: Microbatch, logprobs: torch.Tensor) -> torch.Tensor:
        offsets = torch.zeros_like(logprobs)
        start = 0
        for line, r in enumerate(mb.rows):
            row = rows[r]
            b, at = (0, start) if mb.kind == "packed" else (line, -mb.prefix_len)
            (s, e), episode = row.spans[0], row.episode
            for t in range(e - s):
                offsets[b, at + s + t] = shift(episode, t)
            start += len(row)
        return logprobs.detach() + offsets

    return old


class GradientCapture:
    """An optimiser for :func:`grpo_update` that keeps the gradients its step is given and changes nothing."""

    def __init__(self, model: Any) -> None:
        self.model, self.grads = model, {}

    def step(self) -> None:
        self.grads = {n: p.grad.detach().clone() for n, p in self.model.named_parameters()}

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.zero_grad(set_to_none=set_to_none)


def run_ctxrl(
    model_dir: Path,
    batch: ParityBatch,
    *,
    packing: Literal["packed", "padded", "shared"],
    off_policy: bool,
    scale_by_std: bool = False,
    advantages: Sequence[float] | None = None,
) -> tuple[float, dict[str, Any], list[float]]:
    """ctxrl's loss, gradients and task advantages; ``advantages`` (one per completion) replaces its own.

    On-policy: the trainer's own update, :func:`grpo_update` (unclipped, with an optimiser that keeps the
    gradients its step is given). Off-policy: :func:`backward_layout`, its core, with old logprobs shifted
    by :func:`shift` (one update per rollout is on-policy in the ratio; old logprobs other than the current
    ones reach the loss in a rollout's later updates, ``train.updates_per_rollout > 1``)."""
    model = load_policy(model_dir, TrainConfig()).train()
    episodes = parity_episodes(batch)
    credit = assign_credit(
        episodes, CreditConfig(advantages=AdvantageConfig(w_eff=0.0, scale_by_std=scale_by_std))
    )
    steps = [c.steps for c in credit]
    if advantages is not None:
        steps = [[[a] * len(ep.steps[0].token_ids)] for a, ep in zip(advantages, episodes)]
    rows = [r for i, ep in enumerate(episodes) for r in episode_rows(ep, steps[i], episode_index=i)]
    if off_policy:
        loss = ctxrl_backward(
            model, rows, packing=packing, pad_id=0, loss_config=LOSS, old_logprobs=old_from_shifts(rows)
        )
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        return loss, grads, [c.task for c in credit]
    capture = GradientCapture(model)
    update = trainer_update(
        model, capture, rows, TrainConfig(loss=LOSS, packing=packing, max_grad_norm=None), 0
    )
    assert layout_kind(update.layouts[0]) == packing  # the layout asked for is the one that ran
    return update.stats.loss_sum / update.stats.tokens, capture.grads, [c.task for c in credit]


def assert_same_gradients(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert set(ours) == set(theirs)
    for name, grad in ours.items():
        worst, largest = float((grad - theirs[name]).abs().max()), float(theirs[name].abs().max())
        assert worst <= ATOL + RTOL * largest, (
            f"{name}: gradients differ by {worst:.2e} (largest {largest:.2e})"
        )
    # not vacuous: the gradients are far larger than the tolerance
    assert max(float(g.abs().max()) for g in ours.values()) > 1e-3


@pytest.mark.parametrize("off_policy", [False, True], ids=["on-policy", "clipped"])
@pytest.mark.parametrize("packing", ["packed", "padded", "shared"])
def test_advantages_loss_and_gradients_equal_trl(
    tiny_model_dir: Path, batch: ParityBatch, trl_plain: Any, packing: str, off_policy: bool
) -> None:
    trl_loss, trl_grads, trl_adv = run_trl(trl_plain, batch, off_policy=off_policy)
    loss, grads, adv = run_ctxrl(tiny_model_dir, batch, packing=packing, off_policy=off_policy)

    # advantages: reward minus the group mean, by hand, on both sides
    by_hand = [r - float(np.mean(group)) for group in batch.rewards for r in group]
    assert adv == pytest.approx(by_hand, abs=1e-6)
    assert trl_adv == pytest.approx(by_hand, abs=1e-6)
    assert loss == pytest.approx(trl_loss, abs=ATOL)
    assert_same_gradients(grads, trl_grads)


def test_clipping_changes_the_loss(tiny_model_dir: Path, batch: ParityBatch) -> None:
    """The off-policy case is not the on-policy one in disguise: shifted old logprobs change the loss."""
    on, _, _ = run_ctxrl(tiny_model_dir, batch, packing="packed", off_policy=False)
    off, _, _ = run_ctxrl(tiny_model_dir, batch, packing="packed", off_policy=True)
    assert abs(on - off) > 1e-3


def test_std_scaling_differs_only_in_the_std_convention(
    tiny_model_dir: Path, tiny_tokenizer: Any, batch: ParityBatch, tmp_path: Path
) -> None:
    trainer = trl_trainer(tiny_model_dir, tiny_tokenizer, batch, scale_rewards="group", out=tmp_path)
    trl_loss, trl_grads, trl_adv = run_trl(trainer, batch, off_policy=False)
    _, _, ctxrl_adv = run_ctxrl(tiny_model_dir, batch, packing="packed", off_policy=False, scale_by_std=True)

    k = 0
    for group in batch.rewards:
        r = np.asarray(group)
        sample, population = r.std(ddof=1), r.std(ddof=0)
        for value in r:
            assert trl_adv[k] == pytest.approx((value - r.mean()) / (sample + 1e-4), abs=1e-5)
            assert ctxrl_adv[k] == pytest.approx((value - r.mean()) / (population + 1e-6), abs=1e-5)
            k += 1
    # on TRL's own advantages, ctxrl's loss and gradients are TRL's
    loss, grads, _ = run_ctxrl(tiny_model_dir, batch, packing="packed", off_policy=False, advantages=trl_adv)
    assert loss == pytest.approx(trl_loss, abs=ATOL)
    assert_same_gradients(grads, trl_grads)
