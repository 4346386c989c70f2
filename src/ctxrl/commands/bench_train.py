"""``ctxrl bench train``: what packed rows save, and how one ctxrl update compares with TRL's;
``ctxrl bench smollm2``: a real model's GRPO step, and the SFT path against TRL's.

    ctxrl bench train [--quick] [--json FILE]
    ctxrl bench smollm2 [--quick] [--json FILE]
    ctxrl bench smollm2_bf16 [--quick] [--json FILE]

**train** runs on the tiny model (built into a temporary folder), fp32, on one CPU thread (on a shared,
loaded machine two OpenMP threads stall each other at every barrier; one thread gives both sides of a ratio
the same compute), with synthetic token ids: what is measured is the update, not generation, so no engine
runs. Every ctxrl side is the trainer's own update, :func:`ctxrl.train.update.grpo_update` (layouts,
forward, loss, backward, gradient clipping, AdamW), called as :func:`ctxrl.train.grpo.train` calls it in one
process (:func:`trainer_update`). Times are the median of ``repeats`` (5) timed runs, with the spread
(slowest less fastest) beside each as ``*_spread_s``; the sides of each ratio run alternately so a busy
machine slows all of them, and the TRL comparison runs one warm-up round first (TRL initialises lazily).

**Tokens: packed rows vs one row per step.** Two synthetic 16-step *append-heavy* episodes (one group)
(:func:`append_heavy_episode`): a 128-token pinned prompt, every step generates 16 tokens and appends a
32-token observation; 2 of the 16 steps are edits, after which the harness rebuilds the prompt with the
oldest half of the editable region gone (the next step starts a new row). The rows come from the trainer's
own code (:func:`ctxrl.train.rows.episode_rows`); the naive layout is the same episodes with every step
marked as rebuilt, which the same code turns into one row per step.

- ``packed_vs_naive_tokens``: tokens through the model per episode, packed rows / one row per step (goal
  <= 0.35); ``packed_tokens_per_episode`` and ``naive_tokens_per_episode`` are the two counts.
- ``ctxrl_vs_naive_step_time``: seconds of one update on the packed rows with the trainer's defaults
  (``packing: auto``, 8,192-token microbatches) / on the naive rows as a naive trainer runs them, each row
  its own sequence in padded batches (``packing: padded``) (goal <= 0.35); ``packed_step_s`` and
  ``naive_step_s`` are the two times.

**ctxrl vs TRL on TRL's own case** (the parity batch, :func:`parity_batch`): single-step episodes with no
edits, 2 prompts of 64-256 tokens x 4 completions of 16-64 tokens, graded rewards. TRL's step is
``GRPOTrainer.training_step`` (its generation replaced by a ``rollout_func`` that returns the batch's ids, then
its rewards, group advantages, padded forward with its fused log-prob head, DAPO loss and backward) followed
by gradient clipping and AdamW; ctxrl's step is credit assignment, rows and :func:`grpo_update` (the same
clipping and AdamW inside). Settings that make
the two compute the same loss (checked to 1e-5 by ``tests/train/test_trl_parity.py``): TRL ``loss_type="dapo"``,
``beta=0``, ``epsilon=0.2``, ``epsilon_high=0.28``, ``importance_sampling_level="token"``, ``num_iterations=1``,
``bf16=False`` (TRL's default ``bf16=True`` autocasts its log-prob head to bfloat16 even on CPU); ctxrl
``w_eff=0``, ``tis_cap=None`` (TRL corrects for the engine only with vLLM), and ``scale_rewards="none"`` with
``scale_by_std=False``, because the two divide by different stds: TRL by the sample std + 1e-4, ctxrl by the
population std + ``eps`` (1e-6).

- ``ctxrl_vs_trl_step_time``: ctxrl's step / TRL's, with the layout the trainer picks by default
  (``packing: auto``: a shared prefix, packed lines or padded batches, whichever prices lowest in FLOPs)
  (goal <= 1.0); ``ctxrl_step_s``, ``trl_step_s``; ``ctxrl_auto_layout_shared`` and
  ``ctxrl_auto_layout_padded`` (1 or 0) say which layout that was.
- ``ctxrl_padded_vs_trl_step_time``: the same with ``packing: padded`` (when ``auto`` chose padded too, the
  two ctxrl rows time the same path and differ by noise only).

**smollm2** (both cores, as the trainer runs): one GRPO step of SmolLM2-135M-Instruct on the in-process vLLM
engine, 8 episodes of one ``short`` retention task in file mode, sampled as the GRPO configs sample
(:data:`GRPO_SAMPLING`; runs before 2026-12-06 10:00 UTC sampled at temperature 0.7, top-p 0.95), timed in parts (rollout, update, weight
sync), the update against the one it replaced (packed lines with full logits), FLOP and memory-bandwidth
efficiencies against this machine's measured matmul rate and copy bandwidth (the update's FLOPs:
:func:`ctxrl.train.rows.update_flops`, the attention's backward at twice its forward and the pairs the two-part
attention skips left out; runs before 2026-12-07 16:00 UTC counted twice the forward with every pair of the
mask, 5 % fewer on a recorded group with two-part attention, 15 % fewer with the mask); then ``sft_speedup``, the SFT
path against TRL's ``SFTTrainer`` on the same demonstrations, one sequence a step;
``sft_speedup_ladder``, the SFT path as the learning benchmark runs it (configs/sft_smollm2_ladder.yaml's
16k-token steps) against that same TRL run; and ``sft_speedup_episode_steps``, both trainers at the ladder's
sizes with the SFT path's steps holding whole episodes (:func:`_smollm2_step`, :func:`_sft_speedup`,
:data:`SFT_SETUPS` say what each figure is).
One timed repeat: a repeat of the update alone is about 15 minutes here.

**smollm2_bf16**: the same bench in bfloat16 (:data:`SMOL_BF16`): vLLM's weights in bfloat16, the update, the
legacy update and both SFT trainers under bfloat16 autocast with float32 weights (TRL ``bf16=True``). Its FLOP
efficiencies are against the same fp32 matmul rate as the fp32 bench's (the issue's yardstick), and
``*_vs_bf16`` against the bfloat16 rate measured in the same run (how far the work is from its own bound).

**smollm2_bf16_compiled**: ``smollm2_bf16`` with the ctxrl trainer's decoder layers compiled
(:data:`SMOL_BF16_COMPILED`, ``train.compile`` / ``sft.compile``) and, from 2026-12-06 10:00 UTC, the vLLM
engine's model too (``engine.compile``). Its timed update runs after the first one
(which compiles: ``smollm2_first_update_s``); the legacy update runs eager and TRL as in ``smollm2_bf16``.
``sft_steady_speedup`` compares the two SFT trainers after each one's first step (``sft_first_step_s`` holds
the compilation; the later setups reuse the compiled graphs); every section reports it.

``--quick`` is a smoke run of the same code on small sizes (``train``: 4-step episodes, short prompts, two
repeats; ``smollm2``: the tiny model with the scripted file manager as its engine); its ratios say the path
works, not what it saves.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ctxrl.train.engines import SamplingConfig, engine_spec
from ctxrl.train.trajectory import EpisodeRecord, StepCost, StepRecord

if TYPE_CHECKING:
    from ctxrl.train.config import LoraSettings, TrainConfig
    from ctxrl.train.sft import SFTConfig

MAX_TOKENS = 8192
"""Tokens per microbatch: ``TrainConfig.max_tokens_per_microbatch``'s default."""


@dataclass(frozen=True)
class Sizes:
    """The workload of one run of the benchmark."""

    steps: int
    first_prompt: int
    generated: int
    observation: int
    edit_steps: tuple[int, ...]
    episodes: int
    groups: int
    group_size: int
    prompt_tokens: tuple[int, int]
    completion_tokens: tuple[int, int]
    repeats: int


FULL = Sizes(
    steps=16,
    first_prompt=128,
    generated=16,
    observation=32,
    edit_steps=(5, 10),
    episodes=2,
    groups=2,
    group_size=4,
    prompt_tokens=(64, 256),
    completion_tokens=(16, 64),
    repeats=5,
)
QUICK = Sizes(
    steps=4,
    first_prompt=64,
    generated=8,
    observation=16,
    edit_steps=(1,),
    episodes=2,
    groups=2,
    group_size=2,
    prompt_tokens=(8, 24),
    completion_tokens=(4, 12),
    repeats=2,
)


# ---- synthetic records ----------------------------------------------------------------------------------


def synthetic_step(
    prompt: Sequence[int],
    generated: Sequence[int],
    *,
    source: str,
    logprobs: Sequence[float] | None = None,
    edit: bool = False,
) -> StepRecord:
    """A step record with the fields training reads filled in (ids, engine logprobs, edit mask, source)."""
    n = len(generated)
    return StepRecord(
        prompt_ids=list(prompt),
        token_ids=list(generated),
        logprobs=list(logprobs) if logprobs is not None else [-1.0] * n,
        edit_mask=[int(edit)] * n,
        finish_reason="stop",
        num_cached_tokens=0,
        prompt_source=source,
        rebuild_reason="edit" if source == "rebuild" else None,
        text="",
        tool_calls=["bash"],
        edit_calls=[0] if edit else [],
        receipts=[],
        receipt_kinds=[],
        readout="",
        nudges=[],
        context_tokens=len(prompt) + n,
        edited=edit,
        free_turn=False,
        cost=StepCost(prompt_tokens=len(prompt), cached_tokens=0, generated_tokens=n, flops=None),
    )


def synthetic_episode(
    steps: Sequence[StepRecord], *, group: int, index: int, reward: float, cost: float = 1.0
) -> EpisodeRecord:
    """An episode record around ``steps``; ``reward`` is its task reward (success when it is 1)."""
    return EpisodeRecord(
        task_id=f"bench-{group}",
        family="synthetic",
        split="train",
        seed=group,
        difficulty="easy",
        mode="file",
        skill_id="0" * 16,
        group=group,
        index=index,
        engine="synthetic",
        success=reward >= 1.0,
        score=reward,
        reward=reward,
        end_reason="submit",
        answer=None,
        verdict="",
        cost_tokens=cost,
        cost_flops=None,
        steps=list(steps),
    )


def _ids(rng: Any, regular: Any, n: int) -> list[int]:
    """``n`` ids drawn from ``regular`` (the tokenizer's non-special ids) with the torch generator ``rng``."""
    import torch

    return [int(x) for x in regular[torch.randint(0, len(regular), (n,), generator=rng)]]


def append_heavy_episode(
    sizes: Sizes, regular: Any, *, seed: int, group: int = 0, index: int = 0, reward: float = 1.0
) -> EpisodeRecord:
    """A ``sizes.steps``-step episode: each step generates ``generated`` ids and appends ``observation`` ids
    to the prompt; after the steps in ``edit_steps`` (edits) the next prompt is rebuilt without the oldest
    half of the editable region (the pinned ``first_prompt`` ids stay)."""
    import torch

    rng = torch.Generator().manual_seed(seed)
    pinned = _ids(rng, regular, sizes.first_prompt)
    region: list[int] = []
    source = "reset"
    steps = []
    for k in range(sizes.steps):
        generated = _ids(rng, regular, sizes.generated)
        edit = k in sizes.edit_steps
        steps.append(synthetic_step([*pinned, *region], generated, source=source, edit=edit))
        region = [*region, *generated, *_ids(rng, regular, sizes.observation)]
        source = "extend"
        if edit:
            region = region[len(region) // 2 :]
            source = "rebuild"
    return synthetic_episode(steps, group=group, index=index, reward=reward)


def one_row_per_step(episode: EpisodeRecord) -> EpisodeRecord:
    """``episode`` with every step marked as rebuilt: the rows code then gives one row per step (naive)."""
    return replace(episode, steps=[replace(s, prompt_source="rebuild") for s in episode.steps])


# ---- the parity batch (TRL's case) --------------------------------------------------------------------


@dataclass(frozen=True)
class ParityBatch:
    """Single-step episodes with no edits: ``groups`` prompts with ``group_size`` completions each."""

    prompts: list[list[int]]
    completions: list[list[list[int]]]
    """``completions[g][j]``: the ids of completion j of prompt g."""
    rewards: list[list[float]]
    logprobs: list[list[list[float]]]
    """The engine's logprob of each completion id (only TIS would read them)."""

    def prompt_text(self, g: int) -> str:
        """The dataset prompt that stands for prompt ``g`` (TRL needs a text; its ``rollout_func`` maps it back)."""
        return f"parity prompt {g}"


def regular_ids(tokenizer: Any) -> Any:
    """The tokenizer's ids that are not added/special tokens, as a tensor (what synthetic text is made of)."""
    import torch

    special = set(tokenizer.get_added_vocab().values()) | set(tokenizer.all_special_ids)
    return torch.tensor([i for i in range(len(tokenizer)) if i not in special])


def parity_batch(
    tokenizer: Any,
    *,
    groups: int,
    group_size: int,
    prompt_tokens: tuple[int, int],
    completion_tokens: tuple[int, int],
    seed: int = 0,
) -> ParityBatch:
    """Random prompts and completions of lengths in the given ``[low, high]`` ranges, graded rewards in
    {0, 0.25, ..., 1} with both 0 and 1 in every group (so every group has variance)."""
    import torch

    regular = regular_ids(tokenizer)
    rng = torch.Generator().manual_seed(seed)

    def length(bounds: tuple[int, int]) -> int:
        return int(torch.randint(bounds[0], bounds[1] + 1, (1,), generator=rng))

    prompts, completions, rewards, logprobs = [], [], [], []
    for _ in range(groups):
        prompts.append(_ids(rng, regular, length(prompt_tokens)))
        comps = [_ids(rng, regular, length(completion_tokens)) for _ in range(group_size)]
        completions.append(comps)
        graded = [float(x) / 4 for x in torch.randint(0, 5, (group_size,), generator=rng)]
        graded[0], graded[-1] = 1.0, 0.0
        rewards.append(graded)
        logprobs.append([[-1.0 - 0.01 * t for t in range(len(c))] for c in comps])
    return ParityBatch(prompts=prompts, completions=completions, rewards=rewards, logprobs=logprobs)


def parity_episodes(batch: ParityBatch) -> list[EpisodeRecord]:
    """One single-step episode per completion, group by group, in TRL's order."""
    return [
        synthetic_episode(
            [synthetic_step(prompt, comp, source="reset", logprobs=batch.logprobs[g][j])],
            group=g,
            index=j,
            reward=batch.rewards[g][j],
        )
        for g, prompt in enumerate(batch.prompts)
        for j, comp in enumerate(batch.completions[g])
    ]


def trl_generation_batch(batch: ParityBatch) -> list[dict[str, str]]:
    """TRL's generation batch: each prompt repeated ``group_size`` times, as its sampler yields them."""
    return [{"prompt": batch.prompt_text(g)} for g in range(len(batch.prompts)) for _ in batch.completions[g]]


def trl_trainer(model_dir: Path, tokenizer: Any, batch: ParityBatch, *, scale_rewards: str, out: Path) -> Any:
    """A TRL ``GRPOTrainer`` whose generation returns ``batch`` and whose reward function returns its rewards.

    The configuration is the one that computes ctxrl's loss (see the module docstring); ``scale_rewards`` is
    TRL's (``"none"`` matches ctxrl's ``scale_by_std: false``). ``_compute_loss`` reads
    ``current_gradient_accumulation_steps``, which TRL's own training loop sets; here it is 1.
    """
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    by_text = {batch.prompt_text(g): g for g in range(len(batch.prompts))}
    reward_of = {
        (g, tuple(c)): batch.rewards[g][j]
        for g, comps in enumerate(batch.completions)
        for j, c in enumerate(comps)
    }

    def rollout_func(prompts: list[str], trainer: Any) -> dict[str, Any]:
        seen: dict[int, int] = {}
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "group": []}
        for text in prompts:
            g = by_text[text]
            j = seen.get(g, 0)
            seen[g] = j + 1
            out["prompt_ids"].append(batch.prompts[g])
            out["completion_ids"].append(batch.completions[g][j])
            out["logprobs"].append(batch.logprobs[g][j])
            out["group"].append(g)
        return out

    def reward(completion_ids: list[list[int]], group: list[int], **_: Any) -> list[float | None]:
        return [reward_of[(g, tuple(ids))] for g, ids in zip(group, completion_ids)]

    group_size = len(batch.completions[0])
    n = sum(len(c) for c in batch.completions)
    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=n,
        num_generations=group_size,
        max_completion_length=max(len(c) for comps in batch.completions for c in comps),
        loss_type="dapo",
        scale_rewards=scale_rewards,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        importance_sampling_level="token",
        num_iterations=1,
        temperature=1.0,
        bf16=False,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(
            [{"prompt": batch.prompt_text(g)} for g in range(len(batch.prompts))]
        ),
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )
    trainer.current_gradient_accumulation_steps = 1
    model: Any = trainer.model
    model.train()
    return trainer


# ---- one optimiser step, ctxrl's way --------------------------------------------------------------------


def ctxrl_backward(
    model: Any,
    rows: Sequence[Any],
    *,
    packing: str = "auto",
    pad_id: int,
    loss_config: Any,
    max_tokens: int = MAX_TOKENS,
    old_logprobs: Callable[[Any, Any], Any] | None = None,
) -> float:
    """Forward, loss and backward over ``rows`` as the trainer's update runs them
    (:func:`ctxrl.train.update.backward_layout` on the layout ``packing`` gives: ``auto`` prices shared
    prefixes, packed lines and padding and takes the cheapest, as the trainer does in one process); gradients
    accumulate in ``model``. ``old_logprobs(microbatch, logprobs)`` gives the old logprobs of a microbatch from
    its current ones (None: on-policy). Returns the step's loss."""
    from ctxrl.train.logprobs import packing_supported
    from ctxrl.train.update import backward_layout, layout_logprobs, layout_sizes, make_layout

    packs = packing == "packed" or packing_supported(model)
    units = make_layout(rows, packing, max_tokens, pad_id, layout_sizes(model), packs=packs)
    olds = None
    if old_logprobs is not None:
        device = next(model.parameters()).device
        current = layout_logprobs(model, units, device)
        olds = [
            [old_logprobs(mb, lp) for mb, lp in zip(u.all_batches(), lps)] for u, lps in zip(units, current)
        ]
    n_tokens = float(sum(u.num_loss_tokens for u in units))
    return backward_layout(model, units, loss_config, num_loss_tokens=n_tokens, old_logprobs=olds).loss


def _optimizer_step(model: Any, optimizer: Any) -> None:
    import torch

    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@dataclass(frozen=True)
class Timing:
    """Seconds of repeated runs of one function: the median and the spread (slowest less fastest)."""

    median: float
    spread: float


def alternate_runs(
    fns: Sequence[Callable[[], None]],
    repeats: int,
    *,
    warmup: int = 0,
    reverse_odd: bool = False,
    after_round: Callable[[int, list[float]], None] | None = None,
) -> list[list[float]]:
    """Seconds of each of ``fns`` in each of ``repeats`` timed rounds, ``[fn][round]``: ``fns`` run in turn
    (``warmup`` untimed rounds first) so a busy or drifting machine slows every side alike; ``reverse_odd``
    runs them in reverse order in every other round (ABBA), so neither side always runs first;
    ``after_round(round, seconds)`` sees each timed round's seconds in ``fns``' order.

    >>> calls = []
    >>> times = alternate_runs([lambda: calls.append("a"), lambda: calls.append("b")], 2, reverse_odd=True)
    >>> calls, [len(t) for t in times]
    (['a', 'b', 'b', 'a'], [2, 2])
    """
    times: list[list[float]] = [[] for _ in fns]
    for r in range(warmup + repeats):
        order = list(range(len(fns)))
        if reverse_odd and r >= warmup and (r - warmup) % 2 == 1:
            order.reverse()
        for i in order:
            start = time.perf_counter()
            fns[i]()
            if r >= warmup:
                times[i].append(time.perf_counter() - start)
        if r >= warmup and after_round is not None:
            after_round(r - warmup, [t[-1] for t in times])
    return times


def pair_summary(names: tuple[str, str], times: Sequence[Sequence[float]]) -> str:
    """One line on two sides timed in pairs (:func:`alternate_runs`): each side's median, the median ratio
    second / first, and in how many pairs the second was faster.

    >>> pair_summary(("mask", "two-part"), [[2.0, 4.0, 3.0], [1.0, 3.0, 3.3]])
    'median: mask 3.00 s two-part 3.00 s; two-part / mask 0.750; two-part faster in 2 of 3 pairs'
    """
    first, second = times
    ratios = [b / a for a, b in zip(first, second, strict=True)]
    faster = sum(r < 1 for r in ratios)
    return (
        f"median: {names[0]} {statistics.median(first):.2f} s {names[1]} {statistics.median(second):.2f} s;"
        f" {names[1]} / {names[0]} {statistics.median(ratios):.3f}; {names[1]} faster in {faster} of"
        f" {len(ratios)} pairs"
    )


def time_two_part_pairs(step: Callable[[bool], None], pairs: int) -> None:
    """``step(two_part)`` with the mask (False) and in two parts (True), timed in ``pairs`` alternated pairs
    after one untimed round (:func:`alternate_runs`, mask first in odd pairs): prints each pair's seconds and
    the :func:`pair_summary` (the probes' ``--pairs``)."""

    def report(i: int, seconds: list[float]) -> None:
        print(f"pair {i + 1}: mask {seconds[0]:.2f} s two-part {seconds[1]:.2f} s", flush=True)

    times = alternate_runs(
        [lambda: step(False), lambda: step(True)], pairs, warmup=1, reverse_odd=True, after_round=report
    )
    print(pair_summary(("mask", "two-part"), times), flush=True)


def _alternate(fns: Sequence[Callable[[], None]], repeats: int, *, warmup: int = 0) -> list[Timing]:
    """The timings of ``fns``, run in turn (``warmup`` untimed rounds, then ``repeats`` timed), so a busy
    machine slows every side of a ratio alike."""
    times = alternate_runs(fns, repeats, warmup=warmup)
    return [Timing(statistics.median(t), max(t) - min(t)) for t in times]


def trainer_update(model: Any, optimizer: Any, rows: Sequence[Any], config: Any, pad_id: int) -> Any:
    """One update as :func:`ctxrl.train.grpo.train` runs it in one process: :func:`grpo_update` (layouts,
    forward, loss, backward, clipping, the optimiser step) with the trainer's packing check and layout sizes."""
    from ctxrl.train.update import grpo_update, layout_sizes, packs_lines

    return grpo_update(
        _accelerator(),
        model,
        optimizer,
        rows,
        config,
        pad_id=pad_id,
        sizes=layout_sizes(model),
        packs=packs_lines(config, model),
        shared_ok=True,
    )


def _accelerator() -> Any:
    from accelerate import Accelerator

    return Accelerator(cpu=True)


# ---- the benchmark --------------------------------------------------------------------------------------


def _policy(model_dir: Path) -> tuple[Any, Any]:
    import torch

    from ctxrl.train.config import TrainConfig
    from ctxrl.train.policy import load_policy

    model = load_policy(model_dir, TrainConfig()).train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-6)


def _packed_vs_naive(model_dir: Path, tokenizer: Any, sizes: Sizes) -> dict[str, float]:
    from ctxrl.rewards.advantages import AdvantageConfig
    from ctxrl.train.config import TrainConfig
    from ctxrl.train.credit import CreditConfig, assign_credit
    from ctxrl.train.loss import LossConfig
    from ctxrl.train.rows import episode_rows, row_stats

    regular = regular_ids(tokenizer)
    episodes = [
        append_heavy_episode(sizes, regular, seed=i, index=i, reward=float(i % 2 == 0))
        for i in range(sizes.episodes)
    ]
    credit = assign_credit(episodes, CreditConfig(advantages=AdvantageConfig(w_eff=0.25)))

    def rows_of(eps: Sequence[EpisodeRecord]) -> list[Any]:
        return [
            r
            for i, (ep, c) in enumerate(zip(eps, credit))
            for r in episode_rows(ep, c.steps, episode_index=i)
        ]

    packed_rows = rows_of(episodes)
    naive_rows = rows_of([one_row_per_step(ep) for ep in episodes])
    stats = row_stats(packed_rows, episodes)
    assert stats.naive_tokens == sum(len(r) for r in naive_rows), "one row per step is the naive layout"
    model, optimizer = _policy(model_dir)
    pad_id = int(tokenizer.pad_token_id or 0)
    trained = TrainConfig(loss=LossConfig(tis_cap=None), max_tokens_per_microbatch=MAX_TOKENS)
    # the naive trainer: every step its own sequence, batched with padding (no packing, no shared prefix)
    naive = replace(trained, packing="padded")

    def step(rows: Sequence[Any], config: TrainConfig) -> Callable[[], None]:
        def run() -> None:
            trainer_update(model, optimizer, rows, config, pad_id)

        return run

    packed, plain = _alternate([step(packed_rows, trained), step(naive_rows, naive)], sizes.repeats)
    n = float(len(episodes))
    return {
        "packed_vs_naive_tokens": stats.packed_vs_naive,
        "packed_tokens_per_episode": stats.tokens / n,
        "naive_tokens_per_episode": stats.naive_tokens / n,
        "ctxrl_vs_naive_step_time": packed.median / plain.median,
        "packed_step_s": packed.median,
        "packed_step_spread_s": packed.spread,
        "naive_step_s": plain.median,
        "naive_step_spread_s": plain.spread,
    }


def _ctxrl_vs_trl(model_dir: Path, tokenizer: Any, sizes: Sizes, tmp: Path) -> dict[str, float]:
    import torch

    from ctxrl.rewards.advantages import AdvantageConfig
    from ctxrl.train.config import TrainConfig
    from ctxrl.train.credit import CreditConfig, assign_credit
    from ctxrl.train.loss import LossConfig
    from ctxrl.train.rows import episode_rows, layout_kind

    batch = parity_batch(
        tokenizer,
        groups=sizes.groups,
        group_size=sizes.group_size,
        prompt_tokens=sizes.prompt_tokens,
        completion_tokens=sizes.completion_tokens,
    )
    trainer = trl_trainer(model_dir, tokenizer, batch, scale_rewards="none", out=tmp / "trl")
    trl_optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-6)
    generation_batch = trl_generation_batch(batch)

    def trl_step() -> None:
        trainer.training_step(trainer.model, generation_batch, None)
        _optimizer_step(trainer.model, trl_optimizer)

    model, optimizer = _policy(model_dir)
    episodes = parity_episodes(batch)
    credit_config = CreditConfig(advantages=AdvantageConfig(w_eff=0.0, scale_by_std=False))
    config = TrainConfig(
        loss=LossConfig(epsilon_low=0.2, epsilon_high=0.28, kl_coef=0.0, tis_cap=None),
        max_tokens_per_microbatch=MAX_TOKENS,
    )
    pad_id = int(tokenizer.pad_token_id or 0)
    kinds: dict[str, str] = {}

    def ctxrl_step(packing: Literal["auto", "padded"]) -> Callable[[], None]:
        def run() -> None:
            credit = assign_credit(episodes, credit_config)
            rows = [
                r
                for i, (ep, c) in enumerate(zip(episodes, credit))
                for r in episode_rows(ep, c.steps, episode_index=i)
            ]
            update = trainer_update(model, optimizer, rows, replace(config, packing=packing), pad_id)
            kinds[packing] = layout_kind(update.layouts[0])

        return run

    auto, padded, trl = _alternate(
        [ctxrl_step("auto"), ctxrl_step("padded"), trl_step], sizes.repeats, warmup=1
    )
    return {
        "ctxrl_vs_trl_step_time": auto.median / trl.median,
        "ctxrl_padded_vs_trl_step_time": padded.median / trl.median,
        "ctxrl_step_s": auto.median,
        "ctxrl_step_spread_s": auto.spread,
        # which layout ``packing: auto`` priced cheapest here (if padded, the two ctxrl rows time one path)
        "ctxrl_auto_layout_shared": float(kinds["auto"] == "shared"),
        "ctxrl_auto_layout_padded": float(kinds["auto"] == "padded"),
        "ctxrl_padded_step_s": padded.median,
        "ctxrl_padded_step_spread_s": padded.spread,
        "trl_step_s": trl.median,
        "trl_step_spread_s": trl.spread,
    }


# ---- a real model's GRPO step: SmolLM2 on a group of `short` retention episodes ----------------------------


@dataclass(frozen=True)
class StepSizes:
    """The real-model section: which model, engine and group, and how many timed repeats."""

    model: str
    engine: Literal["vllm", "scripted"]
    group_size: int
    difficulty: str
    max_new_tokens: int
    max_tokens: int
    matmul_n: int
    repeats: int
    max_steps: int | None = None
    precision: Literal["fp32", "bf16"] = "fp32"
    """``bf16``: the engine's weights in bfloat16 (``engine.dtype``), the update and both SFT trainers under
    bfloat16 autocast with float32 weights (``train.mixed_precision`` / ``sft.mixed_precision``)."""
    compile: bool = False
    """The trainer's decoder layers compiled (``train.compile`` / ``sft.compile``, the ctxrl side only: the
    legacy update runs eager, TRL as configs/sft_smollm2.yaml sets it up), and the engine's model where the
    engine compiles (``engine.compile``: vLLM)."""

    @property
    def mixed_precision(self) -> Literal["bf16", "no"]:
        """The trainers' ``mixed_precision`` setting for this precision."""
        return "bf16" if self.precision == "bf16" else "no"


GRPO_TWO_PART = True
"""The GRPO configs' ``train.two_part_attention`` (configs/train_smollm2*.yaml), which the smollm2 bench's update
runs with: 0.93 of the masked update's time on an EPYC (four of four alternated pairs on a recorded group) and
0.97 on a Xeon with AMX (two of three) (``scripts/probe_layouts.py --pairs``; docs/train_throughput.md,
"Fifteenth run" and "Sixteenth run")."""


GRPO_SAMPLING = SamplingConfig(temperature=1.0, top_p=1.0)
"""How the GRPO configs sample (configs/train_smollm2*.yaml). On vLLM's CPU build a top-p below 1 sorts the
whole vocabulary at every decode pass: the smollm2 bench's 8 episodes took 150 s at 0.95 against 122 s at 1
(``scripts/probe_rollout.py``; docs/train_throughput.md, "Eighth run")."""


SMOL = StepSizes("smollm2-135m-instruct", "vllm", 8, "short", 256, 4096, 1536, 1)
"""Full run: SmolLM2-135M-Instruct on the in-process vLLM engine, 8 episodes of one `short` task, file mode,
the learning benchmark's settings (configs/train_smollm2.yaml: LoRA r=16, 256 new tokens, 4,096-token
microbatches)."""
SMOL_QUICK = StepSizes("tiny", "scripted", 2, "short", 64, 4096, 256, 1, max_steps=4)
"""Smoke run of the same code: the tiny model, the scripted file manager as the engine."""
SMOL_BF16 = replace(SMOL, precision="bf16")
SMOL_BF16_QUICK = replace(SMOL_QUICK, precision="bf16")
SMOL_BF16_COMPILED = replace(SMOL_BF16, compile=True)
SMOL_BF16_COMPILED_QUICK = replace(SMOL_BF16_QUICK, compile=True)


def matmul_flops_per_s(
    n: int, repeats: int = 3, *, shape: tuple[int, int] | None = None, dtype: Any = None
) -> float:
    """This machine's matrix-multiply rate at torch's current thread count: the best of ``repeats``
    ``n × n`` products (``2n³`` FLOPs each) in fp32; with ``shape`` = ``(m, k)`` an ``m × k`` by ``k × n``
    product instead, and with ``dtype`` in that dtype."""
    import torch

    m, k = shape if shape is not None else (n, n)
    dtype = dtype if dtype is not None else torch.float32
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    torch.mm(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2.0 * m * k * n / best


def memory_bytes_per_s(megabytes: int = 256, repeats: int = 3) -> float:
    """This machine's memory bandwidth as torch sees it: the best of ``repeats`` copies of a
    ``megabytes``-MB fp32 tensor (each reads and writes it: twice its size moved)."""
    import torch

    src = torch.ones(megabytes * (1 << 20) // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up: pages mapped
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2.0 * src.numel() * 4 / best


def decode_passes(episodes: Sequence[EpisodeRecord]) -> int:
    """Forward passes the engine made to decode ``episodes``: the rollout loop asks for step ``k`` of every
    live episode in one call, and a call decodes as many passes as its longest generation."""
    steps = max((len(ep.steps) for ep in episodes), default=0)
    return sum(
        max((len(ep.steps[k].token_ids) for ep in episodes if k < len(ep.steps)), default=0)
        for k in range(steps)
    )


def rollout_flops(episodes: Sequence[EpisodeRecord], model: Any) -> float:
    """Model FLOPs the engine did for ``episodes``: every call's prefilled and generated tokens through the
    body and attention (:func:`ctxrl.rewards.cost.step_flops`, with the engine's own cache hits), plus the
    LM head at each generated token."""
    from ctxrl.rewards.cost import ModelGeometry, StepTokens, step_flops

    geometry = ModelGeometry.from_config(model.config)
    head = int(model.get_output_embeddings().weight.numel())
    total = 0.0
    for ep in episodes:
        for step in ep.steps:
            tokens = StepTokens(len(step.prompt_ids), step.num_cached_tokens, len(step.token_ids))
            total += step_flops(tokens, geometry) + 2.0 * head * len(step.token_ids)
    return total


def legacy_packed_backward(model: Any, rows: Sequence[Any], loss_config: Any, max_tokens: int) -> None:
    """The update as it ran before shared prefixes: packed lines, the LM head, log-softmax and entropy at
    every position (``token_logprobs`` without a loss mask)."""
    import torch

    from ctxrl.train.logprobs import token_logprobs
    from ctxrl.train.loss import policy_loss
    from ctxrl.train.rows import pack_rows

    batches = pack_rows(rows, max_tokens)
    n_tokens = float(sum(mb.num_loss_tokens for mb in batches))
    for mb in batches:
        lp, _ = token_logprobs(
            model, torch.from_numpy(mb.input_ids), torch.from_numpy(mb.position_ids), with_entropy=True
        )
        out = policy_loss(
            lp,
            None,
            torch.from_numpy(mb.old_logprobs).float(),
            torch.from_numpy(mb.advantages).float(),
            torch.from_numpy(mb.loss_mask).float(),
            loss_config,
            num_loss_tokens=n_tokens,
        )
        out.loss.backward()


def configs_lora() -> LoraSettings:
    """The LoRA adapter of the SmolLM2 SFT configs and of the ladder's GRPO config: r = 16, alpha 32, no dropout
    (on a CPU the adapters' input dropout took a fifth of an SFT step)."""
    from ctxrl.train.config import LoraSettings

    return LoraSettings(enabled=True, r=16, alpha=32, dropout=0.0)


def step_train_config(sizes: StepSizes) -> TrainConfig:
    """The ``TrainConfig`` the smollm2 benches' update runs with: the ladder's GRPO LoRA (r = 16, no dropout,
    configs/train_smollm2_ladder.yaml) and the configs' attention (:data:`GRPO_TWO_PART`); ``sizes``'
    microbatch, precision and compiled layers."""
    from ctxrl.train.config import TrainConfig

    return TrainConfig(
        lora=configs_lora(),
        max_tokens_per_microbatch=sizes.max_tokens,
        mixed_precision=sizes.mixed_precision,
        compile=sizes.compile,
        two_part_attention=GRPO_TWO_PART,
    )


def _smollm2_step(sizes: StepSizes, tmp: Path) -> dict[str, float]:
    """One GRPO step of a real model, timed in parts, and today's update against the one it replaced."""
    import torch

    from ctxrl.env.policies import make_policy
    from ctxrl.env.tasks.registry import make_task
    from ctxrl.env.tokenizer import load_tokenizer_dir
    from ctxrl.rewards.advantages import AdvantageConfig
    from ctxrl.train.compile import compile_layers
    from ctxrl.train.credit import CreditConfig, assign_credit
    from ctxrl.train.engines import EngineConfig, make_engine
    from ctxrl.train.engines.scripted import text_policy
    from ctxrl.train.models import get_model
    from ctxrl.train.policy import load_policy
    from ctxrl.train.rollout import RolloutConfig, rollout
    from ctxrl.train.rows import episode_rows, layout_kind, pack_rows, plain_units, update_flops
    from ctxrl.train.update import layout_sizes, precision_context, two_part_runs

    bf16 = sizes.precision == "bf16"
    model_dir = get_model(sizes.model, tmp / "step-model" if sizes.model == "tiny" else None)
    tokenizer = load_tokenizer_dir(model_dir)
    policy = None
    if engine_spec(sizes.engine).needs_policy:
        policy = text_policy(make_policy("file-manager"), tokenizer)
    engine = make_engine(
        EngineConfig(
            name=sizes.engine,
            max_model_len=4096,
            dtype="bfloat16" if bf16 else None,
            compile=sizes.compile and engine_spec(sizes.engine).compiles,
        ),
        model_dir,
        tokenizer=tokenizer,
        policy=policy,
    )
    config = step_train_config(sizes)
    model = load_policy(model_dir, config).train()
    if config.compile:
        compile_layers(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    loss_config, pad_id = config.loss, int(tokenizer.pad_token_id or 0)
    task = make_task("retention", 0, sizes.difficulty, split="train")
    try:
        t0 = time.perf_counter()
        result = rollout(
            engine,
            tokenizer,
            [task],
            RolloutConfig(group_size=sizes.group_size, mode="file", max_steps=sizes.max_steps),
            sampling=replace(GRPO_SAMPLING, max_new_tokens=sizes.max_new_tokens),
        )
        rollout_s = time.perf_counter() - t0
        # rewards that alternate, so every episode carries advantages (the figure is the update's speed)
        episodes = [replace(ep, reward=float(i % 2)) for i, ep in enumerate(result.episodes)]
        credit = assign_credit(episodes, CreditConfig(advantages=AdvantageConfig(w_eff=0.25)))
        rows = [
            r
            for i, (ep, c) in enumerate(zip(episodes, credit))
            for r in episode_rows(ep, c.steps, episode_index=i)
        ]
        geometry = layout_sizes(model)
        assert geometry is not None

        def update() -> None:
            trainer_update(model, optimizer, rows, config, pad_id)

        def legacy() -> None:
            # the update being replaced runs as it did: eager, whatever the section compiles
            with precision_context(config.mixed_precision, "cpu"), torch.compiler.set_stance("force_eager"):
                legacy_packed_backward(model, rows, loss_config, sizes.max_tokens)
            _optimizer_step(model, optimizer)

        t1 = time.perf_counter()
        units = trainer_update(model, optimizer, rows, config, pad_id).layouts[0]
        update_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        if engine_spec(sizes.engine).weight_sync != "none":  # a scripted engine has no weights
            engine.update_weights(model)
        sync_s = time.perf_counter() - t2
    finally:
        engine.close()
    new, old = _alternate([update, legacy], sizes.repeats)
    new_s, old_s = new.median, old.median
    packed_units = plain_units(pack_rows(rows, sizes.max_tokens))
    # model FLOPs of the update as its kernels compute them: forward + the backward to the activations, the
    # attention as the update runs it (two parts or the mask)
    flops = update_flops(units, geometry, two_part=two_part_runs(model, config.two_part_attention))
    matmul = matmul_flops_per_s(sizes.matmul_n)
    # the targets are against the fp32 rate; in bf16 the bf16 rate says how far the work is from its own bound
    matmul_bf16 = matmul_flops_per_s(sizes.matmul_n, dtype=torch.bfloat16) if bf16 else None
    figures: dict[str, float] = {
        "smollm2_episodes": float(len(episodes)),
        "smollm2_rows": float(len(rows)),
        "shared_prefix_vs_packed_tokens": sum(u.num_tokens for u in units)
        / sum(u.num_tokens for u in packed_units),
        "smollm2_layout_shared": float(layout_kind(units) == "shared"),
        "smollm2_update_speedup": old_s / new_s,
        "smollm2_update_s": new_s,
        "smollm2_legacy_update_s": old_s,
        "update_flops_efficiency": flops / new_s / matmul,
        "matmul_gflops": matmul / 1e9,
        "smollm2_rollout_s": rollout_s,
        "smollm2_step_s": rollout_s + update_s + sync_s,
        # the first update pays the warm-up (and with compile the compilation); the timed one does not
        "smollm2_first_update_s": update_s,
        "smollm2_steady_step_s": rollout_s + new_s + sync_s,
    }
    if matmul_bf16 is not None:
        figures["matmul_bf16_gflops"] = matmul_bf16 / 1e9
        figures["update_flops_efficiency_vs_bf16"] = flops / new_s / matmul_bf16
    if engine_spec(
        sizes.engine
    ).has_model:  # a scripted engine runs no model: its rollout does no model FLOPs
        done = rollout_flops(episodes, model) / rollout_s
        figures["rollout_flops_efficiency"] = done / matmul
        if matmul_bf16 is not None:
            figures["rollout_flops_efficiency_vs_bf16"] = done / matmul_bf16
        # decoding a small batch is bound by reading the weights once per pass, not by FLOPs (the engine's
        # weights: 2 bytes a parameter in bfloat16)
        weight_bytes = sum(
            p.numel() * (2 if bf16 else p.element_size()) for p in model.get_base_model().parameters()
        )
        membw = memory_bytes_per_s()
        figures["rollout_decode_passes"] = float(decode_passes(episodes))
        figures["rollout_membw_efficiency"] = decode_passes(episodes) * weight_bytes / membw / rollout_s
        figures["memory_gb_per_s"] = membw / 1e9
    return figures


@dataclass(frozen=True)
class SFTSetup:
    max_seq_len: int
    batch_tokens: int
    steps_by: Literal["example", "episode"]
    tasks: int
    """Demonstrations (one task each) trained on."""
    two_part: bool = True
    """The SFT path's ``sft.two_part_attention`` (the configs set it)."""
    trl_from: str | None = None
    """The setup whose TRL run this one's SFT path is measured against (on the same demonstrations); None: a
    TRL run of its own at the same sequence length and tokens per step."""


SFT_SETUPS = {
    "": SFTSetup(max_seq_len=2048, batch_tokens=2048, steps_by="example", tasks=2),
    "_ladder": SFTSetup(max_seq_len=4096, batch_tokens=16384, steps_by="example", tasks=2, trl_from=""),
    "_episode_steps": SFTSetup(max_seq_len=4096, batch_tokens=16384, steps_by="episode", tasks=4),
}
"""The SFT setups the bench times, by the suffix of their figures:

- ``""``: both trainers as configs/sft_smollm2.yaml (one 2,048-token sequence a step, so nothing to share);
- ``_ladder``: the SFT path as configs/sft_smollm2_ladder.yaml runs it in the learning benchmark (16k tokens a
  step of rows up to 4,096, each step's system prompt computed once) against TRL as configs/sft_smollm2.yaml
  (``""``'s run): the comparison issue 22 sets, the SFT path as used against TRL as it was set up;
- ``_episode_steps``: both at the ladder's sizes, the ctxrl trainer's steps holding whole episodes
  (``sft.steps_by: episode``); TRL at 4,096-token sequences of 16k tokens a step."""


def scripted_demonstrations(
    model_dir: Path, tokenizer: Any, seeds: Sequence[int], difficulty: str, *, max_steps: int | None = None
) -> list[EpisodeRecord]:
    """The scripted file manager's file-mode episodes of the train-split retention tasks ``seeds`` at
    ``difficulty``, one each, recorded through the rollout loop with ``tokenizer`` (the SFT benches' and
    ``scripts/probe_sft_step.py``'s demonstrations); ``max_steps`` caps each episode."""
    from ctxrl.env.policies import make_policy
    from ctxrl.env.tasks.registry import make_task
    from ctxrl.train.engines import EngineConfig, make_engine
    from ctxrl.train.engines.scripted import text_policy
    from ctxrl.train.rollout import RolloutConfig, rollout

    policy = text_policy(make_policy("file-manager"), tokenizer)
    engine = make_engine(EngineConfig(name="scripted"), model_dir, tokenizer=tokenizer, policy=policy)
    tasks = [make_task("retention", seed, difficulty, split="train") for seed in seeds]
    return rollout(
        engine,
        tokenizer,
        tasks,
        RolloutConfig(group_size=1, mode="file", max_steps=max_steps),
        sampling=SamplingConfig(max_new_tokens=4096),
    ).episodes


def sft_setup_config(
    setup: SFTSetup, trainer: Literal["ctxrl", "trl"], sizes: StepSizes, steps: int
) -> SFTConfig:
    """The ``SFTConfig`` one trainer runs ``setup`` with in :func:`_sft_speedup`: the configs' LoRA, sizes and
    attention; what only the ctxrl trainer has (step cuts, compiled layers, two-part attention) off for TRL."""
    from ctxrl.train.sft import SFTConfig

    ours = trainer == "ctxrl"
    return SFTConfig(
        trainer=trainer,
        lr=1e-3,
        max_steps=steps,
        max_seq_len=setup.max_seq_len,
        batch_tokens=setup.batch_tokens,
        steps_by=setup.steps_by if ours else "example",
        lora=configs_lora(),
        mixed_precision=sizes.mixed_precision,
        compile=sizes.compile and ours,
        two_part_attention=setup.two_part and ours,
    )


def _sft_speedup(
    sizes: StepSizes, tmp: Path, *, steps: int, setups: Sequence[str] = tuple(SFT_SETUPS)
) -> dict[str, float]:
    """The SFT path against TRL's ``SFTTrainer`` on the same demonstrations, in each of ``setups`` (keys of
    :data:`SFT_SETUPS`, a setup's ``trl_from`` before it; LoRA r = 16 without dropout, no gradient
    checkpointing, the SFT path's two-part attention, as configs/sft_smollm2*.yaml: :func:`sft_setup_config`):
    the scripted file manager's episodes of train tasks (:func:`scripted_demonstrations`); ``steps`` optimiser
    steps each, tokens per second of training."""
    from ctxrl.env.tokenizer import load_tokenizer_dir
    from ctxrl.train.models import get_model
    from ctxrl.train.sft import SFTResult, sft_examples, train_sft

    model_dir = get_model(sizes.model, tmp / "step-model" if sizes.model == "tiny" else None)
    tokenizer = load_tokenizer_dir(model_dir)
    most = max(SFT_SETUPS[suffix].tasks for suffix in setups)
    demos = scripted_demonstrations(
        model_dir, tokenizer, range(1, most + 1), sizes.difficulty, max_steps=sizes.max_steps
    )

    def train(suffix: str, trainer: Literal["ctxrl", "trl"]) -> SFTResult:
        setup = SFT_SETUPS[suffix]
        examples, _ = sft_examples(demos[: setup.tasks], max_seq_len=setup.max_seq_len, successful_only=False)
        config = sft_setup_config(setup, trainer, sizes, steps)
        return train_sft(config, model_dir, examples, tmp / f"sft{suffix}-{trainer}", progress=False)

    figures: dict[str, float] = {}
    trl_runs: dict[str, SFTResult] = {}
    for suffix in setups:
        setup = SFT_SETUPS[suffix]
        ours = train(suffix, "ctxrl")
        if setup.trl_from is None:
            trl = train(suffix, "trl")
        else:
            assert setup.trl_from in trl_runs, f"setup {suffix!r} needs {setup.trl_from!r} run before it"
            assert SFT_SETUPS[setup.trl_from].tasks == setup.tasks, "the same demonstrations"
            trl = trl_runs[setup.trl_from]
        trl_runs[suffix] = trl
        figures[f"sft_speedup{suffix}"] = ours.tokens_per_s / trl.tokens_per_s
        figures[f"sft_tokens_per_s{suffix}"] = ours.tokens_per_s
        figures[f"sft_trl_tokens_per_s{suffix}"] = trl.tokens_per_s
        # after each trainer's first step: the rate a long run settles at (compilation is in the first step)
        figures[f"sft_steady_speedup{suffix}"] = ours.steady_tokens_per_s / trl.steady_tokens_per_s
        figures[f"sft_first_step_s{suffix}"] = ours.first_step_s
        figures[f"sft_trl_first_step_s{suffix}"] = trl.first_step_s
    return figures


def bench_train(args: argparse.Namespace) -> dict[str, float]:
    """``ctxrl bench train``: the metrics of the module docstring."""
    import torch

    from ctxrl.env.tokenizer import load_tokenizer_dir
    from ctxrl.train.tiny_model import build_tiny_model

    quick = getattr(args, "quick", False)
    sizes = QUICK if quick else FULL
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory(prefix="ctxrl-bench-train-") as name:
            tmp = Path(name)
            model_dir = build_tiny_model(tmp / "model", seed=0)
            tokenizer = load_tokenizer_dir(model_dir)
            metrics = _packed_vs_naive(model_dir, tokenizer, sizes)
            metrics.update(_ctxrl_vs_trl(model_dir, tokenizer, sizes, tmp))
    finally:
        torch.set_num_threads(threads)  # the caller's setting (the test suite runs benches in-process)
    return metrics


def _smollm2(sizes: StepSizes, quick: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="ctxrl-bench-smollm2-") as name:
        tmp = Path(name)
        metrics = _smollm2_step(sizes, tmp)
        metrics.update(_sft_speedup(sizes, tmp, steps=2 if quick else 4))
    return metrics


def bench_smollm2(args: argparse.Namespace) -> dict[str, float]:
    """``ctxrl bench smollm2``: a real model's GRPO step in parts and the SFT path against TRL's (both
    cores, as the trainer runs; ``--quick``: the tiny model with the scripted file manager as its engine)."""
    quick = bool(getattr(args, "quick", False))
    return _smollm2(SMOL_QUICK if quick else SMOL, quick)


def bench_smollm2_bf16(args: argparse.Namespace) -> dict[str, float]:
    """``ctxrl bench smollm2_bf16``: the same work in bfloat16 — the engine's weights in bfloat16, the update
    and both SFT trainers under bfloat16 autocast on float32 weights (a CPU with AMX or AVX-512 BF16 runs
    bfloat16 matmuls several times faster; ``ctxrl bench precision`` measures it)."""
    quick = bool(getattr(args, "quick", False))
    return _smollm2(SMOL_BF16_QUICK if quick else SMOL_BF16, quick)


def bench_smollm2_bf16_compiled(args: argparse.Namespace) -> dict[str, float]:
    """``ctxrl bench smollm2_bf16_compiled``: ``smollm2_bf16`` with the trainer's decoder layers compiled
    (``train.compile`` / ``sft.compile``); the legacy update and TRL stay as they are set up today."""
    quick = bool(getattr(args, "quick", False))
    return _smollm2(SMOL_BF16_COMPILED_QUICK if quick else SMOL_BF16_COMPILED, quick)
