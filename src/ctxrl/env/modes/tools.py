"""``tools`` mode (seed 000): the model manages its context through five fixed context tools.

Tools: ``shell``, ``read_overflow`` always; once offered, ``context_status``, ``context_pin``,
``context_unpin``, ``context_drop`` and ``context_note``.

**Handles** (how a call names a message of the editable region):

- ``r<round>.<i>``: the i-th result (1-based) of round ``round`` (the harness step that made the calls);
  ``r<round>``: every result of that round still in the context. Every tool result starts with its handle,
  ``[r<round>.<i>]`` on a line of its own, so the model sees it (the chat template renders no call ids:
  this is seed 000's fenced-call route); brackets around a handle are accepted;
- a tool result's ``tool_call_id`` (``call_…``, or the model's own id): that result (shown as ``call_id=``
  in a stub);
- ``m<8 hex>``: any message, by the first 8 hex digits of SHA-256 of ``"<role>\\n<content>"``. This is how a
  message without a call id (a harness note, a result whose call was removed) is named. The handle changes
  when the message does (a merge, a stub).

``context_pin`` / ``context_unpin`` also take ``snippet``: at least 12 characters that occur in exactly one
message of the editable region (the pinned prefix is never folded or spilled anyway); that message is
pinned whatever its role. A pin is keyed by the call id of a result, else by the message's ``m`` handle.

**Refusals** (the reason is in the result): a pinned item (unpin first), an item that is already an overflow
stub, your own assistant message, and for ``context_drop`` a result carrying a pending approval id. An
approval id is ``approval_id=<id>`` (or ``approval id: <id>``) in the text; it is pending while no later
assistant message of yours mentions the id. ``context_note`` keeps such ids in its preserved block instead.

**Offer rules** (re-checked after every step; once offered, the tools stay offered for the episode):
usage ≥ ``offer_pct`` of the limit, or the coming round ≥ ``offer_round`` (when > 0), or the user asked:
the task prompt (the user's only message in an episode) names a context tool or says "free up your
context", "context window", "libera el contexto" or "ventana de contexto"; or ``offer_from_start``. The
seed's "turn" is our episode, so the reminder at the soft ceiling (``modes.pressure.compact_pct``) is one
user note per episode. A call to a context tool before the offer is refused (rule ``not_offered``) and
changes nothing.

**How the offer is announced.** Tools offered at reset (``offer_from_start``, or the user asked) are listed
with their schemas in the first prompt. Tools offered mid-episode are announced by one user note
(:func:`offer_note`: one line per tool, its signature and what it does, and the handle forms) while the
tool list stays as it was at reset, so the prompt so far stays a prefix of the next one (listing the
schemas would rewrite the system message, about 2.4k characters, and every token after it). The note is
kept out of the pressure pass's reach while it stands alone (:meth:`ToolsMode.is_pinned`); whenever the
whole note is no longer in the context (a rollback or a fold took it), it is appended again, unless the
model itself dropped or noted it.

Every context tool call records an event ``{"type": "context_op", "round", "op", "ok", "handles",
"tokens_freed", "overflow_ids"}``; an edit (pin, unpin, drop, note) gets one receipt.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ctxrl.env.budget import BudgetFeatures, Means
from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import ToolCall, Turn
from ctxrl.env.mode_config import ModesConfig
from ctxrl.env.modes.base import CallOutcome, Episode, Mode, StepNotes
from ctxrl.env.modes.common import (
    READ_OVERFLOW_TOOL,
    SHELL_TOOL,
    Schema,
    Shared,
    format_outcome,
    function_schema,
    gated_replace,
    parse_arguments,
    read_overflow,
    run_shell,
    unknown_tool,
)
from ctxrl.env.modes.pressure import PressurePass
from ctxrl.env.overflow import STUB_RE, body_id, extract_identifiers, is_stub, preserved_block
from ctxrl.env.receipts import Receipt, ReceiptKind

NOTE_MAX_CHARS = 4000
SNIPPET_MIN_CHARS = 12
ASK_PHRASES = ("free up your context", "context window", "libera el contexto", "ventana de contexto")
REMINDER = (
    "[context] The context is at {percent}% of the window. context_status shows what fills it; "
    "context_drop and context_note free room (read_overflow brings a body back)."
)
APPROVAL_RE = re.compile(r"\bapproval[_ -]?id\s*[=:]\s*([\w.-]+)", re.IGNORECASE)
_ROUND_HANDLE = re.compile(r"r(\d+)(?:\.(\d+))?")
RESULT_TAG = "[r{round}.{index}]"
"""The first line of every tool result: its handle."""
RESULT_TAG_RE = re.compile(r"\A\[(r\d+\.\d+)\]\n")
OFFER_HEADER = "[context tools] offered from now on"
_OFFERED_LINE = re.compile(r"^- (context_[a-z]+)\(", re.MULTILINE)
_MESSAGE_HANDLE = re.compile(r"m[0-9a-f]{8}")

REFUSED_PINNED = "pinned (unpin it first)"
REFUSED_STUB = "already an overflow stub"
REFUSED_OWN = "your own message (assistant messages are never dropped)"
REFUSED_APPROVAL = "carries the pending approval id {id} (context_note keeps it)"
UNKNOWN_HANDLE = "no message in the context has this handle"

_HANDLES = {
    "type": "array",
    "items": {"type": "string"},
    "minItems": 1,
    "maxItems": 64,
    "description": "handles: a result's call id, r<round>.<i>, r<round>, or m<8 hex> for a whole message",
}
_SNIPPET = {
    "type": "string",
    "minLength": SNIPPET_MIN_CHARS,
    "description": "at least 12 characters that appear in exactly one message",
}
CONTEXT_TOOLS: dict[str, Schema] = {
    "context_status": function_schema(
        "context_status",
        "Show how full the context is, its largest results with their handles, pins and spilled results.",
        {
            "top": {
                "type": "integer",
                "minimum": 1,
                "maximum": 30,
                "description": "results to list (default 8)",
            }
        },
    ),
    "context_pin": function_schema(
        "context_pin",
        "Pin messages so the harness never spills or folds them.",
        {"handles": _HANDLES, "snippet": _SNIPPET},
    ),
    "context_unpin": function_schema(
        "context_unpin",
        "Remove pins you set (all=true removes every one).",
        {"handles": _HANDLES, "snippet": _SNIPPET, "all": {"type": "boolean"}},
    ),
    "context_drop": function_schema(
        "context_drop",
        "Move results out of the context into the overflow store; each leaves a stub read_overflow restores.",
        {"handles": _HANDLES},
        ["handles"],
    ),
    "context_note": function_schema(
        "context_note",
        "Replace results by one note of yours: the originals go to overflow, the note keeps a stub line for "
        "each and the identifiers found in them.",
        {
            "handles": _HANDLES,
            "note": {
                "type": "string",
                "minLength": 1,
                "maxLength": NOTE_MAX_CHARS,
                "description": "your note",
            },
        },
        ["handles", "note"],
    ),
}


def signature(schema: Schema) -> str:
    """A tool's compact call signature, optional arguments marked ``?``: ``context_note(handles, note)``."""
    fn = schema["function"]
    params = fn["parameters"]
    args = [k if k in params["required"] else f"{k}?" for k in params["properties"]]
    return f"{fn['name']}({', '.join(args)})"


OFFER_SUMMARIES = {
    "context_status": "how full the context is; the largest results, pins and spilled ids",
    "context_pin": "keep messages from being spilled or folded",
    "context_unpin": "remove your pins (all=true: every one)",
    "context_drop": "move results to overflow; each leaves a stub that read_overflow restores",
    "context_note": f"replace results by your note (at most {NOTE_MAX_CHARS} characters); originals go to overflow",
}
"""What each context tool does, in the offer note (the schemas' descriptions are longer)."""


def offer_note() -> str:
    """The note that announces the context tools mid-episode (see the module docstring): one line per tool,
    its signature and what it does, then the handle forms."""
    lines = [f"{OFFER_HEADER}; call them like your other tools:"]
    lines += [f"- {signature(CONTEXT_TOOLS[name])}: {what}" for name, what in OFFER_SUMMARIES.items()]
    lines.append(
        "Handles: the [r<round>.<i>] atop each result; r<round> for all results of a round; "
        "m<8 hex> from context_status."
    )
    return "\n".join(lines)


OFFER_NOTE = offer_note()


def announced_tools(text: str) -> list[str]:
    """The context tools an offer note in ``text`` announces (empty when ``text`` holds none)."""
    if OFFER_HEADER not in text:
        return []
    start = text.index(OFFER_HEADER)
    return [name for name in _OFFERED_LINE.findall(text[start:]) if name in CONTEXT_TOOLS]


def message_handle(turn: Turn) -> str:
    """The ``m<8 hex>`` handle of a message."""
    return "m" + hashlib.sha256(f"{turn.role}\n{turn.content}".encode()).hexdigest()[:8]


def pin_key(turn: Turn) -> str:
    """What a pin holds on to: a result's call id, else the message handle."""
    return turn.tool_call_id if turn.role == "tool" and turn.tool_call_id else message_handle(turn)


@dataclass
class ToolsState:
    shared: Shared
    pins: dict[str, None] = field(default_factory=dict)
    """Model pins, in the order set."""
    offered: bool = False
    listed: bool = False
    """The context tools' schemas are in the tool list (offered at reset); else an offer note announces them."""
    note_removed: bool = False
    """The model dropped or noted the offer note itself: it is not appended again."""
    reminded: bool = False


class ToolsMode(Mode):
    """Action-based context tools; see the module docstring for handles, refusals and offer rules."""

    name = "tools"
    budget = BudgetFeatures(readout=False, nudges=False, rollback=False, pressure="default")
    """Seed 000: no readout or tier nudges (``context_status`` reports usage; one reminder at the soft
    ceiling); the pressure pass underneath is the backstop, not a rollback."""

    def __init__(self, config: ModesConfig, pressure: PressurePass | None = None) -> None:
        self.config = config
        self.pressure = pressure
        self._state: ToolsState | None = None

    # --- hooks -------------------------------------------------------------------------------------------

    def begin_episode(self, episode: Episode) -> None:
        self._state = ToolsState(Shared.begin(episode, self.config))
        self._update_offer(episode)
        self._state.listed = self._state.offered

    def state(self, episode: Episode) -> ToolsState:
        """This episode's state (a new one when the harness moved to a new episode)."""
        if self._state is None or self._state.shared.episode is not episode:
            self.begin_episode(episode)
        assert self._state is not None
        return self._state

    def is_pinned(self, turn: Turn) -> bool:
        """Pinned for the pressure pass: a model pin, or a user turn that starts with the offer note (the tools'
        description). Once a fold summary is merged in front of the note, the turn is no longer pinned, so
        fold summaries never pile up in it; if a fold then takes the note, :meth:`after_step` appends it
        again."""
        if self._state is None:
            return False
        return pin_key(turn) in self._state.pins or (
            turn.role == "user" and turn.content.startswith(OFFER_NOTE)
        )

    def after_step(self, episode: Episode, ending: bool) -> StepNotes:
        state = self.state(episode)
        shared = state.shared
        shared.rounds.advance()
        edited = False
        if self.pressure is not None and not ending:
            result = self.pressure.apply(episode, shared.store, self.is_pinned)
            if result.changed:
                shared.events.append(result.event(shared.rounds.current - 1))
                edited = True
        self._update_offer(episode)
        notes: tuple[str, ...] = ()
        cfg, ctx = episode.config, episode.context
        announce = state.offered and not state.listed and not state.note_removed and not ending
        if announce and not _holds_offer_note(ctx.turns):
            notes += (OFFER_NOTE,)
        ceiling = self.config.pressure.compact_pct * cfg.limit
        if state.offered and not state.reminded and not ending and ctx.tokens >= ceiling:
            state.reminded = True
            notes += (REMINDER.format(percent=int(100 * ctx.tokens / cfg.limit)),)
        return StepNotes(notes, shared.drain_events(), edited)

    def _update_offer(self, episode: Episode) -> None:
        state, tcfg = self._state, self.config.tools
        if state is None or state.offered or not tcfg.enabled:
            return
        ctx, limit = episode.context, episode.config.limit
        by_usage = ctx.tokens >= tcfg.offer_pct * limit
        by_round = tcfg.offer_round > 0 and state.shared.rounds.current >= tcfg.offer_round
        state.offered = tcfg.offer_from_start or by_usage or by_round or user_asked(ctx.task)

    def means(self, config: HarnessConfig) -> Means:
        return Means(
            tidy="free settled results with one context_note or context_drop naming several handles",
            compact="Replace settled results (finished work, outputs already used) with one context_note, or "
            "context_drop them, in one call naming several handles; pin what you still need.",
            compact_now="Drop or note settled results now (context_drop, context_note).",
            condense="Drop or note settled results (context_drop, context_note)",
        )

    @property
    def offered(self) -> bool:
        return self._state is not None and self._state.offered

    # --- tools -------------------------------------------------------------------------------------------

    def tool_schemas(self, config: HarnessConfig) -> list[dict[str, Any]]:
        """The tool list: the context tools' schemas only when they were offered at reset (see the module
        docstring); a later offer leaves the list, and so the system message, unchanged."""
        tools = [SHELL_TOOL, READ_OVERFLOW_TOOL]
        if self._state is not None and self._state.listed:
            tools += list(CONTEXT_TOOLS.values())
        return tools

    def run_call(self, call: ToolCall, episode: Episode) -> CallOutcome:
        """Apply one call; its result starts with the result's handle (``[r<round>.<i>]``) unless the context
        tools are disabled."""
        state = self.state(episode)
        state.shared.rounds.record(call.id)
        outcome = self._run(call, episode, state)
        if not self.config.tools.enabled:
            return outcome
        round_, index = state.shared.rounds.calls[call.id]
        return replace(outcome, output=f"{RESULT_TAG.format(round=round_, index=index)}\n{outcome.output}")

    def _run(self, call: ToolCall, episode: Episode, state: ToolsState) -> CallOutcome:
        if call.name == "shell":
            return run_shell(call, episode)
        if call.name == "read_overflow":
            return read_overflow(call, state.shared)
        schema = CONTEXT_TOOLS.get(call.name)
        if schema is None:
            callable_ = [SHELL_TOOL, READ_OVERFLOW_TOOL, *(CONTEXT_TOOLS.values() if state.offered else ())]
            return unknown_tool(call, callable_, episode.context)
        if not self.config.tools.enabled or not state.offered:
            # seed 000: off means never offered and refused; on, the tools do nothing until offered
            rule = "disabled" if not self.config.tools.enabled else "not_offered"
            why = "are off in this run" if rule == "disabled" else "are not offered yet"
            tokens = episode.context.tokens
            text = f"[context] rejected by rule {rule}: the context tools {why}; context unchanged ({tokens} tokens)"
            output = f"[{call.name}] the context tools {why}" + (
                "; they are offered when the context fills." if rule == "not_offered" else "."
            )
            self._event(state, call.name.removeprefix("context_"), False, [], 0, [])
            return CallOutcome(output, Receipt(ReceiptKind.REJECTED, text, tokens, tokens))
        args, problem = parse_arguments(call, schema)
        if problem:
            return format_outcome(call.name, problem, episode.context)
        op = call.name.removeprefix("context_")
        ops = {
            "status": self._status,
            "pin": self._pin,
            "unpin": self._unpin,
            "drop": self._drop,
            "note": self._note,
        }
        return ops[op](args, episode, state)

    # --- handles -----------------------------------------------------------------------------------------

    def resolve(self, handle: str, turns: Sequence[Turn], state: ToolsState) -> list[int]:
        """Indices of the messages ``handle`` names (empty if none)."""
        handle = handle.strip()
        if handle.startswith("[") and handle.endswith("]"):
            handle = handle[1:-1]
        by_id = [i for i, t in enumerate(turns) if t.role == "tool" and t.tool_call_id == handle]
        if by_id:
            return by_id[:1]
        match = _ROUND_HANDLE.fullmatch(handle)
        if match:
            round_, index = int(match.group(1)), match.group(2)
            calls = state.shared.rounds.calls
            return [
                i
                for i, t in enumerate(turns)
                if t.role == "tool"
                and t.tool_call_id in calls
                and calls[t.tool_call_id][0] == round_
                and (index is None or calls[t.tool_call_id][1] == int(index))
            ]
        if _MESSAGE_HANDLE.fullmatch(handle):
            return [i for i, t in enumerate(turns) if message_handle(t) == handle][:1]
        return []

    def _targets(
        self, args: dict[str, Any], turns: Sequence[Turn], state: ToolsState
    ) -> tuple[list[tuple[str, int]], list[str]]:
        """(handle, index) pairs named by ``handles`` and ``snippet``, in context order without repeats, and
        result lines for the handles that named nothing."""
        found: dict[int, str] = {}
        problems = []
        for handle in args.get("handles", []):
            indices = self.resolve(handle, turns, state)
            if not indices:
                problems.append(f"- {handle}: {UNKNOWN_HANDLE}")
            for i in indices:
                found.setdefault(i, handle)
        snippet = args.get("snippet")
        if snippet is not None:
            hits = [i for i, t in enumerate(turns) if snippet in t.content]
            if len(hits) == 1:
                found.setdefault(hits[0], f"snippet {snippet[:24]!r}")
            else:
                problems.append(
                    f"- snippet {snippet[:24]!r}: matches {len(hits)} messages, it must match exactly one"
                )
        return sorted(((h, i) for i, h in found.items()), key=lambda hi: hi[1]), problems

    def _refusal(
        self, turn: Turn, turns: Sequence[Turn], index: int, state: ToolsState, op: str
    ) -> str | None:
        if turn.role == "assistant":
            return REFUSED_OWN
        if pin_key(turn) in state.pins:
            return REFUSED_PINNED
        if is_stub(turn.content):
            return REFUSED_STUB
        if op == "drop":
            approval = pending_approval(turn, turns[index + 1 :])
            if approval is not None:
                return REFUSED_APPROVAL.format(id=approval)
        return None

    # --- operations --------------------------------------------------------------------------------------

    def _event(
        self, state: ToolsState, op: str, ok: bool, handles: Sequence[str], freed: int, ids: Sequence[str]
    ) -> None:
        state.shared.events.append(
            {
                "type": "context_op",
                "round": state.shared.rounds.current,
                "op": op,
                "ok": ok,
                "handles": list(handles),
                "tokens_freed": freed,
                "overflow_ids": list(ids),
            }
        )

    def _status(self, args: dict[str, Any], episode: Episode, state: ToolsState) -> CallOutcome:
        ctx, limit = episode.context, episode.config.limit
        top = args.get("top", 8)
        lines = [
            f"[context_status] {ctx.tokens:,} / {limit:,} tokens ({100 * ctx.tokens / limit:.1f}% of the window)"
        ]
        turns = ctx.turns
        candidates = [
            (t.tokens, i) for i, t in enumerate(turns) if t.role != "assistant" and not is_stub(t.content)
        ]
        largest = sorted(candidates, key=lambda c: (-c[0], c[1]))[:top]
        lines.append(f"Largest results in context (top {top}):" if largest else "No results in context.")
        lines += [
            f"- {self._describe(turns[i], state)}: {n:,} tokens | {_preview(turns[i].content)}"
            for n, i in largest
        ]
        pinned = [self._describe(t, state) for t in turns if pin_key(t) in state.pins]
        lines.append("Pinned: " + (", ".join(pinned) if pinned else "none"))
        spilled = [
            f"- {self._describe(t, state)}: overflow id {m.group('id')}"
            for t in turns
            for m in STUB_RE.finditer(t.content)
        ]
        lines += ["Already spilled (restore with read_overflow):", *spilled] if spilled else []
        lines.append(f"Model pins: {len(state.pins)}/{self.config.tools.max_pins}")
        self._event(state, "status", True, [], 0, [])
        return CallOutcome("\n".join(lines))

    def _describe(self, turn: Turn, state: ToolsState) -> str:
        """A message as status lists it: its visible handle, and a result's tool."""
        handle = self._handle(turn, state)
        return f"{handle} ({turn.name})" if turn.role == "tool" and turn.name else handle

    def _handle(self, turn: Turn, state: ToolsState) -> str:
        """The handle the model sees for ``turn``: a result's ``r<round>.<i>``, else its ``m`` handle (or the
        call id of a result whose round is unknown)."""
        if turn.role == "tool" and turn.tool_call_id:
            where = state.shared.rounds.calls.get(turn.tool_call_id)
            return f"r{where[0]}.{where[1]}" if where else turn.tool_call_id
        return message_handle(turn)

    def _pin(self, args: dict[str, Any], episode: Episode, state: ToolsState) -> CallOutcome:
        if "handles" not in args and "snippet" not in args:
            return format_outcome("context_pin", "give handles or a snippet", episode.context)
        turns = episode.context.turns
        targets, lines = self._targets(args, turns, state)
        cap = self.config.tools.max_pins
        pinned = []
        for handle, i in targets:
            key = pin_key(turns[i])
            if key in state.pins:
                lines.append(f"- {handle}: already pinned")
            elif len(state.pins) >= cap:
                lines.append(
                    f"- {handle}: refused, the pin cap is reached ({cap}/{cap}); unpin something first"
                )
            else:
                state.pins[key] = None
                pinned.append(handle)
                lines.append(f"- {handle}: pinned")
        head = f"[context_pin] {len(pinned)} pinned; model pins {len(state.pins)}/{cap}"
        self._event(state, "pin", bool(pinned), args.get("handles", []), 0, [])
        return CallOutcome(
            "\n".join([head, *lines]),
            _state_receipt(episode, "pin", bool(pinned), bool(targets)),
            bool(pinned),
        )

    def _unpin(self, args: dict[str, Any], episode: Episode, state: ToolsState) -> CallOutcome:
        if args.get("all"):
            removed = len(state.pins)
            state.pins.clear()
            self._event(state, "unpin", removed > 0, ["all"], 0, [])
            out = f"[context_unpin] removed all {removed} model pin(s)"
            return CallOutcome(out, _state_receipt(episode, "unpin", removed > 0, removed > 0), removed > 0)
        if "handles" not in args and "snippet" not in args:
            return format_outcome("context_unpin", "give handles, a snippet or all=true", episode.context)
        turns = episode.context.turns
        targets, lines = self._targets(args, turns, state)
        removed = 0
        for handle, i in targets:
            if state.pins.pop(pin_key(turns[i]), "absent") == "absent":
                lines.append(f"- {handle}: was not pinned")
            else:
                removed += 1
                lines.append(f"- {handle}: unpinned")
        head = (
            f"[context_unpin] {removed} unpinned; model pins {len(state.pins)}/{self.config.tools.max_pins}"
        )
        self._event(state, "unpin", removed > 0, args.get("handles", []), 0, [])
        receipt = _state_receipt(episode, "unpin", removed > 0, bool(targets))
        return CallOutcome("\n".join([head, *lines]), receipt, removed > 0)

    def _drop(self, args: dict[str, Any], episode: Episode, state: ToolsState) -> CallOutcome:
        ctx = episode.context
        turns = list(ctx.turns)
        targets, lines = self._targets(args, turns, state)
        store = state.shared.store
        ids: list[str] = []
        refusals: list[str] = []
        for handle, i in targets:
            reason = self._refusal(turns[i], turns, i, state, "drop")
            if reason:
                refusals.append(reason)
                lines.append(f"- {handle}: refused, {reason}")
                continue
            turn = turns[i]
            turns[i] = Turn(
                turn.role,
                store.stub(turn.content, turn.name, turn.tool_call_id),
                (),
                turn.tool_call_id,
                turn.name,
            )
            ids.append(body_id(turn.content))
            lines.append(f"- {handle}: dropped, overflow id {store.short(ids[-1])}")
        return self._finish(
            episode, state, "drop", args["handles"], turns, ids, lines, refusals, bool(targets)
        )

    def _note(self, args: dict[str, Any], episode: Episode, state: ToolsState) -> CallOutcome:
        ctx = episode.context
        turns = list(ctx.turns)
        targets, lines = self._targets(args, turns, state)
        store = state.shared.store
        accepted: list[tuple[str, int]] = []
        refusals: list[str] = []
        for handle, i in targets:
            reason = self._refusal(turns[i], turns, i, state, "note")
            if reason:
                refusals.append(reason)
                lines.append(f"- {handle}: refused, {reason}")
            else:
                accepted.append((handle, i))
        ids: list[str] = []
        if accepted:
            originals = [turns[i] for _, i in accepted]
            stubs = [store.stub(t.content, t.name, t.tool_call_id) for t in originals]
            ids = [body_id(t.content) for t in originals]
            first = originals[0]
            where = self._handle(first, state)
            block = preserved_block(extract_identifiers([t.content for t in originals]))
            note_text = "\n".join(x for x in (f"[note] {args['note']}", *stubs, block) if x)
            for k, ((handle, i), turn, stub) in enumerate(zip(accepted, originals, stubs)):
                content = note_text if k == 0 else f"{stub} (summarised in the note at {where})"
                turns[i] = Turn(turn.role, content, (), turn.tool_call_id, turn.name)
                what = "holds the note" if k == 0 else "stub"
                lines.append(f"- {handle}: {what}, overflow id {store.short(ids[k])}")
        return self._finish(
            episode, state, "note", args["handles"], turns, ids, lines, refusals, bool(targets)
        )

    def _finish(
        self,
        episode: Episode,
        state: ToolsState,
        op: str,
        handles: Sequence[str],
        turns: list[Turn],
        ids: list[str],
        lines: list[str],
        refusals: list[str],
        matched: bool,
    ) -> CallOutcome:
        """Apply a drop/note through the edit gate; build its result, receipt and event."""
        ctx = episode.context
        before = ctx.tokens
        if ids:
            announced = _holds_offer_note(ctx.turns)
            receipt = gated_replace(episode, turns, f"context_{op} of {len(ids)} item(s)")
            applied = receipt.applied
            state.note_removed |= announced and not _holds_offer_note(ctx.turns)  # the model's own choice
        else:
            applied = False
            receipt = _refused_receipt(before, refusals, matched)
        freed = before - ctx.tokens if applied else 0
        head = f"[context_{op}] {len(ids) if applied else 0} item(s) {'dropped' if op == 'drop' else 'noted'}"
        head += f", {len(refusals)} refused; {freed:,} tokens freed"
        self._event(state, op, applied, handles, freed, ids if applied else [])
        return CallOutcome("\n".join([head, *lines]), receipt, applied)


def _holds_offer_note(turns: Sequence[Turn]) -> bool:
    """True if a user turn holds the whole offer note (a fold summary quoting its first line does not)."""
    return any(t.role == "user" and OFFER_NOTE in t.content for t in turns)


def _refused_receipt(tokens: int, refusals: list[str], matched: bool) -> Receipt:
    if not matched:
        text = f"[context] matched nothing: no handle named a message ({tokens} tokens)"
        return Receipt(ReceiptKind.MATCHED_NOTHING, text, tokens, tokens)
    rule = "pinned" if REFUSED_PINNED in refusals else "stub" if REFUSED_STUB in refusals else "refusal"
    if any(r.startswith("carries the pending approval") for r in refusals):
        rule = "approval"
    text = f"[context] rejected by rule {rule}: nothing applied; context unchanged ({tokens} tokens)"
    return Receipt(ReceiptKind.REJECTED, text, tokens, tokens)


def _state_receipt(episode: Episode, op: str, applied: bool, matched: bool) -> Receipt:
    """The receipt of a pin or unpin: they change the pin store, never the tokens."""
    tokens = episode.context.tokens
    if applied:
        return Receipt(
            ReceiptKind.APPLIED, f"[context] applied: {op}, {tokens} → {tokens} tokens", tokens, tokens
        )
    if not matched:
        text = f"[context] matched nothing: no handle named a message ({tokens} tokens)"
        return Receipt(ReceiptKind.MATCHED_NOTHING, text, tokens, tokens)
    text = f"[context] matched nothing: {op} changed no pin ({tokens} tokens)"
    return Receipt(ReceiptKind.MATCHED_NOTHING, text, tokens, tokens)


def pending_approval(turn: Turn, later: Sequence[Turn]) -> str | None:
    """The first approval id in ``turn`` that no later assistant message mentions, else None."""
    for match in APPROVAL_RE.finditer(turn.content):
        approval = match.group(1)
        used = any(
            approval in t.content or any(approval in c.arguments for c in t.tool_calls)
            for t in later
            if t.role == "assistant"
        )
        if not used:
            return approval
    return None


def user_asked(task: str) -> bool:
    """True if the user's text asks for context management (a phrase, or a context tool's name)."""
    text = task.lower()
    return any(p in text for p in ASK_PHRASES) or any(name in text for name in CONTEXT_TOOLS)


def _preview(text: str, width: int = 80) -> str:
    """The first non-empty line of ``text`` after its handle tag, cut to ``width``."""
    text = RESULT_TAG_RE.sub("", text, count=1)
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= width else line[: width - 3] + "..."
