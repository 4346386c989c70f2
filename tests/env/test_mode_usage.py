"""``usage`` mode (seed 001): the usage block and its slot, eviction, the archive, search, turn headers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import ChatTemplateCounter, ToolCall
from ctxrl.env.harness import Action, Harness, StepResult
from ctxrl.env.mode_config import ModesConfig, UsageModeConfig
from ctxrl.env.modes import make_mode
from ctxrl.env.receipts import ReceiptKind
from ctxrl.env.sandbox import CommandResult, SandboxConfig

SYSTEM = "You are an agent."
TASK = "Read the specs and submit the key."


class FakeRunner:
    """Runs nothing: ``emit N`` prints N characters; anything else echoes the command."""

    def __init__(self, workspace: Path, config: SandboxConfig) -> None:
        pass

    def run(self, command: str) -> CommandResult:
        parts = command.split()
        text = ("output line\n" * 9999)[: int(parts[1])] if parts[0] == "emit" else command
        return CommandResult(command, 0, text, False, 0, 0.0)


def make(counter: ChatTemplateCounter, tmp_path: Path, *, budget: int = 32000, **usage: Any) -> Harness:
    usage.setdefault("threshold_pct", 0.0)
    cfg = HarnessConfig(
        budget=budget,
        modes=ModesConfig(usage=UsageModeConfig(**usage)),
        sandbox=SandboxConfig(backend="none"),
    )
    harness = Harness(cfg, counter, make_mode("usage", cfg), runner_factory=FakeRunner)
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "main.py").write_text("".join(f"def f{i}(): return {i}\n" for i in range(300)))
    (ws / "src" / "small.py").write_text("x = 1\n" * 20)
    (ws / "SPEC.md").write_text("The spec.\n" * 200)
    harness.reset(SYSTEM, TASK, ws)
    return harness


def call(harness: Harness, *calls: tuple[str, dict[str, Any]]) -> StepResult:
    return harness.step(Action("", tuple(ToolCall.make("", name, args) for name, args in calls)))


def block(harness: Harness) -> str | None:
    last = harness.context.to_messages()[-1]
    return last["content"] if last["content"].startswith("Context Usage:") else None


def names(harness: Harness) -> list[str]:
    return [t["function"]["name"] for t in harness.tools]


# --- the usage block -------------------------------------------------------------------------------------


def test_block_format_order_and_nested_file_views(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    h = make(counter, tmp_path)
    text = block(h)
    assert text is not None
    lines = text.splitlines()
    assert lines[0] == "Context Usage:" and re.fullmatch(r"- Overall: \d+\.\d%", lines[1])
    assert [ln.split(":")[0] for ln in lines[2:4]] == ["- System Prompt", "- Task Prompt"]
    assert "Your Messages" not in text and "File Views" not in text  # empty categories are left out

    call(h, ("read_file", {"path": "src/main.py"}), ("read_file", {"path": "src/small.py"}))
    call(h, ("shell", {"command": "emit 300"}), ("read_file", {"path": "./src/main.py", "max_lines": 10}))
    lines = block(h).splitlines()  # type: ignore[union-attr]
    bands = [ln.split(":")[0] for ln in lines if ln.startswith("- ") and not ln.startswith("- Top")]
    assert bands == [
        "- Overall",
        "- System Prompt",
        "- Task Prompt",
        "- Your Messages",
        "- Tool Output",
        "- File Views",
    ]
    assert all(re.fullmatch(r"- [A-Za-z ]+: \d+\.\d%", ln) for ln in lines[1:7])
    top = lines.index("- Top File Views:")
    assert top == lines.index(next(ln for ln in lines if ln.startswith("- File Views"))) + 1
    assert re.fullmatch(r"  - `src/main\.py`: \d+\.\d%", lines[top + 1])  # two reads of one path summed
    assert lines[top + 2].startswith("  - `src/small.py`")
    assert lines[-2].startswith("evict_file_view") and lines[-1].startswith("archive_thread")


def test_overall_is_the_share_of_the_limit_without_the_block(
    counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    h = make(counter, tmp_path, compaction=False)  # no read_overflow schema: the tool list is the seed's
    call(h, ("shell", {"command": "emit 3000"}))
    # Without the block the prompt is 3789 tokens (checked below against the chat template tokenised by
    # transformers directly; no readout line, as seed 001 has none); the limit is 32000 - 2048 = 29952;
    # 100 * 3789 / 29952 = 12.65 %.
    assert h.config.limit == 29952
    assert "Overall: 12.7%" in (block(h) or "")
    tokenizer = counter.tokenizer
    messages = h.context.to_messages()
    assert messages[-1]["content"].startswith("Context Usage:")
    text = tokenizer.apply_chat_template(
        messages[:-1], tools=h.context.tools, add_generation_prompt=True, tokenize=False
    )
    assert len(tokenizer.encode(text, add_special_tokens=False)) == 3789


def test_no_block_below_the_threshold_and_one_slot_at_most(
    counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    h = make(counter, tmp_path, budget=12000, threshold_pct=75.0)
    assert block(h) is None
    call(h, ("read_file", {"path": "src/main.py"}), ("read_file", {"path": "SPEC.md"}))
    call(h, ("shell", {"command": "emit 4000"}))
    assert h.context.tokens >= 0.75 * h.config.limit
    assert block(h) is not None
    call(h, ("shell", {"command": "echo again"}))
    contents = [m["content"] for m in h.context.to_messages()]
    assert sum(c.startswith("Context Usage:") for c in contents) == 1
    assert contents[-1].startswith("Context Usage:")
    call(h, ("evict_file_view", {}))  # a reclaim below the threshold takes the block away
    assert h.context.tokens < 0.75 * h.config.limit and block(h) is None


def test_top_file_views_only_when_eviction_is_granted(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    h = make(counter, tmp_path, evict=False)
    call(h, ("read_file", {"path": "src/main.py"}))
    text = block(h) or ""
    assert "- File Views:" in text and "Top File Views" not in text and "evict_file_view" not in text
    assert "evict_file_view" not in names(h)


# --- eviction --------------------------------------------------------------------------------------------


def test_evict_a_path_removes_every_page_and_reports_a_managed_event(
    counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    h = make(counter, tmp_path)
    call(h, ("read_file", {"path": "src/main.py", "max_lines": 100}), ("read_file", {"path": "src/small.py"}))
    call(h, ("read_file", {"path": "src/main.py", "start_line": 101}))
    before = h.context.tokens
    result = call(h, ("evict_file_view", {"path": "src/main.py"}))
    assert result.receipts[0].kind == ReceiptKind.APPLIED
    contents = [t.content for t in h.context.turns if t.role == "tool"]
    assert sum("file view evicted: src/main.py" in c for c in contents) == 2
    assert any("File: src/small.py" in c for c in contents)
    (event,) = result.events
    assert set(event) == {
        "type",
        "action",
        "reclaimed_tokens",
        "items_removed",
        "earliest_position",
        "detail",
    }
    assert (event["type"], event["action"], event["items_removed"], event["earliest_position"]) == (
        "ContextManaged",
        "evict_file_views",
        2,
        1,
    )
    receipt = result.receipts[0]
    assert receipt.before == before and event["reclaimed_tokens"] == receipt.before - receipt.after
    assert event["reclaimed_tokens"] > 500


def test_evict_all_spares_locked_specifications(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    h = make(counter, tmp_path, locked_paths=("SPEC.md",))
    call(h, ("read_file", {"path": "SPEC.md"}), ("read_file", {"path": "src/main.py"}))
    assert "`SPEC.md`" not in (block(h) or "")  # a locked view is never listed
    call(h, ("evict_file_view", {}))
    contents = [t.content for t in h.context.turns if t.role == "tool"]
    assert any(c.startswith("Turn #1") and "File: SPEC.md" in c for c in contents)
    assert any("file view evicted: src/main.py" in c for c in contents)
    refused = call(h, ("evict_file_view", {"path": "SPEC.md"}))
    assert refused.receipts[0].kind == ReceiptKind.REJECTED and "locked" in refused.receipts[0].text


def test_read_file_never_leaves_the_workspace(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    h = make(counter, tmp_path)
    (tmp_path / "secret.txt").write_text("host secret")
    (tmp_path / "ws" / "link").symlink_to(tmp_path / "secret.txt")
    for path in ("../secret.txt", "link", "/etc/passwd/../../secret.txt"):
        out = call(h, ("read_file", {"path": path})).observations[0]
        assert "host secret" not in out


# --- archive ---------------------------------------------------------------------------------------------


def archived_harness(counter: ChatTemplateCounter, tmp_path: Path, rounds: int = 6) -> Harness:
    h = make(counter, tmp_path)
    for i in range(1, rounds + 1):
        call(h, ("shell", {"command": f"echo result of turn {i}"}))
    return h


def live_turn_numbers(h: Harness) -> list[int]:
    return [int(m[1]) for t in h.context.turns if (m := re.match(r"Turn #(\d+)\n", t.content))]


def test_archive_one_range_removes_results_and_their_assistant_messages(
    counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    h = archived_harness(counter, tmp_path)
    prefix = h.context.to_messages()[:2]
    result = call(h, ("archive_thread", {"ranges": [[2, 3]]}))
    assert live_turn_numbers(h) == [1, 4, 5, 6, 7]
    calls = [c.arguments for t in h.context.turns for c in t.tool_calls]
    assert not any("turn 2" in a or "turn 3" in a for a in calls)  # the assistant messages went too
    assert "archived turn(s) 2-3 (2 result(s))" in result.observations[0]
    assert h.context.to_messages()[:2] == prefix
    (event,) = result.events
    assert (
        event["action"] == "archive_thread"
        and event["items_removed"] == 4
        and event["earliest_position"] == 2
    )


def test_archive_ranges_in_any_order_with_overlaps(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    h = archived_harness(counter, tmp_path)
    out = call(h, ("archive_thread", {"ranges": [[5, 6], [1, 2], [2, 2], [1, 1]]})).observations[0]
    assert live_turn_numbers(h) == [3, 4, 7]
    assert "archived turn(s) 1-2, 5-6 (4 result(s))" in out


def test_archive_refuses_a_reversed_range(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    h = archived_harness(counter, tmp_path)
    turns = h.context.turns
    result = call(h, ("archive_thread", {"ranges": [[1, 2], [5, 3]]}))
    assert "reversed range [5, 3]" in result.observations[0]
    assert result.receipts[0].kind == ReceiptKind.REJECTED and h.context.turns[: len(turns)] == turns


def test_archive_takes_at_most_32_ranges(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    h = archived_harness(counter, tmp_path, rounds=2)
    assert "rule format" in call(h, ("archive_thread", {"ranges": [[1, 1]] * 33})).receipts[0].text
    assert call(h, ("archive_thread", {"ranges": [[1, 1]] * 32})).receipts[0].applied
    assert "rule format" in call(h, ("archive_thread", {"ranges": []})).receipts[0].text


def test_archive_reports_the_turns_it_actually_emptied(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    h = archived_harness(counter, tmp_path)
    call(h, ("archive_thread", {"ranges": [[2, 3]]}))
    out = call(h, ("archive_thread", {"ranges": [[1, 3], [40, 50]]})).observations[0]
    assert "archived turn(s) 1 (1 result(s))" in out and "Not in the window: 2-3, 8 and later" in out
    nothing = call(h, ("archive_thread", {"ranges": [[2, 3]]}))
    assert nothing.receipts[0].kind == ReceiptKind.MATCHED_NOTHING and "2-3" in nothing.observations[0]


# --- search ----------------------------------------------------------------------------------------------


def test_search_is_case_insensitive_over_results_and_calls(
    counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    h = archived_harness(counter, tmp_path)
    call(h, ("archive_thread", {"ranges": [[1, 6]]}))
    out = call(h, ("search_archive", {"query": "RESULT OF TURN 4"})).observations[0]
    assert "1 matching entry" in out and "result of turn 4" in out
    by_call = call(h, ("search_archive", {"query": '"command"'})).observations[0]  # text of the tool call
    assert "6 matching entries" in by_call


def test_search_returns_at_most_8_entries(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    h = archived_harness(counter, tmp_path, rounds=11)
    call(h, ("archive_thread", {"ranges": [[1, 11]]}))
    out = call(h, ("search_archive", {"query": "result of turn"})).observations[0]
    assert "11 matching entries, the first 8 shown" in out
    assert len(re.findall(r"^#\d+ \(turn \d+\)", out, re.MULTILINE)) == 8


# --- turn headers ----------------------------------------------------------------------------------------


def test_turn_headers_number_from_one_and_survive_archiving(
    counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    h = archived_harness(counter, tmp_path, rounds=3)
    first = next(t for t in h.context.turns if t.role == "tool")
    header, _, rest = first.content.partition("----\n")
    assert header.splitlines()[0] == "Turn #1"
    # the turn's own size: "echo result of turn 1" as a tool message in the tiny tokenizer's ChatML
    assert header.splitlines()[1] == "18 tokens"
    assert rest.split("\n[context:")[0] == "echo result of turn 1"
    call(h, ("archive_thread", {"ranges": [[1, 2]]}))
    call(h, ("shell", {"command": "echo later"}))
    assert live_turn_numbers(h) == [3, 4, 5]  # never renumbered


def test_no_headers_and_no_archive_tools_without_the_archive_grant(
    counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    h = make(counter, tmp_path, archive=False)
    call(h, ("shell", {"command": "echo hi"}))
    assert not any(t.content.startswith("Turn #") for t in h.context.turns)
    # read_overflow stays: the compaction backstop's folds are restorable
    assert names(h) == ["shell", "read_file", "evict_file_view", "read_overflow", "submit"]
    assert "archive_thread" not in (block(h) or "")
    assert "rule format" in call(h, ("archive_thread", {"ranges": [[1, 1]]})).receipts[0].text
