"""The ``ctxrl`` command.

    ctxrl --help
    ctxrl tiny-model --out runs/tiny
    ctxrl quickstart
    ctxrl rollout --config configs/rollout.yaml [KEY=VALUE ...] --out runs/r1
    ctxrl eval --config configs/eval_scripted.yaml [KEY=VALUE ...] --out runs/eval
    ctxrl train --config configs/train_tiny.yaml [KEY=VALUE ...] --out runs/train [--overwrite] [--resume]
    ctxrl sft --config configs/sft_tiny.yaml [KEY=VALUE ...] --demos runs/demos/trajectories.jsonl --out runs/sft
    ctxrl bench NAME [--json FILE]
    ctxrl evolve --config configs/evolve_tiny.yaml [KEY=VALUE ...] --out runs/evolve [--resume] [--optimizer gepa]
    ctxrl export --run runs/X [--step N] --out DIR [--adapter-only]
    ctxrl export --adapter runs/sft/adapter [--base MODEL] --out DIR

This module parses and dispatches; every subcommand's implementation lives in :mod:`ctxrl.commands`.
Start-up must stay instant: this module imports only the standard library. Each subcommand names the
function that runs it as ``"module:function"`` and imports it only when called, so torch, transformers
and vLLM load only in the subcommand that needs them. Everything that is configuration comes from the run
config (``--config`` plus ``key=value``); flags are only paths, ``--json`` and ``--overwrite``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

# Benchmarks: name -> one-line help. Their implementations are ctxrl.commands.bench.BENCHMARKS.
BENCHMARKS: dict[str, str] = {
    "harness": "per-step harness overhead and sandbox overhead",
    "env": "episodes per second of the rollout loop with the scripted policies",
    "rollout": "rollout throughput of the vllm and hf engines on multi-turn episodes past 4k tokens",
    "train": "training cost on the tiny model: packed rows vs one row per step, one update vs TRL's GRPOTrainer",
    "smollm2": "a real model's GRPO step (rollout, update vs the old update, FLOP efficiency) and SFT vs TRL",
    "smollm2_bf16": "the smollm2 bench in bfloat16: bf16 engine weights, the update and both SFTs under bf16 autocast",
    "smollm2_bf16_compiled": "the smollm2_bf16 bench with the trainer's decoder layers and the engine compiled",
    "precision": "bfloat16 against float32 on this machine: matmul, the trainer's update and its logprob error, vLLM rollout",
    "engine": "the vLLM engine's CPU settings (dtype, compile, thread binding, KV space, prefill budget) against the defaults",
    "inflight": "the vLLM rollout's FLOP efficiency with 8, 16 and 32 SmolLM2 episodes in flight, and 8 at 64 new tokens",
    "fuzz": "hostile model outputs through whole steps of every mode and family: crashes, stalls, broken invariants",
}


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (exit 2) instead of the multi-line usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def resolve(target: str) -> Callable[..., Any]:
    module, _, name = target.partition(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn


def _add_run_config(p: argparse.ArgumentParser) -> None:
    """The run config of a subcommand: a YAML file and ``key=value`` overrides (ctxrl.commands.config)."""
    p.add_argument(
        "--config", type=Path, default=None, help="run config YAML (default: the schema's defaults)"
    )
    p.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. rollout.group_size=8"
    )


def _add_shortcuts(p: argparse.ArgumentParser, *, mode: bool = True) -> None:
    """``--engine`` and ``--mode``: one config key each (``ctxrl.commands.common.SHORTCUTS``)."""
    p.add_argument("--engine", default=None, help="engine.name: scripted, hf, vllm or vllm-server")
    if mode:
        p.add_argument("--mode", default=None, help="rollout.mode: file, tools, usage, harness or append")


def _add_out(p: argparse.ArgumentParser, default: str | None) -> None:
    help_text = f"run folder (default {default})" if default else "write the results into this folder"
    p.add_argument("--out", type=Path, default=Path(default) if default else None, help=help_text)
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")


def _add_tiny_model(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("tiny-model", help="build the tiny offline model + tokenizer into a folder")
    p.add_argument("--out", required=True, type=Path, help="output folder (must be empty unless --force)")
    p.add_argument("--seed", type=int, default=0, help="seed of corpus, tokenizer and weights (default 0)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.set_defaults(run="ctxrl.commands.tiny:run_tiny_model")


def _add_model(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("model", help="the model registry: list models, get one into a folder")
    msub = p.add_subparsers(dest="model_command", metavar="COMMAND", required=True, parser_class=_Parser)
    msub.add_parser("list", help="registry models, what they are and what getting them costs")
    g = msub.add_parser("get", help="obtain a registry model as a Hugging Face folder (reused when done)")
    g.add_argument("name", metavar="NAME", help="registry name (see 'ctxrl model list')")
    g.add_argument(
        "--out", type=Path, default=None, help="output folder (default: the cache, ~/.cache/ctxrl)"
    )
    g.add_argument("--force", action="store_true", help="rebuild even if OUT already holds the model")
    p.set_defaults(run="ctxrl.commands.model:run_model")


def _add_quickstart(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "quickstart", help="the CPU quickstart: everything that exists, end to end, on the tiny model"
    )
    _add_out(p, "runs/quickstart")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="overrides of the training stage, e.g. engine.name=hf",
    )
    p.set_defaults(run="ctxrl.commands.quickstart:run_quickstart")


def _add_bench(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("bench", help="benchmarks: print a table, optionally write flat JSON")
    bsub = p.add_subparsers(dest="bench", metavar="NAME", required=True, parser_class=_Parser)
    for name, help_text in BENCHMARKS.items():
        b = bsub.add_parser(name, help=help_text)
        b.add_argument("--json", type=Path, default=None, help="write {metric: number} JSON to this file")
        b.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run, noisier figures)")
        if name == "fuzz":
            b.add_argument("--seconds", type=float, default=60.0, help="how long to fuzz (default 60)")
            b.add_argument("--seed", type=int, default=0, help="seed of the episodes (default 0)")
            b.add_argument(
                "--workers",
                type=int,
                default=1,
                help="processes fuzzing at once (default 1; past the cores helps)",
            )
        b.set_defaults(run="ctxrl.commands.bench:run_bench")
    a = bsub.add_parser(
        "all", help="every benchmark: one JSON (with the date and machine), one Markdown table"
    )
    a.add_argument("--json", type=Path, default=None, help="write {bench: {metric: number}} + machine here")
    a.add_argument("--quick", action="store_true", help="every bench's smoke run")
    a.add_argument(
        "--from",
        dest="from_json",
        type=Path,
        nargs="+",
        default=None,
        help="render earlier JSON instead of running (several: each bench from the last file that has it)",
    )
    a.add_argument("--only", default=None, help="run these benches only, comma-separated (e.g. train,fuzz)")
    a.add_argument("--fuzz-seconds", type=float, default=60.0, help="the fuzz bench's --seconds (default 60)")
    a.add_argument("--fuzz-workers", type=int, default=1, help="the fuzz bench's --workers (default 1)")
    a.add_argument("--markdown", type=Path, default=None, help="also write the Markdown table to this file")
    a.add_argument(
        "--readme", type=Path, default=None, help="rewrite the table between this file's ctxrl-bench markers"
    )
    a.set_defaults(run="ctxrl.commands.bench:run_bench")


def _add_rollout(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("rollout", help="run a policy on built-in tasks and write its trajectories (JSONL)")
    _add_run_config(p)
    _add_out(p, "runs/rollout")
    p.add_argument("--model", default=None, help="model folder or registry name (sets model=; default: tiny)")
    _add_shortcuts(p)
    p.set_defaults(run="ctxrl.commands.rollout:run_rollout")


def _add_eval(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "eval", help="run scripted policies (engine.name=scripted) or a model on every family; print a table"
    )
    _add_run_config(p)
    _add_out(p, None)
    p.add_argument("--model", default=None, help="model folder or registry name (sets model=)")
    _add_shortcuts(p, mode=False)
    p.add_argument("--json", type=Path, default=None, help="write flat {metric: number} JSON to this file")
    p.set_defaults(run="ctxrl.commands.eval:run_eval")


def _add_train(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("train", help="stepwise GRPO on built-in tasks (metrics.jsonl, checkpoints)")
    _add_run_config(p)
    _add_out(p, "runs/train")
    p.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its latest checkpoint"
    )
    p.add_argument("--model", default=None, help="model folder or registry name (sets model=)")
    _add_shortcuts(p)
    p.set_defaults(run="ctxrl.commands.train:run_train")


def _add_sft(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "sft", help="supervised warm start on demonstrations (loss on generated tokens); writes OUT/model"
    )
    _add_run_config(p)
    _add_out(p, "runs/sft")
    p.add_argument(
        "--demos",
        type=Path,
        nargs="+",
        default=None,
        help="trajectories.jsonl files of demonstrations, used together (e.g. the scripted demonstrations "
        "and a model's own successful episodes; default: record them with engine.policy into OUT/demos)",
    )
    p.add_argument(
        "--model", default=None, help="base model folder or registry name (sets model=; default: tiny)"
    )
    _add_shortcuts(p)
    p.set_defaults(run="ctxrl.commands.sft:run_sft")


def _add_report(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("report", help="write one static HTML report of a run folder (plots, eval table)")
    p.add_argument(
        "folder",
        metavar="RUN",
        type=Path,
        help="run folder: trajectories.jsonl, metrics.jsonl, eval/, lineage.sqlite, summary.json and arms",
    )
    p.add_argument("--out", type=Path, default=None, help="report file (default RUN/report.html)")
    p.add_argument("--episodes", type=int, default=6, help="episodes with a context graph (default 6)")
    p.set_defaults(run="ctxrl.commands.report:run_report")


def _add_calibrate(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "calibrate", help="tabulate eval cells of a curriculum ladder and name the training level"
    )
    p.add_argument(
        "folder",
        metavar="DIR",
        type=Path,
        help="folder of <level>/<group>/eval.json cells (ctxrl eval --out)",
    )
    p.set_defaults(run="ctxrl.commands.calibrate:run_calibrate")


def _add_compare(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "compare",
        help="paired comparison of evaluated policies on the same tasks (success, compute per success)",
    )
    p.add_argument("start", type=Path, help="eval folder of the starting policy (ctxrl eval --out)")
    p.add_argument(
        "trained",
        type=Path,
        help="eval folder of the trained policy, same tasks; or A,B,C: the evals of its replicates, pooled",
    )
    p.add_argument(
        "ablation",
        type=Path,
        nargs="?",
        default=None,
        help="eval folder(s) of the ablation arm, the same way",
    )
    p.add_argument("--out", type=Path, default=None, help="write the summary JSON here")
    p.set_defaults(run="ctxrl.commands.compare:run_compare")


def _add_evolve(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "evolve", help="overnight skill evolution: notes, proposals, the held-out gate; resumable (--resume)"
    )
    _add_run_config(p)
    _add_out(p, "runs/evolve")
    p.add_argument(
        "--resume", action="store_true", help="continue the run in --out (start it if --out is empty)"
    )
    p.add_argument(
        "--hours",
        type=float,
        default=None,
        help="end the rounds this many hours after the night's first start",
    )
    p.add_argument(
        "--optimizer",
        choices=("ctxrl", "gepa"),
        default="ctxrl",
        help="ctxrl: notes, proposals and the held-out gate (default); gepa: the GEPA baseline, same budget",
    )
    p.add_argument("--model", default=None, help="model folder or registry name (sets model=)")
    _add_shortcuts(p)
    p.set_defaults(run="ctxrl.commands.evolve:run_evolve")


def _add_export(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "export", help="export a run's checkpoint as a serving-ready model folder, verified in vLLM"
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--run", dest="run_dir", type=Path, help="run folder with checkpoints/ (from training)"
    )
    source.add_argument(
        "--adapter",
        type=Path,
        help="a saved LoRA adapter folder (ctxrl sft's OUT/adapter): merge it into its base, no vLLM check",
    )
    p.add_argument("--base", default=None, help="with --adapter: the base model (default: the adapter's own)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    p.add_argument("--out", required=True, type=Path, help="export folder (must be new or empty)")
    p.add_argument(
        "--adapter-only", action="store_true", help="write only the LoRA adapter and the tokenizer"
    )
    p.set_defaults(run="ctxrl.commands.export:run_export")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ctxrl", description="Train and evolve LLM agents that manage their own context window."
    )
    parser.add_argument("--version", action="version", version=f"ctxrl {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    _add_tiny_model(sub)
    _add_model(sub)
    _add_quickstart(sub)
    _add_eval(sub)
    _add_rollout(sub)
    _add_train(sub)
    _add_bench(sub)
    _add_sft(sub)
    _add_report(sub)
    _add_calibrate(sub)
    _add_compare(sub)
    _add_evolve(sub)
    _add_export(sub)
    return parser


def _version() -> str:
    from ctxrl import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    from ctxrl.errors import CtxrlError

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # KEY=VALUE overrides may come before or after the options: argparse leaves the later ones over.
    stray = [a for a in extra if a.startswith("-") or not hasattr(args, "overrides")]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    if argv is None:  # started as the ctxrl command: engines get tcmalloc + Intel OpenMP preloaded
        from ctxrl.commands.preload import maybe_reexec

        maybe_reexec(args.command)
    try:
        return int(resolve(args.run)(args) or 0)
    except CtxrlError as exc:
        print(f"ctxrl {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a file-system problem the command did not name itself
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"ctxrl {args.command}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"ctxrl {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
