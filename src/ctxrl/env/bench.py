"""``ctxrl bench harness``: per-step harness overhead and sandbox overhead.

    ctxrl bench harness [--quick] [--json FILE]

Step overhead is one full :meth:`Harness.step` with the command itself replaced by an in-process stand-in,
so it measures what the harness adds around a command: render and write the context file, read and parse
it back, count tokens of new and edited turns (tiny model's tokenizer and chat template), the edit gate,
the receipt, budget readout and nudges, and appending the turns. The measured step is the realistic worst
case: the model edited the file (replaced one older tool output with a short summary). The context is
restored to the same size before every repeat. ``step_overhead_ms_noedit_*`` are the same steps without
an edit. Sandbox overhead is the time of a trivial command in the sandbox minus the same command run with
a plain subprocess.

Targets: at most 5 ms per step at 32k tokens, at most 30 ms sandbox overhead per command.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import ChatTemplateCounter, ToolCall, Turn
from ctxrl.env.ctxfile import parse_context, render_context
from ctxrl.env.harness import Action, CommandRunner, Harness
from ctxrl.env.sandbox import CommandResult, SandboxConfig

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


def _sandbox_overhead_ms(repeats: int) -> float:
    from ctxrl.env import sandbox

    provided = getattr(sandbox, "sandbox_overhead_ms", None)
    if provided is not None:
        return float(provided(repeats))
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        box = sandbox.Sandbox(Path(tmp) / "ws", SandboxConfig())
        boxed, plain = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            box.run("true")
            boxed.append(time.perf_counter() - start)
            start = time.perf_counter()
            subprocess.run(["bash", "-c", "true"], cwd=tmp, check=False)
            plain.append(time.perf_counter() - start)
    return 1000 * (statistics.median(boxed) - statistics.median(plain))


def bench_harness(args: argparse.Namespace) -> dict[str, float]:
    """Metrics: ``step_overhead_ms_{4k,8k,32k}`` (edit step), ``step_overhead_ms_noedit_*``, ``sandbox_overhead_ms``."""
    from ctxrl.train.tiny_model import build_tokenizer

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
    metrics["sandbox_overhead_ms"] = _sandbox_overhead_ms(10 if quick else 40)
    metrics.update(noedit)
    return metrics
