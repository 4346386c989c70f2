"""``ctxrl rollout``: run a policy on built-in tasks and write its trajectories.

    ctxrl rollout --out runs/rollout                       # the tiny model, built into runs/rollout/model
    ctxrl rollout --model path/to/model --engine hf --families retention,board --tasks 8 --group-size 4
    ctxrl rollout --engine vllm-server --server-url http://127.0.0.1:8000 --model path/to/model
    ctxrl rollout --engine scripted --out runs/probe       # a probe policy, no model calls

Writes ``<out>/trajectories.jsonl`` (one episode per line, :mod:`ctxrl.train.trajectory`) and
``<out>/summary.json``, shows a progress bar over episodes, and prints a one-screen summary. Bad input (a
folder that is not a causal LM, an unreachable server, an unknown family) is a one-line error, exit 1.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import json
import re
import statistics
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ctxrl.errors import ConfigError, UsageError
from ctxrl.train.engines import Engine
from ctxrl.train.rollout import RolloutResult
from ctxrl.train.trajectory import EpisodeRecord

_TOOL_NAME = re.compile(r'"function": \{"name": "([^"]+)"')


def probe_policy(tokenizer: Any, calls_before_submit: int = 3) -> Any:
    """The ``scripted`` engine's default policy: a probe that exercises the environment without a model.

    On its k-th turn it calls the k-th tool listed in the prompt (round robin, submit excluded) with no
    arguments; after ``calls_before_submit`` turns it submits an empty answer. It never succeeds; it shows
    that tasks, tools, sandbox, receipts and records work end to end.
    """

    def policy(prompt_ids: list[int]) -> str:
        text = tokenizer.decode(prompt_ids)
        turn = text.count("<|im_start|>assistant") - 1
        names = [n for n in dict.fromkeys(_TOOL_NAME.findall(text)) if n != "submit"]
        if turn >= calls_before_submit or not names:
            name, arguments = "submit", {"answer": ""}
        else:
            name, arguments = names[turn % len(names)], {}
        return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"

    return policy


def _scripted_policy(spec: str | None, tokenizer: Any) -> Any:
    if spec is None:
        return probe_policy(tokenizer)
    module, _, name = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise UsageError(f"--policy {spec}: cannot import it ({exc}); give MODULE:FUNCTION") from None
    return factory(tokenizer)


def _model_dir(args: argparse.Namespace) -> Path:
    if args.model is not None:
        return Path(args.model)
    from ctxrl.cli_commands import ensure_tiny_model

    return ensure_tiny_model(args.out / "model", seed=args.seed)


def _make_engine(args: argparse.Namespace, model_dir: Path, tokenizer: Any) -> Engine:
    from ctxrl.train.engines import make_engine

    if args.engine == "scripted":
        policy = _scripted_policy(args.policy, tokenizer)
        return make_engine("scripted", policy=policy, tokenizer=tokenizer, max_model_len=args.max_model_len)
    if args.engine == "vllm-server":
        if args.server_url:
            return make_engine("vllm-server", base_url=args.server_url)
        return make_engine("vllm-server", model_dir, max_model_len=args.max_model_len, seed=args.seed)
    return make_engine(args.engine, model_dir, max_model_len=args.max_model_len, seed=args.seed)


def _cache_block_size(engine: Engine, default: int) -> int:
    """The engine's KV block size when it has one (in-process vLLM), for the cost replay."""
    llm = getattr(engine, "_llm", None)
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    size = getattr(getattr(config, "cache_config", None), "block_size", None)
    return int(size) if size else default


def _geometry(model_dir: Path) -> Any:
    from ctxrl.rewards.cost import ModelGeometry

    try:
        return ModelGeometry.from_config(json.loads((model_dir / "config.json").read_text(encoding="utf-8")))
    except (OSError, ValueError, ConfigError):
        return None  # FLOPs are then not priced; tokens still are


def summarize(result: RolloutResult) -> dict[str, Any]:
    """The summary of a rollout: episodes, success, steps, tokens, cache share, speed, end reasons."""
    eps = result.episodes
    st = result.stats
    by_family: dict[str, list[EpisodeRecord]] = collections.defaultdict(list)
    for ep in eps:
        by_family[ep.family].append(ep)
    return {
        "episodes": len(eps),
        "success_rate": statistics.fmean(ep.success for ep in eps) if eps else 0.0,
        "mean_steps": statistics.fmean(len(ep.steps) for ep in eps) if eps else 0.0,
        "generated_tokens": st.generated_tokens,
        "prompt_tokens": st.prompt_tokens,
        "cached_token_share": st.cached_share,
        "tokens_per_s": st.tokens_per_s,
        "env_steps": st.env_steps,
        "env_steps_per_s": st.env_steps_per_s,
        "wall_s": st.wall_s,
        "generate_s": st.generate_s,
        "rebuilt_prompts": sum(s.prompt_source == "rebuild" for ep in eps for s in ep.steps),
        "mean_cost_tokens": statistics.fmean(ep.cost_tokens for ep in eps) if eps else 0.0,
        "end_reasons": dict(collections.Counter(ep.end_reason for ep in eps)),
        "success_by_family": {
            f: statistics.fmean(e.success for e in group) for f, group in by_family.items()
        },
    }


def _print_summary(summary: dict[str, Any], engine: str, out: Path) -> None:
    s = summary
    ends = ", ".join(f"{k} {v}" for k, v in sorted(s["end_reasons"].items()))
    fams = ", ".join(f"{k} {v:.0%}" for k, v in s["success_by_family"].items())
    print(f"rollout with the {engine} engine")
    print(f"  episodes          {s['episodes']}  (success {s['success_rate']:.1%}; by family: {fams})")
    print(f"  steps per episode {s['mean_steps']:.1f}  (end reasons: {ends})")
    print(f"  tokens generated  {s['generated_tokens']}  ({s['tokens_per_s']:.0f} tokens/s in the engine)")
    print(f"  cached-token share {s['cached_token_share']:.1%} of {s['prompt_tokens']} prompt tokens")
    print(f"  prompts rebuilt   {s['rebuilt_prompts']}  (after edits, rollbacks or changed history)")
    print(
        f"  env steps         {s['env_steps']}  ({s['env_steps_per_s']:.2f} steps/s over {s['wall_s']:.1f} s wall)"
    )
    print(f"  trajectories      {out / 'trajectories.jsonl'}")


def run_rollout(args: argparse.Namespace) -> int:
    """Entry point of ``ctxrl rollout`` (see the module docstring)."""
    from tqdm import tqdm

    from ctxrl.env.tasks.registry import BuiltinTaskSource
    from ctxrl.train.engines import SamplingConfig
    from ctxrl.train.engines.model_dir import check_causal_lm_dir, load_tokenizer
    from ctxrl.train.rollout import RolloutConfig, rollout
    from ctxrl.train.trajectory import save_trajectories

    families: Sequence[str] | None = [f for f in args.families.split(",") if f] if args.families else None
    tasks = list(BuiltinTaskSource(families, args.difficulty).tasks(args.split, args.tasks))
    config = RolloutConfig(
        group_size=args.group_size,
        mode=args.mode,
        sampling=SamplingConfig(
            temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens
        ),
        max_steps=args.max_steps,
        workers=args.workers,
        keep_workspaces=args.keep_workspaces,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = _model_dir(args)
    if args.engine != "scripted" and not (args.engine == "vllm-server" and args.server_url):
        check_causal_lm_dir(model_dir)  # before a minute of engine start-up
    tokenizer = load_tokenizer(model_dir)
    engine = _make_engine(args, model_dir, tokenizer)
    try:
        config = replace(config, cache_block_size=_cache_block_size(engine, config.cache_block_size))
        total = len(tasks) * config.group_size
        with tqdm(total=total, desc="episodes", unit="ep", dynamic_ncols=True) as bar:
            steps = 0

            def on_step(taken: int, ended: int) -> None:
                nonlocal steps
                steps += taken
                bar.update(ended)
                bar.set_postfix(steps=steps)

            result = rollout(
                engine,
                tokenizer,
                tasks,
                config,
                workdir=args.out / "workspaces",
                geometry=_geometry(model_dir),
                on_step=on_step,
            )
    finally:
        engine.close()
        if (args.out / "workspaces").is_dir() and not any((args.out / "workspaces").iterdir()):
            (args.out / "workspaces").rmdir()
    save_trajectories(result.episodes, args.out / "trajectories.jsonl")
    summary = summarize(result)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    _print_summary(summary, engine.name, args.out)
    return 0
