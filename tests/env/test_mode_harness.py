"""``harness`` mode and the pressure pass: spill rules, fold at the soft ceiling, summarisers, pins."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import ChatTemplateCounter, ToolCall, Turn
from ctxrl.env.ctxfile import parse_context
from ctxrl.env.harness import Action, Harness, StepResult
from ctxrl.env.mode_config import ModesConfig, PressureConfig, ToolsModeConfig
from ctxrl.env.modes import EngineSummariser, extractive_summary, make_mode
from ctxrl.env.modes.pressure import SummaryError
from ctxrl.env.overflow import STUB_RE, OverflowStore
from ctxrl.env.sandbox import CommandResult, SandboxConfig
from ctxrl.errors import ConfigError


class FakeRunner:
    """Runs nothing: ``emit N`` prints N characters; anything else echoes the command."""

    def __init__(self, workspace: Path, config: SandboxConfig) -> None:
        pass

    def run(self, command: str) -> CommandResult:
        parts = command.split()
        text = (
            ("".join(f"row {i} hash 9f3a{i:04d}\n" for i in range(9999)))[: int(parts[1])]
            if parts[0] == "emit"
            else command
        )
        return CommandResult(command, 0, text, False, 0, 0.0)


def make(
    counter: ChatTemplateCounter,
    tmp_path: Path,
    name: str = "harness",
    *,
    budget: int = 32000,
    tools_with_pressure: bool = False,
    **pressure: Any,
) -> Harness:
    tools = ToolsModeConfig(offer_pct=0.0, with_pressure=tools_with_pressure)
    modes = ModesConfig(tools=tools, pressure=PressureConfig(**pressure))
    cfg = HarnessConfig(budget=budget, modes=modes, sandbox=SandboxConfig(backend="none"))
    harness = Harness(cfg, counter, make_mode(name, cfg), runner_factory=FakeRunner)
    harness.reset("You are an agent.", "Do the task.", tmp_path / "ws")
    return harness


def shell(harness: Harness, command: str) -> StepResult:
    return harness.step(Action("", (ToolCall.make("", "shell", {"command": command}),)))


def results(harness: Harness) -> list[str]:
    return [t.content for t in harness.context.turns if t.role == "tool"]


def test_old_results_spill_and_short_ones_stay(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    h = make(counter, tmp_path, keep_rounds=2)
    shell(h, "emit 700")
    shell(h, "emit 100")
    assert not any(STUB_RE.match(r) for r in results(h))  # both within the last 2 rounds
    result = shell(h, "emit 700")
    spilled, _short, recent = results(h)
    assert STUB_RE.match(spilled)  # round 1 is now outside the last 2 rounds
    assert not STUB_RE.match(recent)
    assert result.edited and result.events[0]["type"] == "pressure" and result.events[0]["spilled"] == 1
    shell(h, "emit 50")
    shell(h, "emit 50")
    assert not STUB_RE.match(results(h)[1])  # old, but under 600 characters: stays


def test_oversized_results_spill_whatever_their_age(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    h = make(counter, tmp_path, keep_rounds=4, spill_chars=1000)
    shell(h, "emit 1200")
    shell(h, "emit 900")
    big, fits = results(h)
    assert STUB_RE.match(big) and not STUB_RE.match(fits)
    stub = STUB_RE.match(big)
    assert stub is not None
    body = h.step(Action("", (ToolCall.make("", "read_overflow", {"id": stub["id"]}),))).observations[0]
    assert body.startswith("row 0 hash 9f3a0000") and len(body.split("\n[context:")[0]) >= 1200


def test_fold_at_the_soft_ceiling_keeps_a_restorable_transcript(
    counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    h = make(
        counter, tmp_path, budget=6000, keep_rounds=2, compact_pct=0.5, summary_chars=2000, spill_chars=8000
    )
    for i in range(6):
        shell(h, f"echo step {i} touched src/mod{i}.py id=job-{i}")
        shell(h, "emit 500")  # under 600 characters: never spilled, only folded
    before = len(h.context.turns)
    result = shell(h, "emit 3000")
    ctx = h.context
    assert len(ctx.turns) < before
    summary = ctx.turns[0]
    assert summary.role == "user" and summary.content.startswith("[folded history: ")
    assert "src/mod0.py" in summary.content and "id=job-0" in summary.content  # identifiers kept verbatim
    stub = STUB_RE.search(summary.content)
    assert stub is not None and stub["tool"] == "fold"
    transcript = h.step(Action("", (ToolCall.make("", "read_overflow", {"id": stub["id"]}),))).observations[0]
    folded = parse_context(transcript.rsplit("\n[context:", 1)[0])
    assert any("emit 500" in c.arguments for t in folded for c in t.tool_calls)
    # Earlier folds are folded again; following the stubs reaches the very first round.
    store, todo, seen = OverflowStore(tmp_path / "ws.overflow"), [stub["id"]], ""
    while todo:
        body = store.get(todo.pop()) or ""
        seen += body
        todo += [m["id"] for m in STUB_RE.finditer(body)]
    assert '"echo step 0 touched src/mod0.py id=job-0"' in seen
    assert any(e["folded_turns"] > 0 for e in result.events)
    assert sum(1 for t in ctx.turns if t.tool_calls) >= 2  # the last keep_rounds rounds stay


@pytest.mark.parametrize("compact_pct", [1.0, 0.3])  # spill only; spill and fold
def test_pinned_items_are_never_spilled_or_folded(
    counter: ChatTemplateCounter, tmp_path: Path, compact_pct: float
) -> None:
    h = make(counter, tmp_path, "tools", enabled=True, keep_rounds=1, compact_pct=compact_pct, budget=8000)
    shell(h, "emit 800")
    h.step(Action("", (ToolCall.make("", "context_pin", {"handles": ["call_1_0"]}),)))
    events = [e for _ in range(4) for e in shell(h, "emit 800").events]
    pinned = next(t for t in h.context.turns if t.tool_call_id == "call_1_0")
    assert pinned.content.startswith("[r1.1]\nrow 0 hash")  # tools mode tags each result with its handle
    other = [t.content for t in h.context.turns if t.tool_call_id == "call_3_0"]
    assert other == [] if compact_pct < 1 else STUB_RE.match(other[0])  # folded away, or spilled
    assert any(e["folded_turns"] for e in events) == (compact_pct < 1)


def test_pressure_runs_underneath_other_modes_only_when_enabled(
    counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    for name in ("usage", "file", "tools"):
        on = make(counter, tmp_path / f"{name}-on", name, enabled=True, keep_rounds=1)
        off = make(counter, tmp_path / f"{name}-off", name, enabled=False, keep_rounds=1)
        for h in (on, off):
            shell(h, "emit 700")
            shell(h, "emit 10")
        assert any(STUB_RE.search(r) for r in results(on)), name
        assert not any(STUB_RE.search(r) for r in results(off)), name
        assert "read_overflow" in [t["function"]["name"] for t in on.tools]


def test_tools_mode_runs_on_top_of_the_pressure_pass_by_default(
    counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    """Seed 000: the context tools sit on top of the automatic pass; ``tools.with_pressure`` is on by default."""
    assert ToolsModeConfig().with_pressure and not PressureConfig().enabled
    default = make(
        counter, tmp_path / "default", "tools", enabled=False, keep_rounds=1, tools_with_pressure=True
    )
    for _ in range(2):
        shell(default, "emit 700")
    assert any(STUB_RE.search(r) for r in results(default))


def test_extractive_summary_is_deterministic_and_bounded() -> None:
    turns = [
        Turn("assistant", "Let me look.", (ToolCall.make("c1", "shell", {"command": "cat src/a.py"}),)),
        Turn("tool", "def a():\n    return 'f00dcafe42'\n" * 200, tool_call_id="c1", name="shell"),
        Turn("user", "[harness] note"),
    ]
    first = extractive_summary(turns, 400)
    assert first == extractive_summary(turns, 400) and len(first) <= 400
    assert "- you: Let me look.; called shell(" in first and "- shell result: def a():" in first
    assert "f00dcafe42" in first and "src/a.py" in first


def test_engine_summariser_calls_the_engine_and_refuses_what_is_no_summary() -> None:
    turns = [Turn("user", "found the key K-77 in data.txt")]
    prompts: list[str] = []

    def generate(prompt: str) -> str:
        prompts.append(prompt)
        return "  The key is K-77, found in the data file.  "

    summary = EngineSummariser(generate)(turns, 400)
    # the engine's text, then the identifiers found in the turns, kept verbatim
    assert summary == "The key is K-77, found in the data file.\nPreserved (compaction-safe):\n- data.txt"
    assert "found the key K-77" in prompts[0] and prompts[0].rstrip().endswith("Summary:")
    assert "at most 360 characters" in prompts[0]  # 400 less the 39-character preserved block, a newline
    long = EngineSummariser(lambda p: "x" * 5000)(turns, 300)
    assert long == "x" * 260 + "\nPreserved (compaction-safe):\n- data.txt" and len(long) == 300
    for answer in ("   ", "ok.", "Summary: ----////----////----"):
        with pytest.raises(SummaryError):
            EngineSummariser(functools.partial(lambda text, p: text, answer))(turns, 400)


def _engine_harness(counter: ChatTemplateCounter, tmp_path: Path, generate: Any) -> Harness:
    modes = ModesConfig(pressure=PressureConfig(summariser="engine", keep_rounds=1, compact_pct=0.3))
    cfg = HarnessConfig(budget=6000, modes=modes, sandbox=SandboxConfig(backend="none"))
    h = Harness(cfg, counter, make_mode("harness", cfg, generate=generate), runner_factory=FakeRunner)
    h.reset("You are an agent.", "Do the task.", tmp_path / "ws")
    return h


def _folds(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["fold"] for e in events if e["type"] == "pressure" and "fold" in e]


def test_engine_summariser_is_used_by_the_fold(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    h = _engine_harness(counter, tmp_path, lambda p: "ENGINE SUMMARY of the work so far")
    events = [e for i in range(6) for e in shell(h, f"echo {i}").events]
    events += shell(h, "emit 2500").events
    assert h.context.turns[0].content.splitlines()[1] == "ENGINE SUMMARY of the work so far"
    [fold] = _folds(events)
    assert fold["summariser"] == "engine" and fold["fallback"] is None
    assert fold["summary"] == "ENGINE SUMMARY of the work so far"
    with pytest.raises(ConfigError, match="generate"):
        make_mode("harness", HarnessConfig(modes=ModesConfig(pressure=PressureConfig(summariser="engine"))))


def _raises(prompt: str) -> str:
    raise RuntimeError("engine down")


@pytest.mark.parametrize(
    ("generate", "why"),
    [
        (_raises, "RuntimeError: engine down"),
        (lambda p: "", "SummaryError"),
        (lambda p: "#" * 40, "SummaryError"),
    ],
)
def test_a_failing_summariser_falls_back_to_the_extractive_summary(
    counter: ChatTemplateCounter, tmp_path: Path, generate: Any, why: str
) -> None:
    """An engine error, an empty answer or garbage never fails the step: the fold is extractive, and says why."""
    h = _engine_harness(counter, tmp_path, generate)
    events = [e for _ in range(6) for e in shell(h, "emit 500").events]  # under 600 characters: folded only
    events += shell(h, "emit 2500").events
    folds = _folds(events)
    assert folds and all(f["summariser"] == "extractive" and f["fallback"].startswith(why) for f in folds)
    note = h.context.turns[0].content.splitlines()
    assert note[0].startswith("[folded history: ") and note[1].startswith("- ")
    assert note[1:-1] == folds[-1]["summary"].splitlines()  # the extractive text is what the model sees
    assert "- you: called shell(" in h.context.turns[0].content
