"""``ctxrl bench harness|env|rollout``: the benchmarks. Each returns a flat ``{metric: number}`` dict; the
CLI prints it as a table and writes it with ``--json``. ``--quick`` is a smoke run (fewer repeats).

    ctxrl bench harness [--quick] [--json FILE]
    ctxrl bench env [--quick] [--json FILE]
    ctxrl bench rollout [--quick] [--json FILE]

**harness**: per-step harness overhead and sandbox overhead.

Step overhead is one full :meth:`Harness.step` with the command itself replaced by an in-process stand-in,
so it measures what the harness adds around a command: render and write the context file, read and parse
it back, count tokens of new and edited turns (tiny model's tokenizer and chat template), the edit gate,
the receipt, budget readout and nudges, and appending the turns. The measured step is the realistic worst
case: the model edited the file (replaced one older tool output with a short summary). The context is
restored to the same size before every repeat. ``step_overhead_ms_noedit_*`` are the same steps without
an edit. Sandbox overhead is the time of a trivial command in the sandbox minus the same command run with
a plain subprocess.

Targets: at most 5 ms per step at 32k tokens, at most 30 ms sandbox overhead per command.

**env**: episodes per second of the rollout loop with the scripted reference policies on the scripted
engine, every policy on every family (default difficulty, test split; 1 episode per policy and family with
``--quick``, else 6; 4 workers).

**rollout**: rollout throughput of the ``vllm`` and ``hf`` engines on long multi-turn episodes. The
workload: the tiny model (built into a temporary folder), two ``retention`` tasks (easy), G = 2 episodes
per task, file mode, a harness budget of 16k tokens (so nothing is rolled back), and every action exactly
``NEW_TOKENS`` tokens long (``ignore_eos``), so both engines run episodes of the same lengths. Each step
appends the action and the harness's note and readout (~170 tokens), so over ``STEPS`` steps every
context grows from ~1.2k to past 4k tokens: the regime where re-reading the prompt dominates and vLLM's
prefix cache pays. The same rollout loop runs both engines (transformers first, then vLLM, each on the
same tasks and batch).

Metrics:

- ``vllm_tokens_per_s``, ``hf_tokens_per_s``: generated tokens per second of time inside ``generate``;
- ``vllm_vs_hf_ratio``: their ratio (target: at least 3);
- ``env_steps_per_s``: environment steps per wall-clock second of the whole vLLM rollout (generation,
  harness steps, sandbox commands, scoring).

The transformers engine dominates the run time (it re-reads every prompt in full): about 7 minutes per task
on a loaded 2-core machine.

``--quick`` is a smoke run of the same path, both engines included: one task, one episode, ``QUICK_STEPS``
steps of ``QUICK_NEW_TOKENS`` tokens and an 8k harness budget (contexts stay near 1.3k tokens, so the
4k-context check is skipped); its figures say the engines work, not how fast they are at length. The run
time is then the engines' start-up (vLLM: ~30-60 s here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctxrl.commands.bench_train import bench_train
from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import ChatTemplateCounter, ToolCall, Turn
from ctxrl.env.ctxfile import parse_context, render_context
from ctxrl.env.harness import Action, Harness
from ctxrl.env.modes.base import CommandRunner
from ctxrl.env.sandbox import CommandResult, SandboxConfig, sandbox_overhead_ms
from ctxrl.errors import BenchError

SIZES = {"4k": 4096, "8k": 8192, "32k": 32768}
_WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "value",
    "key",
    "result",
    "test",
    "file",
    "line",
    "error",
    "note",
    "state",
    "board",
]


class _InProcessRunner:
    """Stands in for the sandbox: applies ``edit`` to the context file (if set) instead of running a command."""

    def __init__(self, workspace: Path, context_file: str) -> None:
        self.path = workspace / context_file
        self.edit: Callable[[str], str] | None = None
        self.elapsed = 0.0
        """Seconds spent in the stand-in command itself (subtracted from the step time)."""

    def run(self, command: str) -> CommandResult:
        start = time.perf_counter()
        if self.edit is not None:
            self.path.write_text(self.edit(self.path.read_text(encoding="utf-8")), encoding="utf-8")
        self.elapsed += time.perf_counter() - start
        return CommandResult(command, 0, "", False, 0, 0.0)


def _filler_turns(n_exchanges: int, output_words: int) -> list[Turn]:
    turns: list[Turn] = []
    for i in range(n_exchanges):
        call = ToolCall.make(f"c{i}", "shell", {"command": f"grep -n key data_{i}.txt"})
        turns.append(Turn("assistant", f"Step {i}: look at data_{i}.txt.", tool_calls=(call,)))
        lines = [
            f"{j}: " + " ".join(_WORDS[(i * 7 + j * 3 + k) % len(_WORDS)] for k in range(8))
            for j in range(output_words // 8)
        ]
        turns.append(Turn("tool", "\n".join(lines), tool_call_id=call.id, name="shell"))
    return turns


def _build_context(harness: Harness, target_tokens: int) -> list[Turn]:
    """Fill the editable region with exchanges until the prompt reaches ``target_tokens``; return the turns."""
    ctx = harness.context
    turns: list[Turn] = []
    i = 0
    while ctx.tokens < target_tokens:
        turns = _filler_turns(i + 1, 400)
        ctx.replace_turns(turns)
        i += 1
    return list(ctx.turns)


def _summarise_first_output(text: str) -> str:
    """The model's edit: replace the first tool output with a one-line summary (a realistic compaction)."""
    turns = parse_context(text)
    first = next(k for k, t in enumerate(turns) if t.role == "tool")
    turns[first] = Turn(
        "tool", "summary: key found on lines 3 and 9", tool_call_id=turns[first].tool_call_id, name="shell"
    )
    return render_context(turns)


SYSTEM = "You manage your own context. " * 20
TASK = "Find every key in the data files."


def _time_steps(
    harness: Harness, runner: _InProcessRunner, workspace: Path, base: list[Turn], repeats: int, edit: bool
) -> float:
    """Median milliseconds of one step (a fresh episode restored to ``base`` before each)."""
    # Prepare the edited file text once: the edit's own cost is the model's command, not harness overhead.
    edited_text = _summarise_first_output(render_context(base))
    runner.edit = (lambda _text: edited_text) if edit else None
    times = []
    for r in range(repeats + 2):
        harness.reset(SYSTEM, TASK, workspace)
        harness.context.replace_turns(base)  # cached counts: cheap
        action = Action(
            f"Next step {r}.", (ToolCall.make("", "shell", {"command": "sed -i s/a/b/ context.md"}),)
        )
        runner.elapsed = 0.0
        start = time.perf_counter()
        harness.step(action)
        elapsed = time.perf_counter() - start - runner.elapsed
        if r >= 2:  # two warm-up steps fill the per-turn token cache
            times.append(elapsed)
    return 1000 * statistics.median(times)


def bench_harness(args: argparse.Namespace) -> dict[str, float]:
    """Metrics: ``step_overhead_ms_{4k,8k,32k}`` (edit step), ``step_overhead_ms_noedit_*``, ``sandbox_overhead_ms``."""
    from ctxrl.env.tokenizer import build_tokenizer

    quick = bool(getattr(args, "quick", False))
    repeats = 10 if quick else 60
    counter = ChatTemplateCounter(build_tokenizer())
    metrics: dict[str, float] = {}
    noedit: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, size in SIZES.items():
            cfg = HarnessConfig(budget=size + 4096, reserve=2048, sandbox=SandboxConfig(backend="none"))
            workspace = Path(tmp) / label
            runner = _InProcessRunner(workspace, cfg.context_file)

            def factory(_ws: Path, _cfg: SandboxConfig, runner: Any = runner) -> CommandRunner:
                return runner

            harness = Harness(cfg, counter, runner_factory=factory)
            harness.reset(SYSTEM, TASK, workspace)
            base = _build_context(harness, size)
            metrics[f"step_overhead_ms_{label}"] = _time_steps(
                harness, runner, workspace, base, repeats, True
            )
            noedit[f"step_overhead_ms_noedit_{label}"] = _time_steps(
                harness, runner, workspace, base, repeats, False
            )
    metrics["sandbox_overhead_ms"] = sandbox_overhead_ms(10 if quick else 40)
    metrics.update(noedit)
    return metrics


def bench_env(args: argparse.Namespace) -> dict[str, float]:
    """``ctxrl bench env``: episodes per second of the rollout loop with the scripted policies (see above)."""
    from ctxrl.commands.common import scripted_policy
    from ctxrl.env.policies import POLICY_MODES
    from ctxrl.env.tasks.registry import FAMILIES, make_task
    from ctxrl.env.tasks.splits import split_seeds
    from ctxrl.env.tokenizer import load_tokenizer
    from ctxrl.train.engines import EngineConfig, make_engine
    from ctxrl.train.rollout import RolloutConfig, rollout

    seeds = split_seeds("test", 1 if args.quick else 6)
    tasks = [make_task(family, seed, split="test") for family in FAMILIES for seed in seeds]
    tokenizer = load_tokenizer(None)
    episodes = steps = 0
    start = time.perf_counter()
    for name, mode in POLICY_MODES.items():
        engine = make_engine(
            EngineConfig(name="scripted"), tokenizer=tokenizer, policy=scripted_policy(name, tokenizer)
        )
        result = rollout(engine, tokenizer, tasks, RolloutConfig(group_size=1, mode=mode, workers=4))
        episodes += len(result.episodes)
        steps += result.stats.env_steps
    seconds = time.perf_counter() - start
    return {
        "episodes_per_s": episodes / seconds,
        "steps_per_s": steps / seconds,
        "episodes": float(episodes),
        "seconds": seconds,
    }


NEW_TOKENS = 128
STEPS = 18
MIN_CONTEXT = 4096
QUICK_NEW_TOKENS = 16
QUICK_STEPS = 3


def bench_rollout(args: argparse.Namespace) -> dict[str, float]:
    """Run the workload with the ``hf`` then the ``vllm`` engine; return the four metrics."""
    from tqdm import tqdm

    from ctxrl.env.tasks.registry import make_task
    from ctxrl.env.tokenizer import load_tokenizer_dir
    from ctxrl.train.engines import EngineConfig, SamplingConfig, make_engine
    from ctxrl.train.rollout import RolloutConfig, RolloutResult, rollout
    from ctxrl.train.tiny_model import build_tiny_model

    quick = bool(args.quick)
    steps, new_tokens = (QUICK_STEPS, QUICK_NEW_TOKENS) if quick else (STEPS, NEW_TOKENS)
    tasks = [make_task("retention", seed, "easy") for seed in range(1 if quick else 2)]
    config = RolloutConfig(group_size=1 if quick else 2, mode="file", task_budget=False)
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=new_tokens, ignore_eos=True)
    harness = HarnessConfig(budget=8192 if quick else 16384, reserve=1024, max_steps=steps)
    results: dict[str, RolloutResult] = {}
    with tempfile.TemporaryDirectory(prefix="ctxrl-bench-rollout-") as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", seed=0)
        tokenizer = load_tokenizer_dir(model_dir)
        for name in ("hf", "vllm"):
            engine = make_engine(EngineConfig(name=name, max_model_len=8192), model_dir)
            bar = tqdm(total=steps * len(tasks) * config.group_size, desc=f"{name} env steps", unit="step")
            try:
                results[name] = rollout(
                    engine,
                    tokenizer,
                    tasks,
                    config,
                    workdir=Path(tmp) / name,
                    on_step=_advance(bar),
                    harness=harness,
                    sampling=sampling,
                )
            finally:
                bar.close()
                engine.close()
    for name, result in results.items():
        longest = max(len(s.prompt_ids) for ep in result.episodes for s in ep.steps)
        if longest < MIN_CONTEXT and not quick:
            raise BenchError(
                f"{name}: contexts reached only {longest} tokens, not the {MIN_CONTEXT} measured"
            )
    vllm, hf = results["vllm"].stats, results["hf"].stats
    return {
        "vllm_tokens_per_s": vllm.tokens_per_s,
        "hf_tokens_per_s": hf.tokens_per_s,
        "vllm_vs_hf_ratio": vllm.tokens_per_s / hf.tokens_per_s if hf.tokens_per_s > 0 else 0.0,
        "env_steps_per_s": vllm.env_steps_per_s,
    }


def _advance(bar: Any) -> Callable[[int, int], None]:
    """A rollout ``on_step`` callback that moves ``bar`` by the env steps taken."""

    def on_step(taken: int, ended: int) -> None:
        bar.update(taken)

    return on_step


BENCHMARKS: dict[str, Callable[[argparse.Namespace], dict[str, float]]] = {
    "harness": bench_harness,
    "env": bench_env,
    "rollout": bench_rollout,
    "train": bench_train,
}


def run_bench(args: argparse.Namespace) -> int:
    """Entry point of ``ctxrl bench NAME``: run it, print a table, write ``--json``."""
    from ctxrl.commands.common import check_writable_file, write_text

    if args.json is not None:
        check_writable_file(args.json)
    metrics = BENCHMARKS[args.bench](args)
    width = max(len(k) for k in metrics)
    print(f"{'metric':<{width}}  value")
    for key, value in metrics.items():
        print(f"{key:<{width}}  {value:.4g}")
    if args.json is not None:
        write_text(args.json, json.dumps({k: float(v) for k, v in metrics.items()}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
