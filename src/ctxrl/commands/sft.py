"""``ctxrl sft``: supervised warm start on demonstrations, loss on the generated tokens only.

    ctxrl rollout --config configs/demonstrations.yaml --out runs/demos          # record demonstrations
    ctxrl sft --config configs/sft_tiny.yaml --demos runs/demos/trajectories.jsonl --out runs/sft
    ctxrl sft --config configs/sft_tiny.yaml --out runs/sft sft.lora.enabled=true  # records into runs/sft/demos
    ctxrl eval engine.name=hf --model runs/sft/model eval.modes=[file] eval.families=[retention]

Without ``--demos`` the run config's scripted policy (``engine.name=scripted``, ``engine.policy=...``) first
records demonstrations on ``tasks``/``rollout`` into ``<out>/demos`` (as ``ctxrl rollout`` does). The base
model is ``model`` (a folder or registry name), or the tiny model built into ``<out>/base_model``. Writes
``<out>/model`` (a plain Hugging Face folder: merged weights + tokenizer), ``<out>/metrics.jsonl`` (the
trainer's log), ``<out>/summary.json`` and ``<out>/config.yaml``. A malformed demonstrations file is a
one-line error naming the file and line, before any training.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ctxrl.commands.common import (
    ensure_tiny_model,
    model_dir,
    prepare_out,
    run_config,
    save_config,
    write_text,
)
from ctxrl.commands.config import RunConfig
from ctxrl.errors import UsageError
from ctxrl.train.engines import engine_spec
from ctxrl.train.trajectory import EpisodeRecord


def run_sft(args: argparse.Namespace) -> int:
    """Entry point of ``ctxrl sft`` (see the module docstring)."""
    config = run_config(args)
    sft_command(config, args.out, demos=args.demos, overwrite=args.overwrite)
    return 0


def base_model_dir(config: RunConfig, out: Path) -> Path:
    """The model SFT starts from: ``config.model`` checked for a causal LM, or the tiny model (seed
    ``engine.seed``) built into ``<out>/base_model``."""
    from ctxrl.train.engines.model_dir import check_causal_lm_dir

    if config.model is None:
        return ensure_tiny_model(out / "base_model", seed=config.engine.seed)
    return check_causal_lm_dir(model_dir(config, out))


def check_recorder(config: RunConfig) -> None:
    """Refuse to record demonstrations with anything but a scripted reference policy."""
    from ctxrl.env.policies import POLICY_MODES

    engine = config.engine
    if not engine_spec(engine.name).needs_policy or engine.policy not in POLICY_MODES:
        raise UsageError(
            f"no --demos given, and engine.name={engine.name} engine.policy={engine.policy} is not a scripted "
            f"reference policy to record them with; pass --demos FILE or set engine.name=scripted "
            f"engine.policy=<{'|'.join(POLICY_MODES)}>"
        )


def record_demonstrations(config: RunConfig, base: Path, out: Path) -> Path:
    """Record demonstrations with the config's scripted policy, tokenised by ``base``'s tokenizer, into
    ``out``; returns the trajectory file."""
    from ctxrl.commands.rollout import rollout_command

    check_recorder(config)
    rollout_command(replace(config, model=str(base)), out)
    return out / "trajectories.jsonl"


def sft_command(
    config: RunConfig, out: Path, *, demos: Path | Sequence[Path] | None = None, overwrite: bool = False
) -> dict[str, Any]:
    """Run the SFT warm start ``config`` describes into the run folder ``out``; return its summary."""
    from ctxrl.train.sft import load_demonstrations, sft_examples, train_sft

    sft = config.sft
    files = [demos] if isinstance(demos, Path) else list(demos or [])
    episodes = [ep for f in files for ep in load_demonstrations(f)]  # a bad file fails before out is touched
    if not files:
        check_recorder(config)
    out = prepare_out(out, overwrite=overwrite, inputs=[*files, config.model])
    save_config(config, out)
    base = base_model_dir(config, out)
    if not files:
        files = [record_demonstrations(config, base, out / "demos")]
        episodes = load_demonstrations(files[0])
    trained_on, heldout_episodes = split_heldout(episodes, sft.heldout_episodes)
    examples, stats = sft_examples(
        trained_on,
        max_seq_len=sft.max_seq_len,
        successful_only=sft.successful_only,
        decision_copies=sft.decision_copies,
    )
    heldout, _ = sft_examples(
        heldout_episodes, max_seq_len=sft.max_seq_len, successful_only=sft.successful_only
    )
    print(
        f"demonstrations {', '.join(map(str, files))}: {stats.episodes} episodes used ({stats.skipped_episodes} "
        f"failed, left out; {len(heldout_episodes)} held out), {stats.examples} sequences "
        f"({stats.decision_examples} decision copies), {stats.tokens} tokens, {stats.loss_tokens} loss tokens "
        f"({stats.truncated_loss_tokens} cut off by sft.max_seq_len={sft.max_seq_len})"
    )
    result = train_sft(sft, base, examples, out, heldout=heldout)
    if config.model is not None and (out / "adapter").is_dir():
        name_adapter_base(out / "adapter", config.model)
    shutil.rmtree(out / "trainer", ignore_errors=True)  # the trainer's scratch folder; nothing is kept there
    write_text(out / "metrics.jsonl", "".join(json.dumps(entry) + "\n" for entry in result.log))
    summary = {
        "demos": str(files[0]) if len(files) == 1 else [str(f) for f in files],
        "heldout_episodes": len(heldout_episodes),
        "base_model": config.model if config.model is not None else str(base),  # as given: no machine's path
        **stats.to_dict(),
        **result.to_dict(),
        "lora": sft.lora.enabled,
    }
    write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    _print_summary(summary)
    return summary


def name_adapter_base(adapter: Path, model: str) -> None:
    """Record ``model`` as it was given (a registry name or the path passed) as the adapter's base, not the
    resolved folder: a committed adapter must not carry a path of the machine that trained it."""
    path = adapter / "adapter_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = model
    write_text(path, json.dumps(config, indent=2) + "\n")


def split_heldout(episodes: list[EpisodeRecord], n: int) -> tuple[list[EpisodeRecord], list[EpisodeRecord]]:
    """``(trained on, held out)``: the last ``n`` demonstrations are held out (:attr:`SFTConfig.heldout_episodes`);
    a UsageError when that leaves nothing to train on."""
    if n == 0:
        return episodes, []
    if n >= len(episodes):
        raise UsageError(
            f"sft.heldout_episodes={n} holds out every one of the {len(episodes)} demonstrations; lower it or "
            "record more (tasks.count)"
        )
    return episodes[:-n], episodes[-n:]


def _print_summary(s: dict[str, Any]) -> None:
    layout = f"{s['trainer']} trainer, {s['layout']} layout"
    kind = "LoRA (merged)" if s["lora"] else "full fine-tuning"
    print(f"sft ({kind}, {layout}) from {s['base_model']}")
    print(
        f"  steps             {s['steps']}  ({s['trained_tokens']} tokens, {s['tokens_per_s']:.0f} tokens/s)"
    )
    print(
        f"  wall              {s['wall_s']:.1f} s of training  (first step {s['first_step_s']:.1f} s, then "
        f"{s['steady_tokens_per_s']:.0f} tokens/s)"
    )
    print(f"  demo loss         {s['loss_before']:.4f} -> {s['loss_after']:.4f}  (token mean on loss tokens)")
    if s["heldout_loss_before"] is not None:
        print(
            f"  held-out loss     {s['heldout_loss_before']:.4f} -> {s['heldout_loss_after']:.4f}  "
            f"({s['heldout_episodes']} demonstrations never trained on)"
        )
    print(f"  model             {s['model_dir']}")
