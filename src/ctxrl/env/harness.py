"""The harness: one episode of an agent that manages its own context, step by step.

    harness = Harness(HarnessConfig(), ChatTemplateCounter(tokenizer))
    harness.reset(system_prompt, task, workspace)
    result = harness.step(Action("let me look", (ToolCall.make("", "shell", {"command": "ls"}),)))
    prompt = tokenizer.apply_chat_template(harness.context.to_messages(), tools=harness.tools)

A step takes the model's assistant message (an :class:`Action`: text and tool calls), runs each call
through the harness's **mode**, appends the assistant turn and one result turn per call (output, receipt,
budget readout, nudges, finalize notice), rolls back on overflow, and reports a :class:`StepResult`.

Modes decide which tools the model gets and how a call is applied (:class:`ctxrl.env.modes.base.Mode`;
the registry is :mod:`ctxrl.env.modes`); counting, budget, rollback, receipts and step limits are shared.
Without a mode the harness runs plain file mode (:class:`ctxrl.env.modes.file.FileMode`). ``submit``
belongs to the harness and ends the episode in every mode.

Step accounting: a step whose every call was an applied context edit that printed nothing and exited 0
is a free edit turn: it costs no task step (``max_steps``) but still counts against the LM-call cap.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ctxrl.env import budget as bud
from ctxrl.env.actions import CALL_SYNTAX, FORMAT_ERROR_TOOL, format_error_call
from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import (
    Context,
    TokenCounter,
    ToolCall,
    Turn,
    canonical_json,
    safe_identifier,
    valid_arguments,
)
from ctxrl.env.gate import (
    MAX_ARGUMENT_CHARS,
    MAX_CALLS,
    MAX_DEPTH,
    MAX_TEXT_CHARS,
    clean_text,
    json_depth,
    loads_bounded,
)
from ctxrl.env.modes.base import SUBMIT, CallOutcome, CommandRunner, Episode, Mode, StepNotes
from ctxrl.env.modes.common import format_outcome
from ctxrl.env.modes.file import FileMode
from ctxrl.env.monitor import Flag, argument_texts, scan
from ctxrl.env.receipts import Receipt
from ctxrl.env.sandbox import Sandbox, SandboxConfig
from ctxrl.errors import UsageError

NO_TOOL_CALL = "[harness] Your message has no tool call: call shell to run a command, or submit to answer."
SUBMITTED = "[harness] Answer submitted."
FINALIZE = "[harness] {left} turn(s) left: finish the task and submit your answer with the submit tool."

SUBMIT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": SUBMIT,
        "description": "Submit the final answer; this ends the episode.",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "the final answer"}},
            "required": ["answer"],
        },
    },
}


@dataclass(frozen=True)
class Action:
    """The model's assistant message for one step: its text and its tool calls (ids may be empty)."""

    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> Action:
        """From an OpenAI-style message dict; arguments may be a dict or JSON text (bad JSON, or JSON nested
        too deep to handle, gives ``{}``). A call, or its ``function``, that is not an object becomes a
        malformed-call receipt; ``tool_calls`` holding one object rather than a list is read as that call."""
        calls = []
        raw_calls = message.get("tool_calls") or ()
        if isinstance(raw_calls, (Mapping, str, bytes)):
            raw_calls = (raw_calls,)  # one call not in a list: read it as one; text: a malformed call
        for raw in raw_calls:
            fn = raw.get("function", raw) if isinstance(raw, Mapping) else raw
            if not isinstance(fn, Mapping):
                shown = str(fn)[:200]
                calls.append(
                    format_error_call(f"a tool call must be an object, got {type(fn).__name__}", shown)
                )
                continue
            arguments = fn.get("arguments") or {}
            if isinstance(arguments, str):
                arguments = _json_object(arguments)
            call_id = str(raw.get("id") or "") if isinstance(raw, Mapping) else ""
            try:
                call = ToolCall.make(call_id, str(fn.get("name") or ""), arguments)
            except (RecursionError, TypeError, ValueError):  # too deep, or not JSON-serialisable
                call = ToolCall.make(call_id, str(fn.get("name") or ""), {})
            calls.append(call)
        return cls(content=str(message.get("content") or ""), tool_calls=tuple(calls))

    def gated(self) -> Action:
        """This action through the gate (:mod:`ctxrl.env.gate`): text cleaned (lone surrogates, control
        characters), prose past :data:`MAX_TEXT_CHARS` cut with a marker; calls past :data:`MAX_CALLS`, and
        calls whose arguments are too long, nest too deep or hold a control character, turned into
        malformed-call receipts. Nothing
        downstream (commands, files, token counting, prompts, the monitor) meets text it cannot handle."""
        content = clean_text(self.content)
        if len(content) > MAX_TEXT_CHARS:
            cut = len(content) - MAX_TEXT_CHARS
            content = (
                f"{content[:MAX_TEXT_CHARS]}\n[cut: {cut:,} more characters; a turn holds {MAX_TEXT_CHARS:,}]"
            )
        calls = [_gated_call(c) for c in self.tool_calls[:MAX_CALLS]]
        if len(self.tool_calls) > MAX_CALLS:
            more = len(self.tool_calls) - MAX_CALLS
            calls.append(format_error_call(f"{more} more calls were not run: at most {MAX_CALLS} a turn", ""))
        return Action(content, tuple(calls))


_CONTROL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u00(?:0[0-8bBcCeEfF]|1[0-9a-fA-F]|7[fF]|[89][0-9a-fA-F])")
"""A JSON escape of a control character (not tab, newline or carriage return) in arguments text, ``\\u0000``
and the like, after an even number of backslashes (so not an escaped backslash followed by ``u0000``)."""


def _gated_call(call: ToolCall) -> ToolCall:
    """One call through the gate (see :meth:`Action.gated`)."""
    text = call.arguments
    if len(text) > MAX_ARGUMENT_CHARS:
        return format_error_call(
            f"the arguments are {len(text):,} characters; at most {MAX_ARGUMENT_CHARS:,}", text
        )
    depth = json_depth(text)
    if depth > MAX_DEPTH:
        return format_error_call(f"the arguments nest {depth} deep; at most {MAX_DEPTH} levels", text)
    control = _CONTROL_ESCAPE.search(text)
    if control is not None:  # refused, not stripped: the call would run something other than what was written
        code = control.group(0)[-4:].upper()
        what = " (a null byte)" if code == "0000" else ""
        return format_error_call(
            f"the arguments hold the control character U+{code}{what}, which no command or file name can "
            "hold; nothing ran",
            text,
        )
    return ToolCall(clean_text(call.id), clean_text(call.name), valid_arguments(clean_text(text)))


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = loads_bounded(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# --- the harness ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    """Everything one step did, for the environment wrapper, the trainer and the logs."""

    observations: tuple[str, ...]
    """Contents of the turns the harness appended this step (tool results, notes), in order."""
    receipts: tuple[Receipt, ...]
    readout: str
    """The latest readout line (shown to the model only where the mode's readout feature is on)."""
    tokens: int
    """Context size (calibrated prompt tokens) after the step."""
    nudges: tuple[str, ...]
    flags: tuple[Flag, ...]
    """Self-injection monitor flags (recorded only)."""
    free_turn: bool
    """The step was a free edit turn (no task step used)."""
    edited: bool
    """The editable region was rewritten (edit applied or rollback): the prompt no longer extends the last one."""
    rolled_back_turns: int
    overflow_commands: tuple[str, ...]
    steps: int
    lm_calls: int
    terminated: bool
    """The model submitted."""
    truncated: bool
    """A limit ended the episode (max_steps, max_lm_calls, overflow)."""
    reason: str | None
    """``submit``, ``max_steps``, ``max_lm_calls`` or ``overflow`` when the episode ended, else None."""
    answer: str | None
    events: tuple[dict[str, Any], ...] = ()
    """What the mode recorded this step (context_op, ContextManaged and pressure events)."""

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    def metrics(self) -> dict[str, float]:
        """Namespaced per-step metrics."""
        return {
            "harness/tokens": float(self.tokens),
            "harness/free_turn": float(self.free_turn),
            "harness/edited": float(self.edited),
            "harness/receipts": float(len(self.receipts)),
            "harness/edits_applied": float(sum(r.applied for r in self.receipts)),
            "harness/rolled_back_turns": float(self.rolled_back_turns),
            "harness/nudges": float(len(self.nudges)),
            "monitor/flags": float(len(self.flags)),
            "harness/context_ops": float(sum(e.get("type") != "pressure" for e in self.events)),
            "harness/tokens_freed": float(
                sum(e.get("tokens_freed", e.get("reclaimed_tokens", 0)) for e in self.events)
            ),
        }


def default_runner(workspace: Path, config: SandboxConfig) -> CommandRunner:
    return Sandbox(workspace, config)


class Harness:
    """Runs episodes of one mode (file mode by default) under one :class:`HarnessConfig`."""

    def __init__(
        self,
        config: HarnessConfig,
        counter: TokenCounter,
        mode: Mode | None = None,
        runner_factory: Callable[[Path, SandboxConfig], CommandRunner] = default_runner,
    ) -> None:
        self.config = config
        self.counter = counter
        self.mode: Mode = mode if mode is not None else FileMode()
        self.features = self.mode.budget.resolve(config)
        """The budget machinery this run uses: the mode's seed defaults with the config's overrides."""
        self.means = self.mode.means(config)
        """How nudges and the overflow note name the mode's means of shrinking the context."""
        self.runner_factory = runner_factory
        self._episode: Episode | None = None

    @property
    def tools(self) -> list[dict[str, Any]]:
        """Tool schemas offered to the model (the mode's, then submit)."""
        return [*self.mode.tool_schemas(self.config), SUBMIT_TOOL]

    @property
    def context(self) -> Context:
        return self._live().context

    def reset(self, system_prompt: str, task: str, workspace: str | Path) -> list[dict[str, Any]]:
        """Start an episode in ``workspace`` (created if missing); return the first prompt's messages."""
        self.close()
        cfg = self.config
        ws = Path(workspace)
        ws.mkdir(parents=True, exist_ok=True)
        ctx = Context(
            system_prompt, task, self.counter, self.tools, (cfg.calibration_min, cfg.calibration_max)
        )
        self._episode = Episode(ctx, self.runner_factory(ws, cfg.sandbox), ws.resolve(), cfg)
        self._budget = bud.BudgetState.initial(cfg)
        self._steps = 0
        self._lm_calls = 0
        self._final_turn = False
        self._done = False
        self._call_ids: set[str] = set()
        self.mode.begin_episode(self._episode)
        self._refresh_slots()
        return ctx.to_messages()

    def close(self) -> None:
        """Release the current episode's command runner (if it has a ``close``); safe to call twice."""
        if self._episode is not None:
            close = getattr(self._episode.runner, "close", None)
            if callable(close):
                close()

    def _live(self) -> Episode:
        if self._episode is None:
            raise UsageError("call Harness.reset(...) before using the episode")
        return self._episode

    def step(self, action: Action | Mapping[str, Any]) -> StepResult:
        """Apply the model's action; see the module docstring for what a step does."""
        episode = self._live()
        if self._done:
            raise UsageError("the episode is over; call Harness.reset(...) to start a new one")
        if not isinstance(action, Action):
            if not isinstance(action, Mapping):
                raise UsageError(
                    f"Harness.step takes an Action or an OpenAI-style message dict, got {type(action).__name__}"
                    " (model text goes through ContextEnv.step, or ctxrl.env.actions.parse_tool_calls)"
                )
            action = Action.from_message(action)
        action = action.gated()
        cfg, ctx = self.config, episode.context
        self._lm_calls += 1
        calls = self._with_ids(action.tool_calls)
        flags = (
            list(scan(action.content, "assistant", f"{ctx.system_prompt}\n{ctx.task}")) if cfg.monitor else []
        )

        outcomes: list[CallOutcome] = []
        answer: str | None = None
        for call in calls:
            if call.name == SUBMIT:
                value = call.args().get("answer")
                answer = value if isinstance(value, str) else canonical_json(call.args())
                outcomes.append(CallOutcome(SUBMITTED))
                break  # nothing after a submit runs
            if (
                call.name == FORMAT_ERROR_TOOL
            ):  # a malformed call, or one the gate refused: say why, run nothing
                error = call.args().get("error", "malformed tool call")
                outcomes.append(format_outcome("a tool", f"{error}; {CALL_SYNTAX}", ctx))
                continue
            outcomes.append(self.mode.run_call(call, episode))
        calls = self._fresh_ids(calls[: len(outcomes)])
        receipts = tuple(o.receipt for o in outcomes if o.receipt is not None)
        flags += [f for o in outcomes for f in o.flags]
        if cfg.monitor:
            flags += self._argument_flags(calls, {f.text for f in flags})
        edited = any(r.applied for r in receipts)
        if any(r.applied and r.after < r.before for r in receipts):
            self._budget.ignored_rollbacks = 0  # the model condensed: earlier rollbacks were not ignored

        free = bool(outcomes) and all(o.context_only for o in outcomes)
        if not free:
            self._steps += 1
        reason = self._end_reason(answer is not None)

        ctx.append(Turn("assistant", action.content, tool_calls=calls))
        if calls:
            pending = [
                Turn("tool", clean_text(_with_receipt(o)), tool_call_id=c.id, name=c.name)
                for c, o in zip(calls, outcomes)
            ]
        else:
            pending = [Turn("user", NO_TOOL_CALL)]
        observations: list[str] = []
        shown, nudges = "", []
        for i, turn in enumerate(pending):
            shown, new_nudges = self._append_observation(
                turn, last=i == len(pending) - 1, ending=reason is not None
            )
            nudges += new_nudges
            observations.append(ctx.turns[-1].content)

        post = self._after_step(ending=reason is not None)
        observations += post.notes
        edited = edited or post.edited

        rolled = 0
        commands: tuple[str, ...] = ()
        if reason is None and ctx.tokens > cfg.limit and not self.features.rollback:
            reason = "overflow"  # without rollback (every mode but file, by default) an overflow fails
        if reason is None and ctx.tokens > cfg.limit:
            rolled, commands, note = self._rollback(calls)
            observations.append(note)
            shown = bud.readout(ctx.tokens, cfg.limit)
            edited = True
            if ctx.tokens > cfg.limit:
                reason = "overflow"  # even an empty editable region does not fit: nothing left to roll back
            self._refresh_slots()
        if reason is not None:
            self._done = True
        return StepResult(
            observations=tuple(observations),
            receipts=receipts,
            readout=shown,
            tokens=ctx.tokens,
            nudges=tuple(nudges),
            flags=tuple(flags),
            free_turn=free,
            edited=edited,
            rolled_back_turns=rolled,
            overflow_commands=commands,
            steps=self._steps,
            lm_calls=self._lm_calls,
            terminated=reason == "submit",
            truncated=reason is not None and reason != "submit",
            reason=reason,
            answer=answer,
            events=post.events,
        )

    def _argument_flags(self, calls: Sequence[ToolCall], seen: set[str]) -> list[Flag]:
        """Monitor flags for the text of the calls' arguments (a ``context_note``'s note, a command), the
        submitted answer excepted; a line holding a text already flagged this step (the file region of the
        same edit) is not flagged twice."""
        ctx = self._live().context
        origin = f"{ctx.system_prompt}\n{ctx.task}"
        out: list[Flag] = []
        for call in calls:
            if call.name == SUBMIT:
                continue
            for text in argument_texts(call.args()):
                for flag in scan(text, "arguments", origin):
                    if not any(line in flag.text for line in seen):
                        seen.add(flag.text)
                        out.append(flag)
        return out

    def _with_ids(self, calls: Sequence[ToolCall]) -> tuple[ToolCall, ...]:
        """Calls with episode-unique, header-safe ids and names (the model's own ids kept where valid).

        An id is unique against every id the harness gave out and every id now in the context: the model can
        write a call or result with any id into its context (a forged ``call_2_0``), and a real call sharing
        it would be merged away at the next parse-back (a duplicated id keeps its first call).
        """
        taken = self._call_ids | self._ids_in_context()
        out = []
        for i, call in enumerate(calls):
            call_id = call.id
            if not safe_identifier(call_id) or call_id in taken:
                call_id = f"call_{self._lm_calls}_{i}"
                k = 0
                while call_id in taken:
                    k += 1
                    call_id = f"call_{self._lm_calls}_{i}_{k}"
            taken.add(call_id)
            self._call_ids.add(call_id)
            name = (
                call.name
                if safe_identifier(call.name)
                else re.sub(r"[^A-Za-z0-9_.:\-]", "_", call.name)[:64] or "_"
            )
            out.append(replace(call, id=call_id, name=name))
        return tuple(out)

    def _ids_in_context(self) -> set[str]:
        return {
            i
            for t in self._live().context.turns
            for i in (t.tool_call_id, *(c.id for c in t.tool_calls))
            if i is not None
        }

    def _fresh_ids(self, calls: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
        """``calls`` with any id that the step's own edits wrote into the context (a command that forges a
        call with the id its own call carries) replaced, so the calls appended next are unique."""
        in_context = self._ids_in_context()
        if not any(c.id in in_context for c in calls):
            return calls
        taken = self._call_ids | in_context
        out = []
        for i, call in enumerate(calls):
            if call.id in in_context:
                k = 1
                while f"call_{self._lm_calls}_{i}_{k}" in taken:
                    k += 1
                call = replace(call, id=f"call_{self._lm_calls}_{i}_{k}")
                taken.add(call.id)
                self._call_ids.add(call.id)
            out.append(call)
        return tuple(out)

    def _after_step(self, *, ending: bool) -> StepNotes:
        """Run the mode's ``after_step`` hook (pressure pass, offers; see :class:`Mode`), append its notes as
        one user turn, and refresh the tool list and the signal slot."""
        episode = self._live()
        post = self.mode.after_step(episode, ending)
        if post.notes:
            episode.context.append(Turn("user", "\n".join(post.notes)))
            post = replace(post, notes=(episode.context.turns[-1].content,))
        self._refresh_slots()
        return post

    def _refresh_slots(self) -> None:
        """Re-read the mode's tool list and signal slot (both may change after a step)."""
        ctx = self._live().context
        ctx.set_tools(self.tools)
        ctx.set_signal(self.mode.signal(self._live()))

    def _end_reason(self, submitted: bool) -> str | None:
        if submitted:
            return "submit"
        if self._final_turn:
            return "overflow"
        if self._steps >= self.config.max_steps:
            return "max_steps"
        if self._lm_calls >= self.config.lm_call_cap:
            return "max_lm_calls"
        return None

    def _turns_left(self) -> int:
        return min(self.config.max_steps - self._steps, self.config.lm_call_cap - self._lm_calls)

    def _append_observation(self, turn: Turn, *, last: bool, ending: bool) -> tuple[str, list[str]]:
        """Append a result/note turn with its readout (and, on the last one, nudges and finalize notice).

        The readout counts the context up to and including this turn's output and receipt; the few tokens
        of the readout and notice lines themselves are not in the figure.
        """
        cfg, ctx = self.config, self._live().context
        body = ctx.counted([turn])[0]
        if turn.role == "tool":
            self._budget.recent_outputs.append(body.tokens)
        size = ctx.tokens_of([*ctx.turns, body])
        shown = bud.readout(size, cfg.limit)
        lines = [shown] if self.features.readout else []
        nudges: list[str] = []
        if last and not ending:
            if self.features.nudges:
                urgent = bud.urgent_nudge(size, self._budget.recent_outputs, cfg, self.means)
                tier = bud.tier_nudge(
                    self._budget, size, cfg, self.means
                )  # always: tiers fire/re-arm in order
                nudges = [urgent] if urgent else [tier] if tier else []
            left = self._turns_left()
            if 0 < left <= cfg.finalize_turns:
                nudges.append(FINALIZE.format(left=left))
        ctx.append(replace(turn, content="\n".join([turn.content, *lines, *nudges])))
        return shown, nudges

    def _rollback(self, culprits: Sequence[ToolCall]) -> tuple[int, tuple[str, ...], str]:
        """Roll back the newest turns until the margin is free; append the overflow note naming
        ``culprits`` (this step's calls). Returns (turns removed, commands whose output overflowed, note)."""
        cfg, ctx, state = self.config, self._live().context, self._budget
        margin = bud.rollback_margin(cfg, state.ignored_rollbacks)
        state.ignored_rollbacks += 1
        turns = ctx.turns
        cut = bud.rollback_cut(turns, ctx.tokens_of, cfg.limit - margin)
        removed = turns[cut:]
        ctx.replace_turns(turns[:cut])
        lines = [bud.overflow_note(cfg, removed, culprits, freed=cfg.limit - ctx.tokens, means=self.means)]
        if state.ignored_rollbacks > cfg.rollback_retries:
            self._final_turn = True
            lines.append(bud.FINAL_TURN.format(count=state.ignored_rollbacks))
        if self.features.readout:
            lines.append(bud.readout(ctx.tokens, cfg.limit))
        note = "\n".join(lines)
        ctx.append(Turn("user", note))
        return len(removed), tuple(bud.describe_call(c) for c in culprits), note


def _with_receipt(outcome: CallOutcome) -> str:
    return f"{outcome.output}\n{outcome.receipt.text}" if outcome.receipt is not None else outcome.output
