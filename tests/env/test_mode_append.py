"""``append`` mode: nothing is managed; overflowing the context fails the episode without a rollback."""

from __future__ import annotations

from pathlib import Path

from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import ChatTemplateCounter, ToolCall
from ctxrl.env.harness import Action, Harness
from ctxrl.env.modes import AppendMode, make_mode
from ctxrl.env.receipts import ReceiptKind
from ctxrl.env.sandbox import CommandResult, SandboxConfig


class FakeRunner:
    """Runs nothing: ``emit N`` prints N characters; anything else echoes the command."""

    def __init__(self, workspace: Path, config: SandboxConfig) -> None:
        pass

    def run(self, command: str) -> CommandResult:
        parts = command.split()
        text = ("filler text\n" * 9999)[: int(parts[1])] if parts[0] == "emit" else command
        return CommandResult(command, 0, text, False, 0, 0.0)


def make(counter: ChatTemplateCounter, tmp_path: Path, budget: int = 6000) -> Harness:
    cfg = HarnessConfig(budget=budget, sandbox=SandboxConfig(backend="none"))
    mode = make_mode("append", cfg)
    assert isinstance(mode, AppendMode)
    harness = Harness(cfg, counter, mode, runner_factory=FakeRunner)
    harness.reset("You are an agent.", "Do the task.", tmp_path / "ws")
    return harness


def shell(harness: Harness, command: str) -> Action:
    return Action("", (ToolCall.make("", "shell", {"command": command}),))


def test_only_shell_and_submit_and_no_context_file(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    h = make(counter, tmp_path)
    assert [t["function"]["name"] for t in h.tools] == ["shell", "submit"]
    result = h.step(shell(h, "echo hi"))
    assert result.observations[0].startswith("echo hi") and result.receipts == ()
    assert not (tmp_path / "ws" / h.config.context_file).exists()
    assert not (tmp_path / "ws.overflow").exists()


def test_overflow_ends_the_episode_without_rollback(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    h = make(counter, tmp_path)
    assert not h.step(shell(h, "emit 2000")).done
    turns = len(h.context.turns)
    result = h.step(shell(h, "emit 9000"))
    assert (result.truncated, result.terminated, result.reason) == (True, False, "overflow")
    assert result.rolled_back_turns == 0 and len(h.context.turns) == turns + 2  # nothing removed
    assert h.context.tokens > h.config.limit


def test_context_tools_do_not_exist_here(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    h = make(counter, tmp_path)
    result = h.step(Action("", (ToolCall.make("", "context_drop", {"handles": ["call_1_0"]}),)))
    assert (
        result.receipts[0].kind == ReceiptKind.REJECTED
        and "unknown tool 'context_drop'" in result.observations[0]
    )
