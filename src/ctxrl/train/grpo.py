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

import contextlib
import copy
import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctxrl.env.config import HarnessConfig
from ctxrl.env.tasks.base import Task
from ctxrl.env.tasks.registry import FAMILIES, make_task
from ctxrl.env.tasks.splits import split_seeds
from ctxrl.errors import ConfigError, UsageError
from ctxrl.rewards.advantages import AdvantageConfig
from ctxrl.rewards.cost import ModelGeometry
from ctxrl.train.config import TrainConfig
from ctxrl.train.credit import EpisodeCredit, assign_credit
from ctxrl.train.engines.base import Engine, SamplingConfig
from ctxrl.train.keep import load_kept_adapter
from ctxrl.train.logprobs import packing_supported
from ctxrl.train.loss import LossStats, token_mean_scale
from ctxrl.train.rollout import RolloutConfig, rollout
from ctxrl.train.rows import LayoutUnit, Row, episode_rows, layout_kind, row_stats
from ctxrl.train.tracking import NoTracker, Tracker, make_tracker
from ctxrl.train.trajectory import EpisodeRecord
from ctxrl.train.update import backward_layout, empty_unit, layout_logprobs, layout_sizes, make_layout

CHECKPOINTS = "checkpoints"
LATEST = "latest"
METRICS = "metrics.jsonl"
RANKS = "ranks"


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
        families = self.families or tuple(FAMILIES)
        seeds = split_seeds(self.split)
        first = k * self.count
        return [
            make_task(
                families[j % len(families)],
                seeds[(j // len(families)) % len(seeds)],
                self.difficulty,
            )
            for j in range(first, first + self.count)
        ]


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


def make_accelerator() -> Any:
    """The accelerate ``Accelerator`` of this process (CPU where no CUDA device exists).

    Without CUDA, ``accelerate launch --multi_gpu`` (or ``torchrun``) ranks become gloo processes on the CPU.
    DeepSpeed on the CPU needs two things accelerate does not do by itself: ``cpu=True`` would switch
    DeepSpeed off, and without a device accelerate finds no process-group backend (every rank would then
    believe it is rank 0 of 1), so the backend is named: gloo.
    """
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    if torch.cuda.is_available():
        return Accelerator()
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        return Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
    return Accelerator(cpu=True)


def _configure_deepspeed(acc: Any, config: TrainConfig) -> None:
    """Under DeepSpeed: one microbatch per forward (the trainer batches by token budget itself, with no
    dataloader for accelerate to read a batch size from) and the trainer's ``max_grad_norm`` as DeepSpeed's
    clipping, since DeepSpeed clips inside its own step."""
    plugin = getattr(acc.state, "deepspeed_plugin", None)
    if plugin is None:
        return
    ds = plugin.deepspeed_config
    if ds.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        ds["train_micro_batch_size_per_gpu"] = 1
    ds["gradient_accumulation_steps"] = 1
    ds["gradient_clipping"] = config.max_grad_norm or 0.0


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
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=config.lr, weight_decay=config.weight_decay
    )
    _configure_deepspeed(acc, config)
    model, optimizer = acc.prepare(model, optimizer)
    policy = acc.unwrap_model(model)
    # auto: each update takes the cheapest layout its rows allow (shared prefixes, packed lines, padding)
    packs = config.packing == "packed" or (config.packing in ("auto", "shared") and packing_supported(policy))
    shared_ok = world == 1  # a shared prefix backs up twice per unit, which DDP's reducer refuses
    sizes = layout_sizes(policy)
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    state = load_checkpoint(out, policy, optimizer, rank) if resume else {}
    start, graded = int(state.get("step", 0)), bool(state.get("graded", config.reward.graded))
    if start > 0:
        engine.update_weights(policy)  # the engine was built on the initial weights
    geometry = _geometry(policy)
    credit_config, loss_config = config.credit_config(advantages), config.loss
    history: list[dict[str, float]] = []
    metrics_path = out / METRICS
    tracker: Tracker = NoTracker()
    rank_path = out / RANKS / f"rank-{rank}.jsonl"
    rank_path.parent.mkdir(exist_ok=True)
    _truncate_metrics(rank_path, start)
    if acc.is_main_process:
        _truncate_metrics(metrics_path, start)  # a killed run may have logged steps past its checkpoint
        tracker = make_tracker(config.tracker, out, project=config.wandb_project, config=run_config)
    bar = _progress(config.steps, start, enabled=acc.is_main_process)

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
            geometry=geometry,
            harness=harness,
            sampling=sampling,
        )
        episodes = result.episodes
        rollout_s = time.perf_counter() - t0

        # ---- 2. credit: shaped rewards -> per-token advantages; drop groups without signal --------------
        credit = assign_credit(episodes, replace(credit_config, reward=replace(config.reward, graded=graded)))
        graded_now = graded
        if graded and config.graded_until is not None:  # the warm-up ends for good once groups have successes
            solved = torch.tensor(_groups_with_success(episodes), dtype=torch.float64, device=acc.device)
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
        t1 = time.perf_counter()
        parts = _split_by_episode(rows, config.updates_per_rollout)
        layouts = [
            make_layout(
                part,
                config.packing,
                config.max_tokens_per_microbatch,
                pad_id,
                sizes,
                packs=packs,
                shared_ok=shared_ok,
            )
            for part in parts
        ]
        olds = (
            [layout_logprobs(model, units, acc.device) for units in layouts]
            if config.updates_per_rollout > 1
            else None
        )
        stats, entropy_sum, grad_norms = LossStats(), 0.0, []
        for u, units in enumerate(layouts):
            n_tokens = float(
                acc.reduce(
                    torch.tensor(
                        sum(u.num_loss_tokens for u in units), dtype=torch.float64, device=acc.device
                    ),
                    "sum",
                ).item()
            )
            if n_tokens == 0:
                continue  # every rank sees the same global count, so every rank skips together
            # every rank runs the same number of backward passes (DDP syncs on the last one)
            n_units = int(acc.reduce(torch.tensor(len(units), device=acc.device), "max").item())
            units = [*units, *[empty_unit(pad_id)] * (n_units - len(units))]
            result_u = backward_layout(
                model,
                units,
                loss_config,
                num_loss_tokens=n_tokens,
                device=acc.device,
                scale=token_mean_scale(world),
                old_logprobs=None if olds is None else olds[u],
                reference=(lambda unit: _reference_logprobs(policy, reference, unit, acc.device))
                if config.loss.kl_coef > 0
                else None,
                backward=acc.backward,
                sync=lambda last: _sync_context(acc, model, last),
            )
            stats += result_u.stats
            entropy_sum += result_u.entropy_sum
            if config.max_grad_norm is not None:
                norm = acc.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                if norm is not None:  # None under DeepSpeed before its first step
                    grad_norms.append(float(norm))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        train_s = time.perf_counter() - t1

        # ---- 5. sync: the engine samples the next step with the new weights ------------------------------
        t2 = time.perf_counter()
        engine.update_weights(policy)
        sync_s = time.perf_counter() - t2

        # ---- 6. log -------------------------------------------------------------------------------------
        metrics = {"step": float(step + 1), "train/graded": float(graded_now)}
        metrics.update(_episode_metrics(acc, episodes, credit, rows))
        metrics.update(
            LossStats.from_tensor(acc.reduce(stats.as_tensor().to(acc.device), "sum").cpu()).metrics()
        )
        loss_tokens = metrics["loss/tokens"] or 1.0
        metrics["loss/entropy"] = (
            float(acc.reduce(torch.tensor(entropy_sum, dtype=torch.float64, device=acc.device), "sum").item())
            / loss_tokens
        )
        metrics["loss/grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
        metrics.update(result.stats.metrics())
        metrics.update(
            {
                "time/rollout_s": rollout_s,
                "time/train_s": train_s,
                "time/sync_s": sync_s,
                "time/step_s": time.perf_counter() - t0,
                "cost/packed": float(
                    np.mean(
                        [float(mb.kind == "packed") for us in layouts for u in us for mb in u.all_batches()]
                        or [0.0]
                    )
                ),
                "cost/shared_prefix": float(
                    np.mean([float(layout_kind(us) == "shared") for us in layouts] or [0.0])
                ),
                "cost/layout_tokens": float(sum(u.num_tokens for us in layouts for u in us)),
            }
        )
        history.append(metrics)
        if acc.is_main_process:
            with metrics_path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(metrics) + "\n")
            tracker.log(metrics, step=step + 1)
            bar.update(1)
            if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
                bar.write(_summary(metrics))

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


# ---- the pieces the loop calls ----------------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def load_policy(model_dir: str | Path, config: TrainConfig) -> Any:
    """The model in ``model_dir``, in ``config.dtype``; wrapped in a peft LoRA adapter when ``lora.enabled``."""
    from transformers import AutoModelForCausalLM

    from ctxrl.errors import ModelLoadError
    from ctxrl.train.engines.model_dir import check_causal_lm_dir

    path = check_causal_lm_dir(model_dir)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, config.dtype))
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"transformers could not load the model in {path}: {exc}") from None
    if not config.lora.enabled:
        return model
    from peft import LoraConfig, get_peft_model

    lora = config.lora
    return get_peft_model(
        model,
        LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules),
            task_type="CAUSAL_LM",
        ),
    )


def _geometry(model: Any) -> ModelGeometry | None:
    try:
        return ModelGeometry.from_config(model.config)
    except ConfigError:
        return None  # e.g. mixture-of-experts: cost in tokens only


def _progress(total: int, initial: int, *, enabled: bool) -> Any:
    """A progress bar over optimiser steps (silent on every rank but the main one)."""
    from tqdm import tqdm

    return tqdm(
        total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True, disable=not enabled
    )


def _truncate_metrics(path: Path, done: int) -> None:
    """Keep only the lines of steps ``<= done`` (the checkpoint a resumed run starts from)."""
    if not path.exists():
        return
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    kept = [line for line in lines if json.loads(line)["step"] <= done]
    if len(kept) != len(lines):
        path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


def _split_by_episode(rows: Sequence[Row], parts: int) -> list[list[Row]]:
    """``rows`` in ``parts`` groups of whole episodes (round-robin by episode), so each update sees whole
    episodes."""
    if parts == 1:
        return [list(rows)]
    episodes = sorted({r.episode for r in rows})
    where = {e: i % parts for i, e in enumerate(episodes)}
    out: list[list[Row]] = [[] for _ in range(parts)]
    for r in rows:
        out[where[r.episode]].append(r)
    return out


def _sync_context(acc: Any, model: Any, last: bool) -> Any:
    """DDP all-reduces on the last backward of an update only; DeepSpeed steps its engine at the boundary."""
    acc.sync_gradients = last
    return contextlib.nullcontext() if last else acc.no_sync(model)


def _reference_logprobs(policy: Any, reference: Any, unit: LayoutUnit, device: Any) -> list[torch.Tensor]:
    """Logprobs under the reference: the frozen initial model, or with LoRA the base with the adapter off."""
    if reference is not None:
        return layout_logprobs(reference, [unit], device)[0]
    with policy.disable_adapter():
        return layout_logprobs(policy, [unit], device)[0]


def _episode_metrics(
    acc: Any, episodes: Sequence[EpisodeRecord], credit: Sequence[EpisodeCredit], rows: Sequence[Row]
) -> dict[str, float]:
    """Rollout, reward and cost metrics summed over ranks, then divided."""
    groups = {ep.group: c.dropped for ep, c in zip(episodes, credit)}
    rs = row_stats(rows, [ep for ep, c in zip(episodes, credit) if not c.dropped])
    sums = torch.tensor(
        [
            len(episodes),
            sum(ep.success for ep in episodes),
            sum(c.reward for c in credit),
            sum(ep.score for ep in episodes),
            sum(ep.cost_tokens for ep in episodes),
            sum(ep.cost_tokens for ep in episodes if ep.success),
            sum(len(ep.steps) for ep in episodes),
            sum(1 for ep in episodes for s in ep.steps if s.edit_calls),
            sum(1 for ep in episodes for s in ep.steps if s.edited),
            len(groups),
            sum(groups.values()),
            rs.rows,
            rs.tokens,
            rs.naive_tokens,
            sum(not c.dropped for c in credit),
        ],
        dtype=torch.float64,
        device=acc.device,
    )
    (
        n,
        wins,
        reward,
        score,
        cost,
        win_cost,
        steps,
        edits,
        rebuilt,
        n_groups,
        dropped,
        n_rows,
        tokens,
        naive,
        trained,
    ) = acc.reduce(sums, "sum").tolist()
    n = n or 1.0
    return {
        "reward/success": wins / n,
        "reward/mean": reward / n,
        "reward/score": score / n,
        "reward/dropped_groups": dropped / (n_groups or 1.0),
        "rollout/episodes": n,
        "rollout/steps_per_episode": steps / n,
        "rollout/edits_per_episode": edits / n,
        "rollout/edited_steps_per_episode": rebuilt / n,
        "cost/tokens_per_episode": cost / n,
        "cost/tokens_per_success": win_cost / wins if wins else 0.0,
        "cost/rows_per_episode": n_rows / (trained or 1.0),
        "cost/row_tokens": tokens,
        "cost/naive_tokens": naive,
        "cost/packed_vs_naive_tokens": tokens / naive if naive else 0.0,
    }


def _summary(m: dict[str, float]) -> str:
    return (
        f"step {int(m['step'])}: success {m['reward/success']:.2f} reward {m['reward/mean']:+.3f} "
        f"loss {m['loss/loss']:+.4f} kl {m['loss/kl']:.4f} clip {m['loss/clip_frac']:.3f} "
        f"tokens/ep {m['cost/tokens_per_episode']:.0f} rows/ep {m['cost/rows_per_episode']:.1f} "
        f"{m['time/step_s']:.1f}s"
    )


# ---- checkpoints ------------------------------------------------------------------------------------------


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_sha256(policy: Any) -> str:
    """SHA-256 over the names, dtypes, shapes and bytes of the trainable parameters (in parameter order): equal
    on two ranks exactly when their trainable weights are bit-for-bit equal."""
    digest = hashlib.sha256()
    for name, p in policy.named_parameters():
        if p.requires_grad:
            t = p.detach().cpu().contiguous()
            digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _trainable_state(policy: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu().clone() for n, p in policy.named_parameters() if p.requires_grad}


def save_checkpoint(
    out: Path,
    step: int,
    policy: Any,
    optimizer: Any,
    acc: Any,
    config: TrainConfig,
    *,
    graded: bool | None = None,
) -> Path:
    """Write ``out/checkpoints/step-NNNNNN`` atomically (temporary folder, then rename) and point ``latest``
    at it. Holds ``model/`` (``save_pretrained``: the full model, or the adapter with LoRA), the trainable
    tensors and optimiser state for exact resume, every rank's RNG states, the step, whether the next step's
    task reward is graded (:attr:`TrainConfig.graded_until`) and the run config."""
    root = out / CHECKPOINTS
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.tmp"
    if acc.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        policy.save_pretrained(tmp / "model")
        torch.save(_trainable_state(policy), tmp / "trainable.pt")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "state.json").write_text(
            json.dumps(
                {
                    "step": step,
                    "graded": config.reward.graded if graded is None else graded,
                    "config": asdict(config),
                },
                indent=1,
                default=str,
            )
        )
    acc.wait_for_everyone()
    torch.save(_rng_state(), tmp / f"rng-{acc.process_index}.pt")
    acc.wait_for_everyone()
    if acc.is_main_process:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        pointer = root / f".{LATEST}.tmp"
        pointer.write_text(final.name)
        os.replace(pointer, root / LATEST)
    acc.wait_for_everyone()
    return final


def _groups_with_success(episodes: Sequence[EpisodeRecord]) -> tuple[int, int]:
    """``(groups holding a success, groups)`` of a step's episodes."""
    groups: dict[int, bool] = {}
    for ep in episodes:
        groups[ep.group] = groups.get(ep.group, False) or ep.success
    return sum(groups.values()), len(groups)


def load_checkpoint(out: Path, policy: Any, optimizer: Any, rank: int) -> dict[str, Any]:
    """Restore the latest checkpoint under ``out`` into ``policy`` and ``optimizer`` and this rank's RNG (a
    kept checkpoint, :mod:`ctxrl.train.keep`: the adapter from ``model/``, fresh AdamW moments); returns its
    ``state.json`` (``step``: the steps already done; ``graded``: whether the next step's task
    reward is graded). Raises :class:`UsageError` when there is none."""
    root = out / CHECKPOINTS
    if not (root / LATEST).exists():
        raise UsageError(f"nothing to resume: {root / LATEST} does not exist (start without resume)")
    ckpt = root / (root / LATEST).read_text().strip()
    if (ckpt / "trainable.pt").is_file():
        trainable = torch.load(ckpt / "trainable.pt", weights_only=True)
        params = dict(policy.named_parameters())
        missing = [n for n in trainable if n not in params]
        if missing:
            raise UsageError(
                f"{ckpt} does not match the model (no parameter {missing[0]}); same model and lora?"
            )
        with torch.no_grad():
            for name, tensor in trainable.items():
                params[name].copy_(tensor)
    else:  # a kept checkpoint (ctxrl.train.keep): the adapter alone, in bf16
        load_kept_adapter(policy, ckpt / "model")
    if (ckpt / "optimizer.pt").is_file():
        optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=False))
    elif rank == 0:
        print(f"resuming {ckpt} without optimizer.pt (a kept run): AdamW's moments start at zero", flush=True)
    rng = ckpt / f"rng-{rank}.pt"
    if rng.exists():
        _set_rng_state(torch.load(rng, weights_only=False))
    state: dict[str, Any] = json.loads((ckpt / "state.json").read_text())
    return state
