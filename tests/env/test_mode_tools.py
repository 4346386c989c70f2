"""``tools`` mode (seed 000): handles, refusals, stubs, restore, notes, pins, offer rules and the offer note,
events."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from ctxrl.env import overflow
from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import ChatTemplateCounter, ToolCall
from ctxrl.env.episode import PromptBuilder
from ctxrl.env.harness import Action, Harness, StepResult
from ctxrl.env.mode_config import ModesConfig, ToolsModeConfig
from ctxrl.env.modes import ToolsMode, make_mode
from ctxrl.env.modes.tools import OFFER_HEADER
from ctxrl.env.overflow import STUB_RE
from ctxrl.env.receipts import ReceiptKind
from ctxrl.env.sandbox import CommandResult, SandboxConfig

SYSTEM = "You are an agent."
TASK = "Find the key and submit it."


class FakeRunner:
    """Runs nothing: ``emit N [tag]`` prints N characters of numbered lines; anything else echoes the command."""

    def __init__(self, workspace: Path, config: SandboxConfig) -> None:
        self.workspace = workspace

    def run(self, command: str) -> CommandResult:
        parts = command.split()
        if parts[0] == "emit":
            tag = parts[2] if len(parts) > 2 else "line"
            text = "".join(f"{tag} {i}: value {i * 7}\n" for i in range(int(parts[1])))[: int(parts[1])]
        else:
            text = command
        return CommandResult(command, 0, text, False, 0, 0.0)


def make(
    counter: ChatTemplateCounter,
    tmp_path: Path,
    task: str = TASK,
    *,
    modes: ModesConfig | None = None,
    **fields: Any,
) -> Harness:
    """A reset tools-mode harness whose context tools are offered from the start unless ``modes`` says otherwise."""
    modes = modes or ModesConfig(tools=ToolsModeConfig(with_pressure=False, offer_pct=0.0))
    cfg = HarnessConfig(modes=modes, sandbox=SandboxConfig(backend="none"), **fields)
    harness = Harness(cfg, counter, make_mode("tools", cfg), runner_factory=FakeRunner)
    harness.reset(SYSTEM, task, tmp_path / "ws")
    return harness


def sha256_hex(text: str) -> str:
    """The overflow store's content address, written from its contract (SHA-256 of the UTF-8 bytes, hex)
    rather than read from the code under test."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def call(harness: Harness, *calls: tuple[str, dict[str, Any]], text: str = "") -> StepResult:
    return harness.step(Action(text, tuple(ToolCall.make("", name, args) for name, args in calls)))


def tool_turn(harness: Harness, call_id: str) -> str:
    return next(t.content for t in harness.context.turns if t.tool_call_id == call_id)


def after_tag(text: str, handle: str) -> str:
    """``text`` without its first line, which must be the result's handle tag ``[handle]``."""
    first, rest = text.split("\n", 1)
    assert first == f"[{handle}]", text[:40]
    return rest


def names(harness: Harness) -> list[str]:
    return [t["function"]["name"] for t in harness.tools]


def offered(harness: Harness) -> bool:
    mode = harness.mode
    assert isinstance(mode, ToolsMode)
    return mode.offered


def notes_announcing(harness: Harness) -> list[str]:
    """The user turns in context that hold the offer note."""
    return [t.content for t in harness.context.turns if t.role == "user" and OFFER_HEADER in t.content]


@pytest.fixture
def h(counter: ChatTemplateCounter, tmp_path: Path) -> Harness:
    return make(counter, tmp_path)


# --- handles ---------------------------------------------------------------------------------------------


def test_drop_by_call_id_leaves_the_standard_stub(h: Harness) -> None:
    call(h, ("shell", {"command": "emit 3000"}))
    body = tool_turn(h, "call_1_0")
    before = h.context.tokens
    result = call(h, ("context_drop", {"handles": ["call_1_0"]}))
    stub = tool_turn(h, "call_1_0")
    match = STUB_RE.fullmatch(stub)
    assert match is not None, stub
    assert len(match["id"]) == 8 and sha256_hex(body).startswith(match["id"])  # the one id: 8 digits do
    assert (match["tool"], match["call_id"], match["storage"]) == ("shell", "call_1_0", "disk")
    assert int(match["bytes"]) == len(body.encode())
    assert result.receipts[0].kind == ReceiptKind.APPLIED
    assert h.context.tokens < before


def test_round_handles_name_one_result_or_the_whole_round(
    counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    one = make(counter, tmp_path / "a")
    call(one, ("shell", {"command": "emit 900 a"}), ("shell", {"command": "emit 900 b"}))
    call(one, ("context_drop", {"handles": ["r1.2"]}))
    assert not STUB_RE.match(tool_turn(one, "call_1_0"))
    assert STUB_RE.match(tool_turn(one, "call_1_1"))

    whole = make(counter, tmp_path / "b")
    call(whole, ("shell", {"command": "emit 900 a"}), ("shell", {"command": "emit 900 b"}))
    call(whole, ("context_drop", {"handles": ["r1"]}))
    assert STUB_RE.match(tool_turn(whole, "call_1_0")) and STUB_RE.match(tool_turn(whole, "call_1_1"))


def test_message_handle_names_a_message_without_a_call_id(h: Harness) -> None:
    h.step(Action("thinking out loud, no tool call"))  # the harness answers with a user note
    note = h.context.turns[-1]
    assert note.role == "user"
    # the handle from its contract: "m" + the first 8 hex digits of SHA-256 of "role\ncontent"
    handle = "m" + hashlib.sha256(f"user\n{note.content}".encode()).hexdigest()[:8]
    call(h, ("context_drop", {"handles": [handle]}))
    stub = h.context.turns[1].content
    match = STUB_RE.match(stub)
    assert match is not None and (match["tool"], match["call_id"]) == ("-", "-")


def test_unknown_handle_matches_nothing(h: Harness) -> None:
    result = call(h, ("context_drop", {"handles": ["call_99_0", "r42", "m00000000"]}))
    assert result.receipts[0].kind == ReceiptKind.MATCHED_NOTHING
    assert result.observations[0].count("no message in the context has this handle") == 3


# --- refusals --------------------------------------------------------------------------------------------


def test_refuses_a_pinned_item(h: Harness) -> None:
    call(h, ("shell", {"command": "emit 2000"}))
    call(h, ("context_pin", {"handles": ["call_1_0"]}))
    result = call(h, ("context_drop", {"handles": ["call_1_0"]}))
    assert "refused, pinned (unpin it first)" in result.observations[0]
    assert result.receipts[0].kind == ReceiptKind.REJECTED and "rule pinned" in result.receipts[0].text
    assert not STUB_RE.match(tool_turn(h, "call_1_0"))


def test_refuses_an_item_that_is_already_a_stub(h: Harness) -> None:
    call(h, ("shell", {"command": "emit 2000"}))
    call(h, ("context_drop", {"handles": ["call_1_0"]}))
    stub = tool_turn(h, "call_1_0")
    result = call(h, ("context_note", {"handles": ["call_1_0"], "note": "x"}))
    assert "refused, already an overflow stub" in result.observations[0]
    assert tool_turn(h, "call_1_0") == stub


def test_drop_refuses_a_pending_approval_and_note_keeps_it(h: Harness) -> None:
    call(h, ("shell", {"command": "echo request filed approval_id=ap-77 waiting"}))
    refused = call(h, ("context_drop", {"handles": ["call_1_0"]}))
    assert "pending approval id ap-77" in refused.observations[0]
    assert refused.receipts[0].kind == ReceiptKind.REJECTED
    noted = call(h, ("context_note", {"handles": ["call_1_0"], "note": "request filed"}))
    assert noted.receipts[0].applied
    assert "approval_id=ap-77" in tool_turn(h, "call_1_0")


def test_an_approval_the_model_used_is_no_longer_pending(h: Harness) -> None:
    call(h, ("shell", {"command": "echo request filed approval_id=ap-77 waiting"}))
    call(h, ("shell", {"command": "echo approve ap-77"}))
    assert call(h, ("context_drop", {"handles": ["call_1_0"]})).receipts[0].applied


def test_refuses_the_models_own_message(h: Harness) -> None:
    call(h, ("shell", {"command": "echo hi"}), text="my plan")
    mine = next(t for t in h.context.turns if t.role == "assistant")
    handle = "m" + hashlib.sha256(f"assistant\n{mine.content}".encode()).hexdigest()[:8]
    result = call(h, ("context_drop", {"handles": [handle]}))
    assert "refused, your own message" in result.observations[0]


# --- overflow store --------------------------------------------------------------------------------------


def test_read_overflow_restores_the_body_exactly(h: Harness) -> None:
    call(h, ("shell", {"command": "emit 2500"}))
    body = tool_turn(h, "call_1_0")
    call(h, ("context_drop", {"handles": ["call_1_0"]}))
    oid = sha256_hex(body)
    assert after_tag(call(h, ("read_overflow", {"id": oid})).observations[0], "r3.1").startswith(body)
    assert after_tag(call(h, ("read_overflow", {"id": oid[:10]})).observations[0], "r4.1").startswith(body)
    workspace = h._live().workspace
    stored = workspace.parent / f"{workspace.name}.overflow" / f"{oid}.txt"
    assert stored.read_text() == body  # outside the workspace: no command can reach it
    assert not any(p.name.endswith(".txt") for p in workspace.rglob("*"))


def test_memory_only_stubs_say_the_body_cannot_be_restored(
    counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    h = make(
        counter,
        tmp_path,
        modes=ModesConfig(tools=ToolsModeConfig(with_pressure=False, offer_pct=0.0), storage="memory-only"),
    )
    call(h, ("shell", {"command": "emit 2000"}))
    body = tool_turn(h, "call_1_0")
    call(h, ("context_drop", {"handles": ["call_1_0"]}))
    stub = tool_turn(h, "call_1_0")
    assert "storage=memory-only" in stub and "cannot be restored" in stub
    assert not (tmp_path / "ws.overflow").exists()
    out = call(h, ("read_overflow", {"id": sha256_hex(body)})).observations[0]
    assert "cannot be restored" in out and body not in out


# --- notes -----------------------------------------------------------------------------------------------


def test_note_layout(h: Harness) -> None:
    call(h, ("shell", {"command": "echo build 3b1c9f2a7d ok " + "x" * 800}))
    call(h, ("shell", {"command": "echo wrote src/app/main.py " + "y" * 800}))
    call(h, ("shell", {"command": "echo ticket approval_id=ap-9 " + "z" * 800}))
    originals = [tool_turn(h, f"call_{i}_0") for i in (1, 2, 3)]
    result = call(
        h, ("context_note", {"handles": ["call_3_0", "call_1_0", "call_2_0"], "note": "built, wrote, filed"})
    )
    assert result.receipts[0].applied
    note = tool_turn(h, "call_1_0")  # the first item in context order holds the note
    lines = note.splitlines()
    assert lines[0] == "[note] built, wrote, filed"
    stub_ids = [STUB_RE.fullmatch(line)["id"] for line in lines[1:4]]  # type: ignore[index]
    assert [len(i) for i in stub_ids] == [8, 8, 8]
    assert all(sha256_hex(o).startswith(i) for o, i in zip(originals, stub_ids))
    assert lines[4] == "Preserved (compaction-safe):"
    assert {"- 3b1c9f2a7d", "- src/app/main.py", "- approval_id=ap-9"} <= set(lines[5:])
    for i in (2, 3):
        other = tool_turn(h, f"call_{i}_0")
        assert "\n" not in other and STUB_RE.match(other)
        assert other.endswith("(summarised in the note at r1.1)")  # the handle the model sees
    for k, (o, short) in enumerate(zip(originals, stub_ids)):
        assert after_tag(call(h, ("read_overflow", {"id": short})).observations[0], f"r{5 + k}.1").startswith(
            o
        )


def test_note_longer_than_4000_characters_gets_a_format_receipt(h: Harness) -> None:
    call(h, ("shell", {"command": "emit 900"}))
    result = call(h, ("context_note", {"handles": ["call_1_0"], "note": "n" * 4001}))
    assert result.receipts[0].kind == ReceiptKind.REJECTED and "rule format" in result.receipts[0].text
    assert not STUB_RE.match(tool_turn(h, "call_1_0"))


# --- pins ------------------------------------------------------------------------------------------------


def test_pin_cap_and_unpin_all(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    h = make(
        counter,
        tmp_path,
        modes=ModesConfig(tools=ToolsModeConfig(with_pressure=False, offer_pct=0.0, max_pins=2)),
    )
    call(h, *[("shell", {"command": f"echo result number {i}"}) for i in range(3)])
    result = call(h, ("context_pin", {"handles": ["r1.1", "r1.2", "r1.3"]}))
    assert "pin cap is reached (2/2)" in result.observations[0]
    mode = h.mode
    assert isinstance(mode, ToolsMode)
    assert [mode.is_pinned(t) for t in h.context.turns if t.role == "tool"][:3] == [True, True, False]
    out = call(h, ("context_unpin", {"all": True})).observations[0]
    assert "removed all 2 model pin(s)" in out
    assert not any(mode.is_pinned(t) for t in h.context.turns)


def test_pin_by_snippet_needs_exactly_one_match_of_12_characters(h: Harness) -> None:
    call(
        h,
        ("shell", {"command": "echo the unique marker QX-4411 here"}),
        ("shell", {"command": "echo common words"}),
    )
    call(h, ("shell", {"command": "echo common words"}))
    mode = h.mode
    assert isinstance(mode, ToolsMode)
    ok = call(h, ("context_pin", {"snippet": "marker QX-4411"}))
    assert ok.receipts[0].applied and mode.is_pinned(
        next(t for t in h.context.turns if t.tool_call_id == "call_1_0")
    )
    ambiguous = call(h, ("context_pin", {"snippet": "echo common words"}))
    assert "matches 2 messages" in ambiguous.observations[0]
    short = call(h, ("context_pin", {"snippet": "QX-4411"}))
    assert "rule format" in short.receipts[0].text


# --- status ----------------------------------------------------------------------------------------------


def test_status_lists_the_largest_results_with_handles(h: Harness) -> None:
    call(h, ("shell", {"command": "emit 400"}), ("shell", {"command": "emit 3000"}))
    call(h, ("context_pin", {"handles": ["call_1_0"]}))
    out = after_tag(call(h, ("context_status", {"top": 1})).observations[0], "r3.1")
    assert out.startswith("[context_status] ")
    assert "Largest results in context (top 1):\n- r1.2 (shell):" in out
    assert (
        "tokens | line 0: value 0\n" in out
    )  # the preview is the first line of the output, not the handle tag
    assert "r1.1 (shell)" not in out.split("Pinned:")[0]
    assert "Pinned: r1.1 (shell)" in out and "Model pins: 1/20" in out
    assert "rule format" in call(h, ("context_status", {"top": 31})).receipts[0].text


# --- offer rules and the reminder ------------------------------------------------------------------------


def test_offered_from_the_offer_round_and_then_stay_offered(
    counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    h = make(
        counter,
        tmp_path,
        modes=ModesConfig(tools=ToolsModeConfig(with_pressure=False, offer_pct=1.0, offer_round=3)),
    )
    call(h, ("shell", {"command": "echo 1"}))
    assert not offered(h) and notes_announcing(h) == []
    second = call(h, ("shell", {"command": "echo 2"}))  # the coming round is 3
    assert offered(h) and len(notes_announcing(h)) == 1
    assert second.observations[-1] == h.context.turns[-1].content  # the note is this step's own observation
    assert "context_drop" not in names(h)  # announced by the note; the tool list is the one of reset
    for i in range(3):
        call(h, ("shell", {"command": f"echo {i}"}))
    assert offered(h) and len(notes_announcing(h)) == 1  # stays offered, announced once
    assert call(h, ("context_drop", {"handles": ["r1.1"]})).receipts[0].applied


def test_offer_round_zero_means_usage_only(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    h = make(
        counter,
        tmp_path,
        modes=ModesConfig(tools=ToolsModeConfig(with_pressure=False, offer_pct=0.2, offer_round=0)),
        budget=16000,
    )
    for i in range(3):
        call(h, ("shell", {"command": f"echo {i}"}))
    assert not offered(h)
    call(h, ("shell", {"command": "emit 8000"}))  # about 4,000 tokens: over 20 % of the 13,952 limit
    assert offered(h)
    call(h, ("context_drop", {"handles": ["r4.1"]}))  # usage falls again; the offer stays
    assert h.context.tokens < 0.2 * h.config.limit and offered(h)


@pytest.mark.parametrize(
    "task", ["Please free up your context first.", "Mind the context window.", "Use context_status often."]
)
def test_offered_when_the_user_asks(counter: ChatTemplateCounter, tmp_path: Path, task: str) -> None:
    h = make(
        counter,
        tmp_path,
        task,
        modes=ModesConfig(tools=ToolsModeConfig(with_pressure=False, offer_pct=1.0, offer_round=0)),
    )
    assert offered(h) and "context_note" in names(h)  # offered at reset: listed in the first prompt
    other = make(
        counter,
        tmp_path / "b",
        modes=ModesConfig(tools=ToolsModeConfig(with_pressure=False, offer_pct=1.0, offer_round=0)),
    )
    assert not offered(other) and "context_note" not in names(other)


def test_reminder_at_the_soft_ceiling_once_per_episode(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    h = make(counter, tmp_path, budget=8000, rollback=True)  # rollback: the episode goes on past the limit
    first = call(h, ("shell", {"command": "emit 11000"}))  # past 80 % of the limit
    assert any(o.startswith("[context] The context is at") for o in first.observations)
    call(h, ("context_drop", {"handles": ["call_1_0"]}))
    again = call(h, ("shell", {"command": "emit 11000"}))
    assert not any("The context is at" in o for o in again.observations)


def test_disabled_tools_are_never_offered_and_refused(counter: ChatTemplateCounter, tmp_path: Path) -> None:
    h = make(
        counter,
        tmp_path,
        "free up your context",
        modes=ModesConfig(tools=ToolsModeConfig(with_pressure=False, enabled=False)),
    )
    assert names(h) == ["shell", "read_overflow", "submit"]
    result = call(h, ("context_status", {}))
    assert result.receipts[0].kind == ReceiptKind.REJECTED and "disabled" in result.observations[0]


# --- events ----------------------------------------------------------------------------------------------


def test_every_context_tool_call_records_a_context_op_event(h: Harness) -> None:
    call(h, ("shell", {"command": "emit 3000"}))
    result = call(h, ("context_drop", {"handles": ["call_1_0"]}), ("context_status", {}))
    drop, status = result.events
    assert set(drop) == {"type", "round", "op", "ok", "handles", "tokens_freed", "overflow_ids"}
    assert (drop["type"], drop["round"], drop["op"], drop["ok"], drop["handles"]) == (
        "context_op",
        2,
        "drop",
        True,
        ["call_1_0"],
    )
    assert drop["tokens_freed"] > 1000 and len(drop["overflow_ids"][0]) == 64
    assert status["op"] == "status"
    assert result.metrics()["harness/context_ops"] == 2.0
    assert result.metrics()["harness/tokens_freed"] == drop["tokens_freed"]
    json.dumps(result.events)  # plain data, loggable as is


def test_context_tools_are_refused_before_they_are_offered(
    counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    """Seed 000: the context tools exist only once offered; a call before that is refused with a receipt
    and changes nothing (no stub, no pin, no overflow body); once offered, the same call applies."""
    late = ModesConfig(tools=ToolsModeConfig(with_pressure=False, offer_pct=1.0, offer_round=4))
    harness = make(counter, tmp_path, modes=late)
    call(harness, ("shell", {"command": "emit 800 big"}))
    before, tokens = list(harness.context.turns), harness.context.tokens
    result = call(
        harness,
        ("context_drop", {"handles": ["r1.1"]}),
        ("context_note", {"handles": ["r1.1"], "note": "big"}),
        ("context_pin", {"handles": ["r1.1"]}),
        ("context_status", {}),
    )
    assert [r.kind for r in result.receipts] == [ReceiptKind.REJECTED] * 4  # one receipt per call
    assert all("rejected by rule not_offered" in r.text for r in result.receipts)
    assert all("not offered yet" in o for o in result.observations[:4])
    assert list(harness.context.turns[: len(before)]) == before  # nothing was dropped, noted or rewritten
    assert [(r.before, r.after) for r in result.receipts] == [(tokens, tokens)] * 4
    mode = harness.mode
    assert isinstance(mode, ToolsMode) and not any(mode.is_pinned(t) for t in harness.context.turns)
    assert not (tmp_path / "ws.overflow").exists()  # no body went to the overflow store
    assert [(e["op"], e["ok"]) for e in result.events] == [
        ("drop", False),
        ("note", False),
        ("pin", False),
        ("status", False),
    ]
    call(harness, ("shell", {"command": "echo 3"}))  # the coming round is 4: offered
    assert offered(harness)
    assert call(harness, ("context_drop", {"handles": ["r1.1"]})).receipts[0].applied
    assert STUB_RE.match(tool_turn(harness, "call_1_0"))


# --- the offer note keeps the prompt's prefix ------------------------------------------------------------

LATE = ModesConfig(tools=ToolsModeConfig(with_pressure=False, offer_pct=1.0, offer_round=3))


def test_an_offer_mid_episode_keeps_the_prompt_a_prefix(
    counter: ChatTemplateCounter, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    """The prompt ids before the offer are an exact prefix of the prompt ids after it: the tool list (and so
    the system message) is the one of reset, and the tools are announced by an appended note."""
    builder = PromptBuilder(tiny_tokenizer)
    h = make(counter, tmp_path, modes=LATE)
    prompts = [builder.full(h.context.to_messages(), h.tools)]
    for i in range(4):  # the offer comes after the second step
        call(h, ("shell", {"command": f"echo {i}"}))
        prompts.append(builder.full(h.context.to_messages(), h.tools))
    assert offered(h)
    for before, after in itertools.pairwise(prompts):
        assert after[: len(before)] == before
    system = builder.render(h.context.to_messages()[:1], h.tools)
    assert "context_drop" not in system and "context_drop" in builder.decode(prompts[-1])


def test_the_offer_note_lists_every_context_tool_with_its_signature(
    counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    h = make(counter, tmp_path, modes=LATE)
    call(h, ("shell", {"command": "echo 1"}))
    call(h, ("shell", {"command": "echo 2"}))
    (note,) = notes_announcing(h)
    lines = note.splitlines()
    assert lines[0] == "[context tools] offered from now on; call them like your other tools:"
    assert [line.split(":")[0] for line in lines[1:6]] == [
        "- context_status(top?)",
        "- context_pin(handles?, snippet?)",
        "- context_unpin(handles?, snippet?, all?)",
        "- context_drop(handles)",
        "- context_note(handles, note)",
    ]
    assert lines[6].startswith("Handles: the [r<round>.<i>] atop each result; r<round> for all results")
    assert len(lines) == 7 and len(note) < 800  # the schemas it replaces are about 2,400 characters
    mode = h.mode
    assert isinstance(mode, ToolsMode)
    assert mode.is_pinned(next(t for t in h.context.turns if t.content == note))  # the pressure pass skips it


def test_offer_from_start_lists_the_schemas_in_the_first_prompt(
    counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    start = ModesConfig(tools=ToolsModeConfig(with_pressure=False, offer_pct=1.0, offer_from_start=True))
    h = make(counter, tmp_path, modes=start)
    assert offered(h)
    assert names(h) == [
        "shell",
        "read_overflow",
        "context_status",
        "context_pin",
        "context_unpin",
        "context_drop",
        "context_note",
        "submit",
    ]
    for i in range(3):
        call(h, ("shell", {"command": f"echo {i}"}))
    assert notes_announcing(h) == []  # listed from the start: no note


def test_the_offer_note_comes_back_after_a_rollback_but_not_after_the_model_drops_it(
    counter: ChatTemplateCounter, tmp_path: Path
) -> None:
    usage = ModesConfig(tools=ToolsModeConfig(with_pressure=False, offer_pct=0.3, offer_round=0))
    h = make(counter, tmp_path, modes=usage, budget=8000, rollback=True)  # a run that turns rollback on
    first = call(h, ("shell", {"command": "emit 20000"}))  # offered (past 30 %) and over the limit
    assert offered(h) and first.rolled_back_turns > 0
    assert notes_announcing(h) == []  # the rollback took the note with the output
    call(h, ("shell", {"command": "echo small"}))
    (note,) = notes_announcing(h)
    turn = next(t for t in h.context.turns if t.content == note)
    handle = "m" + hashlib.sha256(f"user\n{turn.content}".encode()).hexdigest()[:8]
    assert call(h, ("context_drop", {"handles": [handle]})).receipts[0].applied
    call(h, ("shell", {"command": "echo after"}))
    assert notes_announcing(h) == []  # the model's own choice stands


# --- handles the model can see ----------------------------------------------------------------------------


def test_every_result_starts_with_its_handle_and_the_handle_names_it(h: Harness) -> None:
    call(h, ("shell", {"command": "echo alpha"}), ("shell", {"command": "echo beta"}))
    call(h, ("shell", {"command": "emit 900 gamma"}))
    results = [t.content for t in h.context.turns if t.role == "tool"]
    assert [r.split("\n", 1)[0] for r in results] == ["[r1.1]", "[r1.2]", "[r2.1]"]
    assert after_tag(results[1], "r1.2").startswith("echo beta")
    dropped = call(h, ("context_drop", {"handles": ["[r2.1]"]}))  # the tag as shown, brackets and all
    assert dropped.receipts[0].applied and STUB_RE.match(tool_turn(h, "call_2_0"))
    assert (
        after_tag(dropped.observations[0], "r3.1")
        .splitlines()[1]
        .startswith("- [r2.1]: dropped, overflow id ")
    )


def test_a_stub_shows_a_short_id_that_read_overflow_restores(h: Harness) -> None:
    call(h, ("shell", {"command": "emit 2500"}))
    body = tool_turn(h, "call_1_0")
    drop = call(h, ("context_drop", {"handles": ["r1.1"]}))
    match = STUB_RE.fullmatch(tool_turn(h, "call_1_0"))
    assert match is not None
    short = match["id"]
    assert 8 <= len(short) <= 12 and all(c in "0123456789abcdef" for c in short)
    assert f"overflow id {short}\n" in drop.observations[0]  # the drop's result names the same short id
    restored = call(h, ("read_overflow", {"id": short})).observations[0]
    assert after_tag(restored, "r3.1").startswith(body)


def test_short_ids_stay_unique_and_restorable_when_ids_share_a_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bodies whose ids share their first 8 (then 9) hex digits: each stub's id is the shortest prefix no
    other id had when it was stored, and every stub's id still restores its own body afterwards."""
    ids = {
        "first": "abcdef01" + "0" * 56,
        "second": "abcdef01" + "1" * 56,
        "third": "abcdef011" + "2" * 55,
    }
    monkeypatch.setattr(overflow, "body_id", lambda body: ids[body])
    store = overflow.OverflowStore(tmp_path / "store")
    stubs = {body: store.stub(body, "shell", "c1") for body in ids}
    shown = {body: STUB_RE.fullmatch(stub)["id"] for body, stub in stubs.items()}  # type: ignore[index]
    assert shown == {"first": "abcdef01", "second": "abcdef011", "third": "abcdef0112"}
    for body, short in shown.items():
        assert store.get(short) == body
    assert store.get("abcdef0111") == "second" and store.get(ids["third"]) == "third"
