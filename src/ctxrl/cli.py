"""The ``ctxrl`` command.

    ctxrl --help
    ctxrl tiny-model --out runs/tiny
    ctxrl quickstart
    ctxrl bench NAME [--json FILE]

Start-up must stay instant: this module imports only the standard library. Each subcommand names the
function that runs it as ``"module:function"`` and imports it only when called, so torch, transformers
and vLLM load only in the subcommand that needs them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

# Benchmarks: name -> ("module:function", one-line help). The function takes the parsed arguments and
# returns a flat {metric name: number} dict; the CLI prints it as a table and writes it with --json.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "harness": ("ctxrl.env.bench:bench_harness", "per-step harness overhead and sandbox overhead"),
    "env": (
        "ctxrl.env.runner:bench_env",
        "episodes per second of the batched runner with the scripted policies",
    ),
    "rollout": (
        "ctxrl.train.rollout_bench:bench_rollout",
        "rollout throughput of the vllm and hf engines on multi-turn episodes past 4k tokens",
    ),
}


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (exit 2) instead of the multi-line usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def resolve(target: str) -> Callable[..., Any]:
    module, _, name = target.partition(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn


def _add_tiny_model(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("tiny-model", help="build the tiny offline model + tokenizer into a folder")
    p.add_argument("--out", required=True, type=Path, help="output folder (must be empty unless --force)")
    p.add_argument("--seed", type=int, default=0, help="seed of corpus, tokenizer and weights (default 0)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.set_defaults(run="ctxrl.cli_commands:run_tiny_model")


def _add_quickstart(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "quickstart", help="the CPU quickstart: everything that exists, end to end, on the tiny model"
    )
    p.add_argument(
        "--out", type=Path, default=Path("runs/quickstart"), help="run folder (default runs/quickstart)"
    )
    p.add_argument(
        "--engine", choices=("vllm", "hf"), default="vllm", help="generation engine (default vllm)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.set_defaults(run="ctxrl.cli_commands:run_quickstart")


def _add_bench(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("bench", help="benchmarks: print a table, optionally write flat JSON")
    bsub = p.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name, (target, help_text) in BENCHMARKS.items():
        b = bsub.add_parser(name, help=help_text)
        b.add_argument("--json", type=Path, default=None, help="write {metric: number} JSON to this file")
        b.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run, noisier figures)")
        b.set_defaults(run="ctxrl.cli:_run_bench", bench_target=target)


def _add_rollout(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("rollout", help="run a policy on built-in tasks and write its trajectories (JSONL)")
    p.add_argument("--out", type=Path, default=Path("runs/rollout"), help="run folder (default runs/rollout)")
    p.add_argument(
        "--model", default=None, help="model folder (default: the tiny model, built into OUT/model)"
    )
    p.add_argument(
        "--engine",
        choices=("vllm", "hf", "vllm-server", "scripted"),
        default="vllm",
        help="engine (default vllm)",
    )
    p.add_argument("--server-url", default=None, help="vllm-server: a running server (default: start one)")
    p.add_argument(
        "--policy", default=None, help="scripted: MODULE:FUNCTION(tokenizer) -> policy (default: a probe)"
    )
    p.add_argument("--families", default=None, help="comma-separated task families (default: all)")
    p.add_argument(
        "--mode", default="file", help="context mode: file, tools, usage, harness, append (default file)"
    )
    p.add_argument("--split", default="train", help="task split: train, dev, test (default train)")
    p.add_argument("--difficulty", default="default", help="easy, default or hard (default default)")
    p.add_argument("--tasks", type=int, default=4, help="number of tasks (default 4)")
    p.add_argument("--group-size", type=int, default=4, help="episodes per task, G (default 4)")
    p.add_argument("--max-steps", type=int, default=None, help="task steps per episode (default: the task's)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="tokens per action (default 256)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus mass (default 0.95)")
    p.add_argument("--max-model-len", type=int, default=8192, help="engine's longest sequence (default 8192)")
    p.add_argument("--workers", type=int, default=8, help="environment threads (default 8)")
    p.add_argument("--seed", type=int, default=0, help="engine and tiny-model seed (default 0)")
    p.add_argument("--keep-workspaces", action="store_true", help="keep episode workspaces under OUT")
    p.set_defaults(run="ctxrl.train.rollout_cli:run_rollout")


def _add_eval(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("eval", help="run scripted policies on task families; print and save a results table")
    p.add_argument(
        "--policy",
        nargs="+",
        default=["all"],
        help="scripted policies: append, harness, tools-manager, usage-manager, file-manager, or all (default all)",
    )
    p.add_argument("--families", nargs="+", default=None, help="task families (default: all)")
    p.add_argument("--split", default="test", help="task split: train, dev, test (default test)")
    p.add_argument("--episodes", type=int, default=10, help="episodes per family and policy (default 10)")
    p.add_argument("--difficulty", default="default", help="easy, default or hard (default default)")
    p.add_argument("--out", type=Path, default=None, help="write eval.json and eval.md into this folder")
    p.add_argument("--json", type=Path, default=None, help="write flat {metric: number} JSON to this file")
    p.add_argument("--workers", type=int, default=4, help="environment threads (default 4)")
    p.set_defaults(run="ctxrl.env.eval_cli:run_eval")


def _add_report(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("report", help="write one static HTML report of a run folder (plots, eval table)")
    p.add_argument(
        "folder",
        metavar="RUN",
        type=Path,
        help="run folder: trajectories.jsonl, metrics.jsonl, eval/, evolve.sqlite",
    )
    p.add_argument("--out", type=Path, default=None, help="report file (default RUN/report.html)")
    p.add_argument("--episodes", type=int, default=6, help="episodes with a context graph (default 6)")
    p.set_defaults(run="ctxrl.commands.report:run_report")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ctxrl", description="Train and evolve LLM agents that manage their own context window."
    )
    parser.add_argument("--version", action="version", version=f"ctxrl {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    _add_tiny_model(sub)
    _add_quickstart(sub)
    _add_eval(sub)
    _add_rollout(sub)
    _add_report(sub)
    if BENCHMARKS:
        _add_bench(sub)
    return parser


def _version() -> str:
    from ctxrl import __version__

    return __version__


def _run_bench(args: argparse.Namespace) -> int:
    metrics: dict[str, float] = resolve(args.bench_target)(args)
    width = max(len(k) for k in metrics)
    print(f"{'metric':<{width}}  value")
    for key, value in metrics.items():
        print(f"{key:<{width}}  {value:.4g}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({k: float(v) for k, v in metrics.items()}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    from ctxrl.errors import CtxrlError

    args = build_parser().parse_args(argv)
    try:
        return int(resolve(args.run)(args) or 0)
    except CtxrlError as exc:
        print(f"ctxrl {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"ctxrl {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
