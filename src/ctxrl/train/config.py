"""The ``train`` section of the run config: the settings of stepwise GRPO and nothing else.

    ctxrl train --config configs/train_tiny.yaml train.steps=20 train.lr=1e-5 train.lora.enabled=true

What other sections already say is not repeated here: the model and the engine (``model``, ``engine``), the
tasks of each step (``tasks``: ``count`` tasks per step and rank), the rollout (``rollout``: group size, mode,
episode limits), sampling, the harness, the advantages (``advantages``: ``w_eff``, std scaling,
``drop_zero_variance``) and the run folder (the command's ``--out``).

Defaults follow the reference run where it has one (clip 0.2 / 0.28, Adam lr 1e-6); its KL 0.01 and failure
penalties 0.3 / 0.2 are options here (``loss.kl_coef``, ``reward.penalties``), off by default, because the KL needs a
reference forward pass and the penalties change what the task channel sees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from ctxrl.errors import ConfigError
from ctxrl.rewards.advantages import AdvantageConfig
from ctxrl.train.credit import CreditConfig, RewardConfig
from ctxrl.train.loss import LossConfig


@dataclass(frozen=True)
class LoraSettings:
    """A peft LoRA adapter instead of full fine-tuning."""

    enabled: bool = False
    """Train a LoRA adapter (peft); False trains every parameter."""
    r: int = 16
    """Adapter rank."""
    alpha: int = 32
    """LoRA scaling numerator (the update is scaled by alpha / r)."""
    dropout: float = 0.05
    """Dropout on the adapter's input."""
    target_modules: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    """Names of the linear layers that get adapters (Llama / Qwen names)."""

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ConfigError(f"lora.r must be >= 1, got {self.r}")
        if self.alpha <= 0:
            raise ConfigError(f"lora.alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        if self.enabled and not self.target_modules:
            raise ConfigError(
                "lora.target_modules is empty; name the linear layers to adapt (e.g. [q_proj, v_proj])"
            )


def check_mixed_precision(mixed_precision: str, dtype: str, section: str = "") -> None:
    """Raise :class:`ConfigError` unless ``mixed_precision`` is ``no``, or ``bf16`` over float32 weights
    (``section``: the field names' prefix in the message, e.g. ``sft.``)."""
    if mixed_precision not in ("no", "bf16"):
        raise ConfigError(f"{section}mixed_precision must be 'no' or 'bf16', got {mixed_precision!r}")
    if mixed_precision != "no" and dtype != "float32":
        raise ConfigError(
            f"{section}mixed_precision={mixed_precision} keeps float32 weights under autocast, but {section}dtype "
            f"is {dtype}; set {section}dtype: float32 (or {section}mixed_precision: 'no' to train in {dtype} throughout)"
        )


@dataclass(frozen=True)
class TrainConfig:
    """Stepwise GRPO: steps, credit options, loss, optimiser, batching, LoRA, checkpoints, tracking."""

    steps: int = 100
    """Optimiser rounds: one rollout each (``updates_per_rollout`` optimiser steps per rollout)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """The task reward (success 1/0 or graded), failure penalties, and the efficiency channel's cost unit."""
    graded_until: float | None = None
    """With ``reward.graded``, the graded score is a warm-up only: after the first step in which at least this
    fraction of the step's groups held a success (binary reward with variance), the task reward is success
    1/0 for the rest of the run (resume included). A graded score rewards a policy that submits early with
    half the values as much as one that read everything and got half; success does not. Null: graded
    throughout."""
    loss: LossConfig = field(default_factory=LossConfig)
    """The clipped surrogate's clip range, the KL weight and the TIS cap."""

    lr: float = 1e-6
    """AdamW learning rate (the peak, when ``lr_schedule`` decays it)."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """How the rate moves over the run's optimiser rounds after the warm-up: held at ``lr``, or decayed from
    ``lr`` toward zero (linearly, or along a half cosine) over ``lr_schedule_steps``. The rate of a round
    depends only on its index (:meth:`lr_at`), so a resumed run follows the same schedule."""
    warmup_steps: int = 0
    """Rounds at the start whose rate rises linearly to ``lr`` (round k of W: ``lr * k / W``)."""
    lr_schedule_steps: int | None = None
    """The rounds the decay spans; null: ``steps``. Set it when a run is stopped early and resumed with a
    larger ``steps`` (as ``scripts/learn_smollm2.sh`` does at its mid point), so both parts follow one
    schedule. Rounds past it run at the schedule's last rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float | None = 1.0
    """Clip the gradient norm to this before each step; null disables clipping."""
    updates_per_rollout: int = 1
    """Optimiser steps per rollout batch (its episodes split evenly); >1 makes later updates off-policy,
    which is what the clip is for, and costs one extra forward pass for the old logprobs."""

    max_tokens_per_microbatch: int = 8192
    """Tokens per forward pass (packed: the sequence length; padded: rows x longest; a longer row runs
    alone). Every microbatch of an update accumulates into it (gradient accumulation by token budget), so
    this bounds memory, not the batch size."""
    packing: Literal["auto", "shared", "packed", "padded"] = "auto"
    """``auto`` gives each update the cheapest layout by estimated FLOPs (``rows.cheapest_layout``): each
    group's common prefix once with its rows' suffixes after it (``shared``; one process only), packed lines
    (if the model honours position-id packing, checked once), or padded batches (rows of alike lengths pad
    better, since a packed line computes attention across its rows too). A named layout forces it."""
    recompute_prefixes: bool = False
    """Shared layout: each prefix's forward runs without a graph and again, with one, in its backward, so no
    prefix's activations wait in memory while the rows below it run (one more forward of the prefix tokens;
    the gradients are the same). On a recorded SmolLM2 group of 8 it lowered the update's peak memory from
    17.75 to 15.44 GB at no measured cost in time (docs/train_throughput.md)."""
    two_part_attention: bool = False
    """Shared layout on the CPU: rows attend to their shared prefix in two parts merged by log-sum-exp (the
    prefix without a mask, their own tokens causal) instead of through the dense mask transformers builds
    (:mod:`ctxrl.train.attention`; the same loss and gradients within float rounding). Off by default (timed one
    after another on six SmolLM2 rows it was not reliably faster: docs/train_throughput.md, "Two-part
    attention"); alternated in pairs it was faster by the median, so the SmolLM2 configs turn it on: the GRPO
    update of a recorded group at 0.93 of the masked one's time on an EPYC ("Fifteenth run") and 0.97 on a Xeon
    with AMX ("Sixteenth run"), the float32 SFT step (``sft.two_part_attention``) at 0.91 ("Fourteenth run")."""
    compile: bool = False
    """Compile each decoder layer with ``torch.compile`` (:mod:`ctxrl.train.compile`): the first update of a
    run compiles (about 2 minutes for SmolLM2 on 2 cores), later ones run fused kernels. Off by default: on a
    2-core Xeon with AMX, under ``mixed_precision: bf16``, a SmolLM2 update of 8 episodes took 129 s against
    138 s eager, inside the machine's noise (``ctxrl bench smollm2_bf16_compiled`` / ``smollm2_bf16``)."""
    lora: LoraSettings = field(default_factory=LoraSettings)
    """LoRA adapter settings."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype the trainer loads the model in. bfloat16 ran the update 1.29× faster on this project's EPYC (AVX-512
    BF16) and moved the loss tokens' logprobs by ~0.06 nats (``ctxrl bench precision``); float32 is exact."""
    mixed_precision: Literal["no", "bf16"] = "no"
    """``bf16``: the update's forward passes (and the old and reference logprobs) run under bfloat16 autocast
    while the weights, the LoRA adapter, the gradients and AdamW's moments stay float32 (accelerate's and TRL's
    ``bf16``). On a 2-core Xeon with AMX a SmolLM2 update of 8 episodes took 130 s against 295 s in float32
    (``ctxrl bench smollm2_bf16`` / ``smollm2``), as fast as bfloat16 weights and with logprobs nearer float32's
    (``ctxrl bench precision``); on a CPU without bf16 arithmetic it is slower. Needs ``dtype: float32``."""

    seed: int = 0
    """Seeds Python, NumPy and torch (each rank adds its rank); 0 to 2**31 - 1, as every ``seed`` setting."""
    save_every: int = 10
    """Write a checkpoint every N steps (and after the last); 0 only after the last."""
    log_every: int = 1
    """Print a one-line summary every N steps."""
    tracker: Literal["none", "wandb"] = "none"
    """Where metrics go besides ``<out>/metrics.jsonl``: nowhere, or a wandb run (offline unless
    ``WANDB_MODE`` says otherwise) in ``<out>/wandb``."""
    wandb_project: str = "ctxrl"
    """wandb project name (``tracker: wandb``)."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}")
        if self.lr <= 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        if self.warmup_steps < 0:
            raise ConfigError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.lr_schedule_steps is not None and self.lr_schedule_steps <= self.warmup_steps:
            raise ConfigError(
                f"lr_schedule_steps ({self.lr_schedule_steps}) must be larger than warmup_steps "
                f"({self.warmup_steps}), or null for the run's steps"
            )
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ConfigError(
                f"max_grad_norm must be > 0 (or null to disable clipping), got {self.max_grad_norm}"
            )
        if self.graded_until is not None and not (self.reward.graded and 0 < self.graded_until <= 1):
            raise ConfigError(
                f"graded_until={self.graded_until} needs reward.graded: true and a fraction of groups in (0, 1]"
            )
        check_mixed_precision(self.mixed_precision, self.dtype)
        if self.updates_per_rollout < 1:
            raise ConfigError(f"updates_per_rollout must be >= 1, got {self.updates_per_rollout}")
        if self.max_tokens_per_microbatch < 2:
            raise ConfigError(f"max_tokens_per_microbatch must be >= 2, got {self.max_tokens_per_microbatch}")
        if self.save_every < 0 or self.log_every < 1:
            raise ConfigError("save_every must be >= 0 and log_every >= 1")

    def lr_at(self, step: int) -> float:
        """The learning rate of optimiser round ``step`` (0-based): warm-up, then the schedule's decay.

        >>> c = TrainConfig(steps=4, lr=1e-3, lr_schedule="linear")
        >>> [round(c.lr_at(k), 6) for k in range(4)]
        [0.001, 0.00075, 0.0005, 0.00025]
        >>> c = TrainConfig(steps=5, lr=1e-3, lr_schedule="cosine", warmup_steps=2, lr_schedule_steps=4)
        >>> [round(c.lr_at(k), 6) for k in range(5)]
        [0.0005, 0.001, 0.001, 0.0005, 0.0005]
        """
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.lr_schedule == "constant":
            return self.lr
        horizon = self.lr_schedule_steps if self.lr_schedule_steps is not None else self.steps
        span = max(horizon - self.warmup_steps, 1)
        # past the span's last round, the rate stays at that round's: the lowest, above 0
        done = min(step - self.warmup_steps, span - 1) / span
        if self.lr_schedule == "linear":
            return self.lr * (1.0 - done)
        return self.lr * 0.5 * (1.0 + math.cos(math.pi * done))

    def credit_config(self, advantages: AdvantageConfig) -> CreditConfig:
        """The credit settings: the run's ``advantages`` with this section's ``reward``."""
        return CreditConfig(advantages=advantages, reward=self.reward)
