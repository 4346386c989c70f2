"""Supervised warm start: train a causal LM on recorded demonstrations, loss on generated tokens only.

    episodes = load_demonstrations("runs/demos/trajectories.jsonl")      # one-line error on a bad line
    examples, stats = sft_examples(episodes, max_seq_len=8192)           # token in, token out
    result = train_sft(SFTConfig(lr=2e-3), "runs/tiny/model", examples, "runs/sft")   # -> runs/sft/model

**Examples.** Demonstrations are :class:`~ctxrl.train.trajectory.EpisodeRecord`s (the scripted managers
run through the rollout loop, or any other rollout). Each example is one training row of
:func:`ctxrl.train.rows.episode_rows`: consecutive ``extend`` steps share one sequence (the last step's
prompt ids + its generated ids) whose ``completion_mask`` is 1 on every step's generated ids (the stop
token included, so the model learns to end its turn) and 0 on prompts and observations. The ids are the
records' own: nothing is decoded and re-tokenised. A row longer than ``max_seq_len`` keeps its first
``max_seq_len`` tokens (every kept loss token still sees the context it was generated from); the loss
tokens cut off are counted in :class:`ExampleStats`.

**Training** (``trainer: ctxrl``, the default). The GRPO trainer's own update with a cross-entropy loss
(:func:`ctxrl.train.update.nll_backward`): each optimiser step's examples (shuffled per epoch, cut into steps
of at most ``batch_tokens`` tokens, :func:`sft_steps`) are laid out the cheapest way by estimated FLOPs —
the step's common prefix once (the system prompt every row begins with), a trie of the longer prefixes rows
share below it (an episode's pinned prefix), the rows' suffixes after them, packed lines or padded batches of at most
``max_seq_len`` tokens — and the LM head runs only at the loss tokens. Token-mean cross-entropy over the
step's loss tokens, AdamW, warm-up and decay, gradient clipping.

**Training** (``trainer: trl``, the reference). TRL's ``SFTTrainer`` on a pre-tokenised dataset (``input_ids`` + ``completion_mask``,
``completion_only_loss``): token-mean cross-entropy over the loss tokens of each optimiser step. Rows are
packed into ``max_seq_len``-token sequences (best-fit decreasing, position ids restart per row, attention
kept within a row) when the model honours position-id packing, else one row per forward pass. LoRA (peft)
or full fine-tuning by ``lora.enabled``; the LoRA adapter is merged before saving, so ``<out>/model`` is
always a plain Hugging Face folder (weights + tokenizer) that every engine loads.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ctxrl.errors import ConfigError, UsageError
from ctxrl.train.config import LoraSettings, check_mixed_precision
from ctxrl.train.rows import Row, episode_rows
from ctxrl.train.run_folder import json_lines
from ctxrl.train.trajectory import EpisodeRecord


@dataclass(frozen=True)
class SFTConfig:
    """One supervised warm-start run: data selection, sequence layout, optimiser, LoRA, seed."""

    lr: float = 2e-5
    """AdamW peak learning rate (a random tiny model needs ~2e-3; a pre-trained one ~1e-5 to 1e-4)."""
    epochs: float = 1.0
    """Passes over the demonstrations (fractions allowed); ignored when ``max_steps`` > 0."""
    max_steps: int = 0
    """Optimiser steps to run; 0: as many as ``epochs`` takes."""
    max_seq_len: int = 8192
    """Longest training sequence in tokens; a longer row keeps its first ``max_seq_len`` tokens."""
    batch_tokens: int = 16384
    """Tokens per optimiser step: gradients accumulate over ``batch_tokens // max_seq_len`` sequences of at
    most ``max_seq_len`` tokens each (packed sequences, or one row each when padded)."""
    steps_by: Literal["example", "row", "episode"] = "example"
    """How an epoch is cut into optimiser steps (:func:`sft_steps`). ``example``: the examples shuffled one by
    one. ``row``: each row shuffled with its decision copies (:attr:`decision_copies`) kept beside it, so a
    copy (the row up to its last edit) shares the row's step and the ``ctxrl`` trainer computes its prompt
    once for all of them. ``episode``: the episodes shuffled, each episode's examples kept together and in
    order, as a multi-turn SFT example keeps a whole conversation; the rows of one step then share their
    episode's pinned prefix, which the ``ctxrl`` trainer computes once (``ctxrl bench smollm2``'s
    ``sft_speedup_episode_steps``). The same examples and tokens per epoch each way; only which examples share
    a step changes. On the retention ladder both ``row`` and ``episode`` computed 30 % fewer tokens and taught
    worse than ``example`` (docs/results/learning/README.md, "How the steps are cut")."""
    trainer: Literal["ctxrl", "trl"] = "ctxrl"
    """``ctxrl``: the GRPO trainer's own update (:func:`ctxrl.train.update.nll_backward`: shared prefixes, the
    LM head only at loss tokens) in a plain AdamW loop; ``trl``: TRL's ``SFTTrainer`` (the parity reference:
    the same loss, slower on a CPU, ``ctxrl bench smollm2``'s ``sft_speedup``)."""
    packing: Literal["auto", "shared", "packed", "padded"] = "auto"
    """``auto``: with ``trainer: ctxrl`` the cheapest layout of each step's rows by estimated FLOPs (each
    episode's common prefix once, packed or padded); with ``trl`` packs rows when the model honours
    position-id packing (checked once), else one row per pass. ``shared`` needs ``trainer: ctxrl``."""
    lr_scheduler: Literal["constant", "linear", "cosine"] = "linear"
    """Learning-rate schedule after warm-up (decays to 0 at the last step, except ``constant``)."""
    warmup_steps: int = 0
    """Optimiser steps of linear warm-up from 0 to ``lr``."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float | None = 1.0
    """Clip the gradient norm to this before each step; null disables clipping."""
    successful_only: bool = True
    """Train only on demonstrations whose episode succeeded."""
    decision_copies: int = 0
    """Extra copies of each sequence's decision tokens: the calls that edited the context (the notes rewrite
    that keeps the asked records), each copy the sequence up to its last edit token with the loss on the edit
    tokens only. 0 trains every generated token once; 3 gives the decisions four times the weight."""
    heldout_episodes: int = 0
    """The last N demonstrations are held out of training; their loss before and after training is reported
    (``heldout_loss_before`` / ``heldout_loss_after``) beside the loss on the trained demonstrations."""
    lora: LoraSettings = field(default_factory=LoraSettings)
    """LoRA adapter (peft) instead of full fine-tuning; merged into the saved model."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype the model is loaded and trained in (bfloat16: faster on a CPU with AVX-512 BF16, ``ctxrl bench
    precision``; TRL then trains with ``bf16=True``)."""
    mixed_precision: Literal["no", "bf16"] = "no"
    """``bf16``: float32 weights, the forward passes under bfloat16 autocast (as ``train.mixed_precision``);
    TRL then trains with ``bf16=True`` on the float32 model, the same regime. Needs ``dtype: float32``."""
    compile: bool = False
    """The ctxrl trainer only: compile each decoder layer with ``torch.compile`` (:mod:`ctxrl.train.compile`,
    as ``train.compile``). The first step compiles (22–37 s for SmolLM2 on 2 cores); under ``mixed_precision:
    bf16`` on a 2-core Xeon with AMX a step of one 2,048-token row then took 3.58 s against 4.37 s eager
    (``scripts/probe_sft_step.py``), and the SFT path ran 2.51× TRL's rate after the first step against 1.95×
    eager (``ctxrl bench smollm2_bf16_compiled`` / ``smollm2_bf16``)."""
    two_part_attention: bool = False
    """The ctxrl trainer only, on the CPU: rows attend to their step's shared prefix in two parts merged by
    log-sum-exp instead of through a dense mask (``train.two_part_attention``, :mod:`ctxrl.train.attention`;
    the same loss and gradients within float rounding). On the ladder's float32 SFT step of two SmolLM2
    episodes, alternated with the masked step in one process, it was faster in six of six pairs
    (docs/train_throughput.md, "Fourteenth run"); configs/sft_smollm2*.yaml turn it on."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory. TRL turns it on by default; it cost about a
    third of an SFT step of SmolLM2-135M on a 2-core CPU (py-spy), where a small model is compute-bound, not
    memory-bound, so it is off unless asked for."""
    seed: int = 0
    """Seeds the data order and the LoRA initialisation; 0 to 2**31 - 1."""
    log_every: int = 10
    """Log loss, learning rate and token counts every N optimiser steps (and at the last)."""

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"sft.lr must be > 0, got {self.lr}")
        if self.epochs <= 0:
            raise ConfigError(f"sft.epochs must be > 0, got {self.epochs}")
        if self.max_steps < 0:
            raise ConfigError(f"sft.max_steps must be >= 0 (0: run sft.epochs), got {self.max_steps}")
        if self.max_seq_len < 2:
            raise ConfigError(f"sft.max_seq_len must be >= 2, got {self.max_seq_len}")
        if self.batch_tokens < self.max_seq_len:
            raise ConfigError(
                f"sft.batch_tokens ({self.batch_tokens}) must be >= sft.max_seq_len ({self.max_seq_len}); "
                "raise batch_tokens or lower max_seq_len"
            )
        if self.warmup_steps < 0:
            raise ConfigError(f"sft.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.weight_decay < 0:
            raise ConfigError(f"sft.weight_decay must be >= 0, got {self.weight_decay}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ConfigError(
                f"sft.max_grad_norm must be > 0 (or null to disable clipping), got {self.max_grad_norm}"
            )
        check_mixed_precision(self.mixed_precision, self.dtype, "sft.")
        if self.compile and self.trainer != "ctxrl":
            raise ConfigError(
                "sft.compile compiles the ctxrl trainer's decoder layers; set sft.trainer: ctxrl "
                "(or sft.compile: false for TRL's trainer)"
            )
        if self.two_part_attention and self.trainer != "ctxrl":
            raise ConfigError(
                "sft.two_part_attention changes the ctxrl trainer's attention to shared prefixes; set "
                "sft.trainer: ctxrl (or sft.two_part_attention: false for TRL's trainer)"
            )
        if self.log_every < 1:
            raise ConfigError(f"sft.log_every must be >= 1, got {self.log_every}")
        if self.decision_copies < 0 or self.heldout_episodes < 0:
            raise ConfigError(
                f"sft.decision_copies and sft.heldout_episodes must be >= 0, got {self.decision_copies} "
                f"and {self.heldout_episodes}"
            )
        if self.steps_by != "example" and self.trainer == "trl":
            raise ConfigError(
                f"sft.steps_by: {self.steps_by} needs sft.trainer: ctxrl (TRL's sampler shuffles examples)"
            )
        if self.packing == "shared" and self.trainer == "trl":
            raise ConfigError("sft.packing: shared needs sft.trainer: ctxrl (TRL packs or pads rows)")

    @property
    def accumulation(self) -> int:
        """Sequences per optimiser step."""
        return self.batch_tokens // self.max_seq_len


@dataclass(frozen=True)
class SFTExample:
    """One training sequence: ids and a loss mask aligned with them (1 = a generated token to learn)."""

    input_ids: list[int]
    completion_mask: list[int]
    episode: int
    """Index of the episode (in the list given to :func:`sft_examples`)."""
    steps: tuple[int, ...]
    """The episode's steps whose generated ids are in this sequence."""
    decision: bool = False
    """An extra copy of a sequence's decision tokens (:attr:`SFTConfig.decision_copies`)."""


@dataclass(frozen=True)
class ExampleStats:
    """What the demonstrations gave: episodes used and skipped, sequences, tokens, tokens lost to the cap."""

    episodes: int
    skipped_episodes: int
    """Episodes left out (failed, with ``successful_only``)."""
    examples: int
    tokens: int
    """Tokens of all examples (what one epoch puts through the model)."""
    loss_tokens: int
    truncated_loss_tokens: int
    """Generated tokens cut off by ``max_seq_len`` (not trained on)."""
    decision_examples: int = 0
    """Of ``examples``, the extra copies of decision tokens (:attr:`SFTConfig.decision_copies`)."""

    def to_dict(self) -> dict[str, int]:
        return {
            "decision_examples": self.decision_examples,
            "episodes": self.episodes,
            "skipped_episodes": self.skipped_episodes,
            "examples": self.examples,
            "tokens": self.tokens,
            "loss_tokens": self.loss_tokens,
            "truncated_loss_tokens": self.truncated_loss_tokens,
        }


def _check_ids(name: str, ids: Any) -> None:
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise UsageError(f"{name} is not a list of token ids")
    if any(t < 0 for t in ids):
        raise UsageError(f"{name} holds a negative token id")


def _check_episode(episode: EpisodeRecord) -> None:
    """Raise :class:`UsageError` when a record cannot become training rows (wrong types or lengths)."""
    if not isinstance(episode.steps, list):
        raise UsageError("steps is not a list")
    for k, step in enumerate(episode.steps):
        _check_ids(f"step {k} prompt_ids", step.prompt_ids)
        _check_ids(f"step {k} token_ids", step.token_ids)
        if not step.prompt_ids:
            raise UsageError(f"step {k} has an empty prompt")
        for name in ("logprobs", "edit_mask"):
            if not isinstance(getattr(step, name), list):
                raise UsageError(f"step {k} {name} is not a list")
    episode_rows(episode, [[0.0] * len(s.token_ids) for s in episode.steps])  # lengths agree


def load_demonstrations(path: str | Path) -> list[EpisodeRecord]:
    """The episodes of a trajectory JSONL file, each checked to make training rows.

    Raises :class:`UsageError` with one line naming the file (and the line, for a bad record): missing or
    unreadable file, a line that is not JSON or not an episode record, ids that are not token ids, lengths
    that disagree, or no episode at all.
    """
    source = Path(path)
    if not source.is_file():
        raise UsageError(f"demonstrations file {source} does not exist or is not a file")
    episodes = []
    for n, data in json_lines(source):
        try:
            if not isinstance(data, dict):
                raise UsageError("not a JSON object")
            episode = EpisodeRecord.from_dict(data)
            _check_episode(episode)
        except (UsageError, TypeError, AttributeError, KeyError, ValueError) as exc:
            detail = str(exc) or type(exc).__name__
            raise UsageError(f"{source}:{n}: not an episode record: {detail}") from None
        episodes.append(episode)
    if not episodes:
        raise UsageError(f"{source} holds no episodes")
    return episodes


def sft_examples(
    episodes: Sequence[EpisodeRecord],
    *,
    max_seq_len: int,
    successful_only: bool = True,
    decision_copies: int = 0,
) -> tuple[list[SFTExample], ExampleStats]:
    """The training sequences of ``episodes`` (see the module docstring) and their counts.

    Rows that keep no loss token after the cap are dropped. With ``decision_copies`` each row whose kept
    part holds edit tokens adds that many copies of itself up to its last edit token, the loss on the edit
    tokens only (:attr:`SFTConfig.decision_copies`).
    """
    examples = []
    skipped = truncated = decisions = 0
    for i, episode in enumerate(episodes):
        if successful_only and not episode.success:
            skipped += 1
            continue
        zeros = [[0.0] * len(s.token_ids) for s in episode.steps]
        for row in episode_rows(episode, zeros, episode_index=i):
            ids = row.input_ids[:max_seq_len]
            mask = row.loss_mask[:max_seq_len]
            truncated += row.num_loss_tokens - sum(mask)
            if not any(mask):
                continue
            examples.append(SFTExample(ids, mask, episode=i, steps=row.steps))
            edits = [int(m and e) for m, e in zip(mask, row.edit_mask, strict=False)]
            if decision_copies and any(edits):
                end = max(t for t, e in enumerate(edits) if e) + 1
                copy = SFTExample(ids[:end], edits[:end], episode=i, steps=row.steps, decision=True)
                examples += [copy] * decision_copies
                decisions += decision_copies
    stats = ExampleStats(
        episodes=len(episodes) - skipped,
        skipped_episodes=skipped,
        examples=len(examples),
        tokens=sum(len(e.input_ids) for e in examples),
        loss_tokens=sum(sum(e.completion_mask) for e in examples),
        truncated_loss_tokens=truncated,
        decision_examples=decisions,
    )
    return examples, stats


def check_vocab(examples: Sequence[SFTExample], vocab_size: int, source: str) -> None:
    """Refuse ids the model has no embedding for: the demonstrations came from another tokenizer."""
    top = max((max(e.input_ids) for e in examples), default=-1)
    if top >= vocab_size:
        raise UsageError(
            f"{source} holds token id {top} but the model's vocabulary has {vocab_size} entries; record the "
            "demonstrations with this model's tokenizer (rollout with model=<the same folder>)"
        )


def demonstration_loss(model: Any, examples: Sequence[SFTExample]) -> float:
    """Token-mean cross-entropy of ``model`` over the loss tokens of ``examples`` (one row per pass).

    ``-mean log p(x_t | x_<t)`` over every ``t`` with ``completion_mask[t] == 1``: the quantity SFT
    minimises, computed without TRL so it can judge the result.
    """
    import torch

    from ctxrl.train.logprobs import token_logprobs

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with torch.no_grad():
        for ex in examples:
            ids = torch.tensor([ex.input_ids], device=device)
            positions = torch.arange(len(ex.input_ids), device=device)[None]
            mask = torch.tensor([ex.completion_mask], device=device, dtype=torch.float32)
            lp, _ = token_logprobs(model, ids, positions, loss_mask=mask)  # the LM head at loss tokens only
            total += float(-(lp * mask).sum())
            count += int(mask.sum())
    model.train(was_training)
    return total / count if count else math.nan


LOSS_SAMPLE = 48
"""Sequences the demonstration loss before and after training is measured on (evenly spaced over the trained
ones): one forward pass each, so on a CPU the measurement of every sequence of a large run would cost as much
as an epoch."""


def loss_sample(examples: Sequence[SFTExample], size: int = LOSS_SAMPLE) -> list[SFTExample]:
    """At most ``size`` of ``examples``, evenly spaced (all of them when there are fewer).

    >>> [e.episode for e in loss_sample([SFTExample([1, 2], [0, 1], i, (0,)) for i in range(10)], 4)]
    [0, 2, 5, 7]
    """
    if len(examples) <= size:
        return list(examples)
    return [examples[i * len(examples) // size] for i in range(size)]


@dataclass(frozen=True)
class SFTResult:
    """What a run did: the saved model, its loss on the demonstrations before and after, speed."""

    model_dir: Path
    steps: int
    trained_tokens: int
    """Tokens through the model in training (prompt and observation tokens included)."""
    wall_s: float
    """Seconds of training (model loading, data preparation and the loss passes excluded)."""
    loss_before: float
    loss_after: float
    packed: bool
    """Rows shared a forward pass (packed lines or shared prefixes) rather than one row per pass."""
    log: list[dict[str, float]]
    """The trainer's log lines (loss, learning rate, grad norm, token accuracy, ...)."""
    layout: str = ""
    """The layout the steps ran in: ``shared``, ``packed``, ``padded`` (or a mix, ``mixed``)."""
    trainer: str = "trl"
    heldout_loss_before: float | None = None
    """The loss on held-out demonstrations (:attr:`SFTConfig.heldout_episodes`) before training; None
    without them."""
    heldout_loss_after: float | None = None
    first_step_s: float = 0.0
    """Seconds of the first optimiser step (warm-up, and with ``compile`` the compilation, are in it)."""
    steady_tokens_per_s: float = 0.0
    """Tokens a second after the first optimiser step (the rate a long run settles at); with one step, the
    whole run's."""
    trained: Any = field(default=None, repr=False, compare=False)
    """The trained model in memory (merged), for the caller's own checks; not part of the summary."""

    @property
    def tokens_per_s(self) -> float:
        return self.trained_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_dir": str(self.model_dir),
            "steps": self.steps,
            "trained_tokens": self.trained_tokens,
            "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s,
            "first_step_s": self.first_step_s,
            "steady_tokens_per_s": self.steady_tokens_per_s,
            "loss_before": self.loss_before,
            "loss_after": self.loss_after,
            "packed": self.packed,
            "layout": self.layout,
            "trainer": self.trainer,
            "heldout_loss_before": self.heldout_loss_before,
            "heldout_loss_after": self.heldout_loss_after,
        }


def _load_model(folder: Path, config: SFTConfig) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    from ctxrl.train.engines.model_dir import check_causal_lm_dir

    dtype = torch.float32 if config.dtype == "float32" else torch.bfloat16
    return AutoModelForCausalLM.from_pretrained(check_causal_lm_dir(folder), dtype=dtype)


def _peft_config(lora: LoraSettings) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )


def train_sft(
    config: SFTConfig,
    base_model: str | Path,
    examples: Sequence[SFTExample],
    out: str | Path,
    *,
    heldout: Sequence[SFTExample] = (),
    progress: bool = True,
) -> SFTResult:
    """Fine-tune the causal LM in ``base_model`` on ``examples``; save it to ``<out>/model``.

    The demonstration loss before and after is measured on up to :data:`LOSS_SAMPLE` of ``examples`` (decision
    copies left out) and, when given, on every ``heldout`` sequence, which is never trained on.

    ``<out>/model`` holds the full weights (a LoRA adapter merged in) and the base model's tokenizer. The
    trainer writes nothing else into ``out``. Raises :class:`UsageError` when there is nothing to train on
    or the ids do not fit the model's vocabulary.
    """
    import torch

    from ctxrl.env.tokenizer import load_tokenizer_dir
    from ctxrl.train.logprobs import packing_supported

    if not examples:
        raise UsageError(
            "no training examples: every demonstration failed or was cut away by sft.max_seq_len"
        )
    base = Path(base_model)
    out = Path(out)
    tokenizer = load_tokenizer_dir(base)
    model = _load_model(base, config)
    check_vocab(examples, int(model.get_input_embeddings().weight.shape[0]), "the demonstrations")
    torch.manual_seed(config.seed)
    packed = config.packing == "packed" or (config.packing == "auto" and packing_supported(model))
    if config.trainer == "trl" and any(e.decision for e in examples):
        raise ConfigError(
            "sft.decision_copies needs sft.trainer: ctxrl (TRL's completion mask is 0/1 per row)"
        )
    plain = loss_sample([e for e in examples if not e.decision])
    loss_before = demonstration_loss(model, plain)
    heldout_before = demonstration_loss(model, heldout) if heldout else None
    if config.trainer == "ctxrl":
        result = _train_sft_ctxrl(
            config, model, tokenizer, examples, plain, out, loss_before, progress=progress
        )
        trained: Any = result.trained
    else:
        result, trained = _train_sft_trl(
            config, model, tokenizer, examples, plain, out, loss_before, packed, progress
        )
    if not heldout:
        return result
    return replace(
        result, heldout_loss_before=heldout_before, heldout_loss_after=demonstration_loss(trained, heldout)
    )


def _train_sft_trl(
    config: SFTConfig,
    model: Any,
    tokenizer: Any,
    examples: Sequence[SFTExample],
    measured: Sequence[SFTExample],
    out: Path,
    loss_before: float,
    packed: bool,
    progress: bool,
) -> tuple[SFTResult, Any]:
    """Supervised training with TRL's ``SFTTrainer`` (see :attr:`SFTConfig.trainer`); the result and the
    trained (merged) model."""
    import datasets
    import torch
    from trl import SFTConfig as TRLSFTConfig
    from trl import SFTTrainer

    dataset = datasets.Dataset.from_dict(
        {
            "input_ids": [list(e.input_ids) for e in examples],
            "completion_mask": [list(e.completion_mask) for e in examples],
        }
    )
    args = TRLSFTConfig(
        output_dir=str(out / "trainer"),
        learning_rate=config.lr,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps if config.max_steps > 0 else -1,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=config.accumulation,
        lr_scheduler_type=config.lr_scheduler,
        warmup_steps=config.warmup_steps,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm if config.max_grad_norm is not None else 0.0,
        max_length=config.max_seq_len,
        packing=packed,
        packing_strategy="bfd",
        gradient_checkpointing=config.gradient_checkpointing,
        completion_only_loss=True,
        bf16=config.dtype == "bfloat16" or config.mixed_precision == "bf16",
        # transformers refuses bf16 without a GPU unless told the run is on the CPU
        use_cpu=not torch.cuda.is_available(),
        seed=config.seed,
        data_seed=config.seed,
        logging_steps=config.log_every,
        save_strategy="no",
        report_to="none",
        disable_tqdm=not progress,
        dataloader_num_workers=0,
        include_num_input_tokens_seen="all",  # for the rate after the first step
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=_peft_config(config.lora) if config.lora.enabled else None,
    )
    first = _first_step_callback()
    trainer.add_callback(first)
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    seen = int(trainer.state.num_input_tokens_seen)
    first_step = None if first.at is None else (first.at[0] - start, first.at[1])

    trained, model_dir = _save(trainer.model, tokenizer, config, out)
    loss_after = demonstration_loss(trained, measured)
    log = [dict(entry) for entry in trainer.state.log_history]
    tokens = max((int(e["num_tokens"]) for e in log if "num_tokens" in e), default=0)
    return SFTResult(
        model_dir=model_dir,
        steps=int(trainer.state.global_step),
        trained_tokens=tokens,
        wall_s=wall,
        loss_before=loss_before,
        loss_after=loss_after,
        packed=packed,
        log=log,
        layout="packed" if packed else "padded",
        trainer="trl",
        first_step_s=first_step[0] if first_step else 0.0,
        steady_tokens_per_s=_steady_rate(first_step, wall, seen),
    ), trained


def _first_step_callback() -> Any:
    """A ``TrainerCallback`` whose ``at`` is the clock and the tokens seen when the first optimiser step
    ends (None until then)."""
    from transformers import TrainerCallback

    class FirstStep(TrainerCallback):
        at: tuple[float, int] | None = None

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.at is None:
                self.at = (time.perf_counter(), int(state.num_input_tokens_seen))

    return FirstStep()


def _save(trained: Any, tokenizer: Any, config: SFTConfig, out: Path) -> tuple[Any, Path]:
    """Merge a LoRA adapter into the weights and save the model and tokenizer to ``<out>/model``; with LoRA
    the adapter alone goes to ``<out>/adapter`` first, in bf16 (about 10 MB at r = 16 for SmolLM2-135M: small
    enough to commit, and ``ctxrl export --adapter`` merges it into its base again)."""
    if config.lora.enabled:
        save_adapter_bf16(trained, out / "adapter")
        trained = trained.merge_and_unload()
    model_dir = out / "model"
    trained.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return trained, model_dir


def save_adapter_bf16(model: Any, folder: Path) -> None:
    """Round the peft adapter of ``model`` to bf16 in place and save it to ``folder`` in bf16: merging the
    model afterwards gives exactly the weights that the saved adapter merges into (``merge_adapter``)."""
    import torch
    from safetensors.torch import load_file, save_file

    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(param.to(torch.bfloat16).to(param.dtype))
    model.save_pretrained(folder)
    (folder / "README.md").unlink(
        missing_ok=True
    )  # peft's blank model card, which names the base's local path
    weights = folder / "adapter_model.safetensors"
    state = {name: t.to(torch.bfloat16).contiguous() for name, t in load_file(str(weights)).items()}
    save_file(state, str(weights), metadata={"format": "pt"})


def sft_steps(examples: Sequence[SFTExample], config: SFTConfig) -> list[list[int]]:
    """The optimiser steps of a run, as lists of example indices: each epoch shuffles the examples (seeded
    by ``config.seed`` and the epoch; with ``steps_by: row`` each row with its decision copies after it, with
    ``episode`` the episodes, each one's examples kept together in their order) and cuts them, in that order,
    into steps of at most ``config.batch_tokens`` tokens (an example longer than that alone). A row and its
    copies go whole into one step when they fit in one (into the next step if the current one lacks the
    room); an episode's examples fill a step and go on in the next. A fractional last epoch keeps the first
    part of its steps; ``max_steps`` > 0 runs exactly that many (epochs repeat as needed).

    >>> ex = [SFTExample([1] * n, [0] * (n - 1) + [1], e, (0,)) for n, e in ((6, 0), (5, 1), (4, 0), (3, 1))]
    >>> len(sft_steps(ex, SFTConfig(max_seq_len=8, batch_tokens=10, epochs=1)))
    2
    >>> sorted(sorted(step) for step in sft_steps(ex, SFTConfig(max_seq_len=8, batch_tokens=10, steps_by="episode")))
    [[0, 2], [1, 3]]
    >>> row, copy = SFTExample([1] * 6, [0] * 5 + [1], 0, (0,)), SFTExample([1] * 5, [0] * 4 + [1], 0, (0,), True)
    >>> sorted(sorted(step) for step in sft_steps([row, copy, ex[1]], SFTConfig(max_seq_len=8, batch_tokens=11, steps_by="row")))
    [[0, 1], [2]]
    """
    import random

    units: dict[object, list[int]] = {}  # what stays together: an example, a row and its copies, an episode
    for i, example in enumerate(examples):
        key = {"example": i, "row": (example.episode, example.steps), "episode": example.episode}
        units.setdefault(key[config.steps_by], []).append(i)

    def size(piece: list[int]) -> int:
        return sum(len(examples[i].input_ids) for i in piece)

    def epoch(k: int) -> list[list[int]]:
        rng = random.Random(config.seed * 1000 + k)
        keys = list(units)
        rng.shuffle(keys)
        steps: list[list[int]] = []
        used = 0
        for key in keys:
            members = units[key]
            whole = config.steps_by == "row" and size(members) <= config.batch_tokens
            for piece in [members] if whole else [[i] for i in members]:
                n = size(piece)
                if steps and used + n <= config.batch_tokens:
                    steps[-1].extend(piece)
                    used += n
                else:
                    steps.append(list(piece))
                    used = n
        return steps

    out: list[list[int]] = []
    if config.max_steps > 0:
        k = 0
        while len(out) < config.max_steps:
            out.extend(epoch(k))
            k += 1
        return out[: config.max_steps]
    whole = int(config.epochs)
    for k in range(whole):
        out.extend(epoch(k))
    part = config.epochs - whole
    if part > 0:
        last = epoch(whole)
        out.extend(last[: max(1, math.ceil(part * len(last)))])
    return out


def _schedule(config: SFTConfig, total: int) -> Any:
    """``step -> factor`` of the peak rate: linear warm-up, then constant, linear or cosine decay to 0."""

    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / (config.warmup_steps + 1)
        if config.lr_scheduler == "constant":
            return 1.0
        done = (step - config.warmup_steps) / max(1, total - config.warmup_steps)
        if config.lr_scheduler == "linear":
            return max(0.0, 1.0 - done)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, done)))

    return factor


def _train_sft_ctxrl(
    config: SFTConfig,
    model: Any,
    tokenizer: Any,
    examples: Sequence[SFTExample],
    measured: Sequence[SFTExample],
    out: Path,
    loss_before: float,
    *,
    progress: bool,
) -> SFTResult:
    """Supervised training with the GRPO trainer's update (see :attr:`SFTConfig.trainer`)."""
    import torch

    from ctxrl.train.logprobs import packing_supported
    from ctxrl.train.rows import layout_kind
    from ctxrl.train.update import layout_sizes, make_layout, nll_backward, precision_context, two_part_runs

    if config.lora.enabled:
        from peft import get_peft_model

        model = get_peft_model(model, _peft_config(config.lora))
    if config.compile:
        from ctxrl.train.compile import compile_layers

        compile_layers(model)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    steps = sft_steps(examples, config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(config, len(steps)))
    rows = sft_rows(examples)
    sizes, packs = layout_sizes(model), packing_supported(model)
    two_part = two_part_runs(model, config.two_part_attention)
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    log: list[dict[str, float]] = []
    kinds: set[str] = set()
    tokens = 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(steps), desc="sft", unit="step")
    first: tuple[float, int] | None = None  # (seconds, tokens) at the end of the first step
    start = time.perf_counter()
    for k, members in enumerate(steps):
        chosen = [rows[i] for i in members]
        units = make_layout(
            chosen, config.packing, config.max_seq_len, pad_id, sizes, packs=packs, two_part=two_part
        )
        kinds.add(layout_kind(units))
        n_loss = float(sum(r.num_loss_tokens for r in chosen))
        if n_loss == 0:
            continue
        with precision_context(config.mixed_precision, next(model.parameters()).device):
            result = nll_backward(model, units, num_loss_tokens=n_loss, two_part=config.two_part_attention)
        norm = (
            float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm))
            if config.max_grad_norm is not None
            else 0.0
        )
        lr = float(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += sum(len(r) for r in chosen)
        if first is None:
            first = (time.perf_counter() - start, tokens)
        if (k + 1) % config.log_every == 0 or k + 1 == len(steps):
            log.append(
                {
                    "step": float(k + 1),
                    "loss": result.stats.loss_sum / n_loss,
                    "learning_rate": lr,
                    "grad_norm": norm,
                    "num_tokens": float(tokens),
                    "layout_tokens": float(sum(u.num_tokens for u in units)),
                    "epoch": (k + 1) / max(1, len(steps)) * (config.epochs if config.max_steps == 0 else 1.0),
                }
            )
        if bar is not None:
            bar.update(1)
    wall = time.perf_counter() - start
    if bar is not None:
        bar.close()
    trained, model_dir = _save(model, tokenizer, config, out)
    kind = kinds.pop() if len(kinds) == 1 else "mixed"
    return SFTResult(
        model_dir=model_dir,
        steps=len(steps),
        trained_tokens=tokens,
        wall_s=wall,
        loss_before=loss_before,
        loss_after=demonstration_loss(trained, measured),
        packed=kind != "padded",
        log=log,
        layout=kind,
        trainer="ctxrl",
        first_step_s=first[0] if first else 0.0,
        steady_tokens_per_s=_steady_rate(first, wall, tokens),
        trained=trained,
    )


def sft_rows(examples: Sequence[SFTExample]) -> list[Row]:
    """The examples as the trainer's rows (loss on the completion tokens, no advantages), all in one group:
    every row of a step shares the system prompt, and the trie nests each episode's prefix under it."""
    return [
        Row(
            input_ids=list(e.input_ids),
            loss_mask=list(e.completion_mask),
            old_logprobs=[0.0] * len(e.input_ids),
            advantages=[0.0] * len(e.input_ids),
            edit_mask=[0] * len(e.input_ids),
            spans=[],
            episode=e.episode,
            group=0,
            steps=e.steps,
        )
        for e in examples
    ]


def _steady_rate(first: tuple[float, int] | None, wall: float, tokens: int) -> float:
    """Tokens a second after the first step, given ``(seconds, tokens)`` at its end and the run's totals;
    the whole run's rate when there was only one step."""
    if first is None or wall <= first[0] or tokens <= first[1]:
        return tokens / wall if wall > 0 else 0.0
    return (tokens - first[1]) / (wall - first[0])
