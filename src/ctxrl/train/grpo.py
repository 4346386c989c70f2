"""Stepwise GRPO, top to bottom: rollout → credit → rows → packed microbatches → loss → update → sync → log.

    ctxrl train --config configs/train_tiny.yaml --out runs/train          # the command builds the pieces
    train(run.train, model_dir=folder, engine=engine, tokenizer=tokenizer,
          tasks=TaskBatches(("retention",), "train", "easy", count=4), rollout_config=run.rollout,
          advantages=run.advantages, harness=run.harness, sampling=run.sampling, out=Path("runs/t"))

Each argument is one section of the run config (:mod:`ctxrl.commands.config`) or something the command built
from it (the engine, the tokenizer, the model folder); this module owns only the ``train`` section
(:class:`ctxrl.train.config.TrainConfig`).

Under ``accelerate launch`` every rank runs this same loop on its own tasks (batch ``step·W + r`` of
:class:`TaskBatches` for rank r of W) with its own engine; DDP (or DeepSpeed) averages the gradients, and the
loss is scaled so the average is the token mean over every rank's loss tokens. Only the main rank writes
metrics and checkpoints; every rank appends its own line per step to ``<out>/ranks/rank-<r>.jsonl`` (its
process id, the task ids it rolled out and, at each checkpoint, the SHA-256 of its trainable weights), so a
run shows which rank trained on what and that the ranks' weights agree.

One step:

1. **Rollout.** ``rollout(engine, tokenizer, tasks, rollout_config, ...)``: G episodes per task, token in / out.
2. **Credit.** :func:`ctxrl.train.credit.assign_credit`: shaped rewards, the task channel on every action token
   and the efficiency channel on edit tokens; groups without signal are dropped (``drop_zero_variance``).
3. **Rows.** :func:`ctxrl.train.rows.episode_rows`: append-only stretches share a row; an edit starts one.
4. **Update.** Rows packed (or padded) into microbatches of at most ``max_tokens_per_microbatch`` tokens; one
   forward and backward per microbatch, gradients accumulated, then one clipped optimiser step (or
   ``updates_per_rollout`` steps over disjoint parts of the episodes).
5. **Sync.** The new weights go to the engine (``engine.update_weights``; a LoRA adapter is merged on the fly).
6. **Log.** Namespaced metrics (``rollout/``, ``reward/``, ``loss/``, ``cost/``, ``time/``) to
   ``<out>/metrics.jsonl`` and the tracker, a progress bar, and one line every ``log_every`` steps.
7. **Checkpoint.** Every ``save_every`` steps: the trainable weights, the optimiser, every rank's RNG states and
   the step, written to a temporary folder and renamed into place.

Exact resume: the model, optimiser and RNG states come back, and the tasks of a step are a function of the step.
The engine's own sampling state is not part of the engine protocol, so a resumed run samples again from the
engine's seed: its rollouts repeat a killed run's only with a deterministic engine.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ctxrl.env.config import HarnessConfig
from ctxrl.env.tasks.base import Task
from ctxrl.env.tasks.registry import BuiltinTaskSource
from ctxrl.errors import ConfigError, UsageError
from ctxrl.rewards.advantages import AdvantageConfig
from ctxrl.train.checkpoint import load_checkpoint, save_checkpoint, seed_everything, trainable_sha256
from ctxrl.train.compile import compile_layers
from ctxrl.train.config import TrainConfig
from ctxrl.train.credit import assign_credit
from ctxrl.train.distributed import configure_deepspeed, make_accelerator
from ctxrl.train.engines.base import Engine, SamplingConfig
from ctxrl.train.policy import geometry, load_policy, reference_logprobs
from ctxrl.train.rollout import RolloutConfig, rollout
from ctxrl.train.rows import episode_rows
from ctxrl.train.run_folder import CHECKPOINTS, METRICS, RANKS, truncate_metrics
from ctxrl.train.step_metrics import groups_with_success, progress_bar, step_metrics, summary_line
from ctxrl.train.tracking import NoTracker, Tracker, make_tracker
from ctxrl.train.update import grpo_update, layout_sizes, packs_lines


@dataclass(frozen=True)
class TaskBatches:
    """The built-in tasks of every step: batch ``k`` is the k-th run of ``count`` tasks of ``split``.

    Tasks are taken as :class:`ctxrl.env.tasks.registry.BuiltinTaskSource` yields them (per seed, one task per
    family, round-robin), wrapping around the split; rank r of W at step s takes batch ``s·W + r``, so ranks
    and steps never share a task until the split is used up.
    """

    families: tuple[str, ...]
    """Families (empty: all of them)."""
    split: str
    difficulty: str
    count: int
    """Tasks per batch (per step and rank)."""

    def __call__(self, k: int) -> list[Task]:
        source = BuiltinTaskSource(self.families or None, self.difficulty)
        return source.window(self.split, k * self.count, self.count, wrap=True)


@dataclass
class TrainResult:
    """What a run did: the steps it ran (this call), every step's metrics, and where it wrote."""

    first_step: int
    last_step: int
    metrics: list[dict[str, float]]
    output_dir: Path


def check_setup(config: TrainConfig, rollout_config: RolloutConfig, tasks_per_step: int) -> None:
    """The checks across sections: a GRPO group needs two episodes, and every update needs an episode."""
    if rollout_config.group_size < 2:
        raise ConfigError(
            f"rollout.group_size is {rollout_config.group_size}: GRPO needs >= 2 episodes per task for a "
            "baseline; set rollout.group_size=4"
        )
    episodes = tasks_per_step * rollout_config.group_size
    if config.updates_per_rollout > episodes:
        raise ConfigError(
            f"train.updates_per_rollout={config.updates_per_rollout} exceeds the {episodes} episodes of a "
            f"rollout (tasks.count x rollout.group_size); lower it or raise tasks.count"
        )


def train(
    config: TrainConfig,
    *,
    model_dir: str | Path,
    engine: Engine,
    tokenizer: Any,
    tasks: TaskBatches,
    rollout_config: RolloutConfig,
    advantages: AdvantageConfig,
    out: str | Path,
    harness: HarnessConfig | None = None,
    sampling: SamplingConfig | None = None,
    resume: bool = False,
    accelerator: Any = None,
    run_config: Mapping[str, Any] | None = None,
) -> TrainResult:
    """Run GRPO for ``config.steps`` steps into the run folder ``out`` (from its latest checkpoint with
    ``resume``).

    The policy is loaded from ``model_dir``; ``engine`` (built on the same weights) rolls out
    and receives the weights after every update; the caller closes it. ``tokenizer`` is the policy's.
    ``run_config`` (plain data) goes to the tracker. Raises :class:`ConfigError` on settings that do not fit
    together and :class:`UsageError` on a folder that holds checkpoints without ``resume`` (or none with it).
    """
    check_setup(config, rollout_config, tasks.count)
    acc = accelerator or make_accelerator()
    rank, world = acc.process_index, acc.num_processes
    out = Path(out)
    if not resume and acc.is_main_process and (out / CHECKPOINTS).exists():
        raise UsageError(
            f"{out} already holds checkpoints; resume the run (--resume) or choose another --out"
        )
    if resume and getattr(acc.state, "deepspeed_plugin", None) is not None:
        raise UsageError(
            "--resume is not supported under DeepSpeed (a checkpoint holds only the main rank's optimiser "
            "shard); runs that must resume exactly train under the ddp accelerate config"
        )
    out.mkdir(parents=True, exist_ok=True)
    seed_everything(config.seed + rank)

    # ---- model, reference, optimiser -------------------------------------------------------------------
    model = load_policy(model_dir, config)
    reference = None
    if config.loss.kl_coef > 0 and not config.lora.enabled:
        reference = copy.deepcopy(model).eval().requires_grad_(False).to(acc.device)
    if config.compile:
        compile_layers(model)  # after the reference's copy: the reference stays eager
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=config.lr, weight_decay=config.weight_decay
    )
    configure_deepspeed(acc, config)
    model, optimizer = acc.prepare(model, optimizer)
    policy = acc.unwrap_model(model)
    # auto: each update takes the cheapest layout its rows allow (shared prefixes, packed lines, padding)
    packs = packs_lines(config, policy)
    shared_ok = world == 1  # a shared prefix backs up twice per unit, which DDP's reducer refuses
    sizes = layout_sizes(policy)
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    state = load_checkpoint(out, policy, optimizer, rank) if resume else {}
    start, graded = int(state.get("step", 0)), bool(state.get("graded", config.reward.graded))
    if start > 0:
        engine.update_weights(policy)  # the engine was built on the initial weights
    cost_geometry = geometry(policy)
    credit_config = config.credit_config(advantages)
    history: list[dict[str, float]] = []
    metrics_path = out / METRICS
    tracker: Tracker = NoTracker()
    rank_path = out / RANKS / f"rank-{rank}.jsonl"
    rank_path.parent.mkdir(exist_ok=True)
    truncate_metrics(rank_path, start)
    if acc.is_main_process:
        truncate_metrics(metrics_path, start)  # a killed run may have logged steps past its checkpoint
        tracker = make_tracker(config.tracker, out, project=config.wandb_project, config=run_config)
    bar = progress_bar(config.steps, start, enabled=acc.is_main_process)

    for step in range(start, config.steps):
        t0 = time.perf_counter()
        # ---- 1. rollout: this rank's tasks, G episodes each -------------------------------------------
        model.eval()
        batch = tasks(step * world + rank)
        result = rollout(
            engine,
            tokenizer,
            batch,
            rollout_config,
            geometry=cost_geometry,
            harness=harness,
            sampling=sampling,
        )
        episodes = result.episodes
        rollout_s = time.perf_counter() - t0

        # ---- 2. credit: shaped rewards -> per-token advantages; drop groups without signal --------------
        credit = assign_credit(episodes, replace(credit_config, reward=replace(config.reward, graded=graded)))
        graded_now = graded
        if graded and config.graded_until is not None:  # the warm-up ends for good once groups have successes
            solved = torch.tensor(groups_with_success(episodes), dtype=torch.float64, device=acc.device)
            solved = acc.reduce(solved, "sum")
            graded = bool(solved[0] < config.graded_until * solved[1])

        # ---- 3. rows: append-only stretches share a row, edits start one ---------------------------------
        rows = [
            row
            for i, (ep, c) in enumerate(zip(episodes, credit))
            if not c.dropped
            for row in episode_rows(ep, c.steps, episode_index=i)
        ]

        # ---- 4. update: packed microbatches, token-mean loss, clipped optimiser step(s) ------------------
        model.train()
        lr = config.lr_at(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        t1 = time.perf_counter()
        update = grpo_update(
            acc,
            model,
            optimizer,
            rows,
            config,
            pad_id=pad_id,
            sizes=sizes,
            packs=packs,
            shared_ok=shared_ok,
            reference=(
                lambda unit: reference_logprobs(
                    policy, reference, unit, acc.device, two_part=config.two_part_attention
                )
            )
            if config.loss.kl_coef > 0
            else None,
        )
        train_s = time.perf_counter() - t1

        # ---- 5. sync: the engine samples the next step with the new weights ------------------------------
        t2 = time.perf_counter()
        engine.update_weights(policy)
        sync_s = time.perf_counter() - t2

        # ---- 6. log -------------------------------------------------------------------------------------
        times = {"rollout": rollout_s, "train": train_s, "sync": sync_s, "step": time.perf_counter() - t0}
        metrics = step_metrics(acc, step + 1, graded_now, episodes, credit, rows, update, result.stats, times)
        metrics["train/lr"] = lr
        history.append(metrics)
        if acc.is_main_process:
            with metrics_path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(metrics) + "\n")
            tracker.log(metrics, step=step + 1)
            bar.update(1)
            if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
                bar.write(summary_line(metrics))

        # ---- 7. checkpoint, and this rank's own record ---------------------------------------------------
        record: dict[str, Any] = {
            "step": step + 1,
            "rank": rank,
            "world": world,
            "pid": os.getpid(),
            "tasks": [t.task_id for t in batch],
        }
        if step + 1 == config.steps or (config.save_every and (step + 1) % config.save_every == 0):
            save_checkpoint(out, step + 1, policy, optimizer, acc, config, graded=graded)
            record["params_sha256"] = trainable_sha256(policy)
        with rank_path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    bar.close()
    tracker.finish()
    return TrainResult(first_step=start, last_step=config.steps, metrics=history, output_dir=out)
