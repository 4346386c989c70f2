"""The harness: one episode of an agent that manages its own context, step by step.

    harness = Harness(HarnessConfig(), ChatTemplateCounter(tokenizer))
    harness.reset(system_prompt, task, workspace)
    result = harness.step(Action("let me look", (ToolCall.make("", "shell", {"command": "ls"}),)))
    prompt = tokenizer.apply_chat_template(harness.context.to_messages(), tools=harness.tools)

A step takes the model's assistant message (an :class:`Action`: text and tool calls), runs each call
through the harness's **mode**, appends the assistant turn and one result turn per call (output, receipt,
budget readout, nudges, finalize notice), rolls back on overflow, and reports a :class:`StepResult`.

Modes decide which tools the model gets and how a call is applied; counting, budget, rollback, receipts
and step limits are shared. Only file mode exists now (:class:`FileMode`): the editable region is rendered
to the context file before every shell command and parsed back after it, under the edit gate. ``submit``
belongs to the harness and ends the episode in every mode.

Step accounting: a step whose every call was an applied context edit that printed nothing and exited 0
is a free edit turn: it costs no task step (``max_steps``) but still counts against the LM-call cap.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from ctxrl.env import budget as bud
from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import (
    Context,
    TokenCounter,
    ToolCall,
    Turn,
    canonical_json,
    safe_identifier,
    valid_arguments,
    valid_text,
)
from ctxrl.env.ctxfile import parse_context, render_context
from ctxrl.env.monitor import Flag, added_lines, scan
from ctxrl.env.receipts import Receipt, judge_file_edit
from ctxrl.env.sandbox import CommandResult, Sandbox, SandboxConfig, remove_tree
from ctxrl.errors import UsageError

SUBMIT = "submit"
NO_TOOL_CALL = "[harness] Your message has no tool call: call shell to run a command, or submit to answer."
UNKNOWN_TOOL = "[harness] Unknown tool {name!r}; the tools are: {tools}."
BAD_ARGUMENT = "[harness] The {name} tool needs a string argument {argument!r}."
SUBMITTED = "[harness] Answer submitted."
FINALIZE = "[harness] {left} turn(s) left: finish the task and submit your answer with the submit tool."
NO_OUTPUT = "(no output)"

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
        too deep to handle, gives ``{}``)."""
        calls = []
        for raw in message.get("tool_calls") or ():
            fn = raw.get("function", raw)
            arguments = fn.get("arguments") or {}
            if isinstance(arguments, str):
                arguments = _json_object(arguments)
            try:
                call = ToolCall.make(str(raw.get("id") or ""), str(fn.get("name") or ""), arguments)
            except (RecursionError, TypeError, ValueError):  # too deep, or not JSON-serialisable
                call = ToolCall.make(str(raw.get("id") or ""), str(fn.get("name") or ""), {})
            calls.append(call)
        return cls(content=str(message.get("content") or ""), tool_calls=tuple(calls))

    def valid(self) -> Action:
        """This action with every lone surrogate replaced by U+FFFD (see :func:`valid_text`), so nothing
        downstream (commands, files, token counting, prompts) meets text it cannot encode."""
        calls = tuple(
            ToolCall(valid_text(c.id), valid_text(c.name), valid_arguments(c.arguments))
            for c in self.tool_calls
        )
        return Action(valid_text(self.content), calls)


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


class CommandRunner(Protocol):
    """Runs one shell command in the episode workspace (the :class:`Sandbox` in production)."""

    def run(self, command: str) -> CommandResult: ...


@dataclass
class Episode:
    """What a mode may use to apply a call: the live context, the command runner, workspace and config."""

    context: Context
    runner: CommandRunner
    workspace: Path
    config: HarnessConfig


@dataclass(frozen=True)
class CallOutcome:
    """What applying one tool call produced (before the harness adds readout and notices)."""

    output: str
    """Text for the model: the command's output and exit status, or an error line."""
    receipt: Receipt | None = None
    context_only: bool = False
    """An applied context edit that printed nothing and exited 0 (a candidate free edit turn)."""
    flags: tuple[Flag, ...] = ()


class Mode(Protocol):
    """A context-management mode: the tools it offers (besides submit) and how a call is applied.

    Optional hooks the harness calls when a mode has them (duck-typed; :mod:`ctxrl.env.modes` uses them):
    ``begin_episode(episode)`` at reset; ``after_step(episode, ending)`` after a step's results are
    appended and before the overflow check, returning an object with ``notes`` (lines of one user note),
    ``events`` and ``edited``; ``signal(episode) -> str | None``, the text of the slot rendered after the
    conversation; ``rolls_back = False`` to end the episode on overflow instead of rolling back.
    ``tool_schemas`` is re-read after every step, so a mode may offer tools as the episode goes.
    """

    name: str

    def tool_schemas(self, config: HarnessConfig) -> list[dict[str, Any]]: ...

    def run_call(self, call: ToolCall, episode: Episode) -> CallOutcome: ...


@dataclass(frozen=True)
class PostStep:
    """What a mode's ``after_step`` hook added to a step."""

    notes: tuple[str, ...] = ()
    events: tuple[dict[str, Any], ...] = ()
    edited: bool = False


# --- file mode -------------------------------------------------------------------------------------------


def write_context_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, never through a link: a symlink, directory or special file the model put
    there is removed first.

    Overwrites in place and then truncates to the new length: on ext4, truncating a file to zero (or
    renaming over it) and rewriting it forces a synchronous block flush (``auto_da_alloc``), which costs
    milliseconds per step at 32k tokens. No one reads the file while it is written.
    """
    data = text.encode("utf-8")
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o644)
    except OSError:
        fd = -1
    if fd >= 0 and not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        fd = -1
    if fd < 0:  # a symlink, a directory (of any depth), a FIFO...: replace it with a plain file
        remove_tree(path)
        fd = os.open(path, flags | os.O_EXCL, 0o644)
    # A file this process just created belongs to it; give it the owner of its folder (the sandbox's uid
    # when the harness runs as root), so the model's commands can edit it in place.
    owner = os.stat(path.parent)
    if os.fstat(fd).st_uid != owner.st_uid:
        with contextlib.suppress(OSError):
            os.fchown(fd, owner.st_uid, owner.st_gid)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.truncate(len(data))


def read_context_file(path: Path, max_bytes: int) -> tuple[bytes | None, str | None]:
    """The file's bytes, or ``(None, problem)``: missing, a symlink, not a regular file, too large.

    Opens without following symlinks and without blocking, so a model cannot make the harness read a host
    file through a link or hang on a FIFO.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, "is missing"
    except OSError as exc:
        return (
            None,
            "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot be opened ({exc.strerror})",
        )
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, "is not a regular file"
        if info.st_size > max_bytes:
            return None, f"is too large ({info.st_size} bytes, at most {max_bytes})"
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror})"
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        return None, f"is too large (over {max_bytes} bytes)"
    return data, None


def format_command_output(result: CommandResult) -> str:
    """The command's output as the model sees it, with its exit status when it failed."""
    text = result.output.rstrip("\n") if result.output.strip() else NO_OUTPUT
    if result.timed_out:
        text += f"\n[timed out after {result.duration_s:.1f} s; exit code {result.exit_code}]"
    elif result.exit_code != 0:
        text += f"\n[exit code {result.exit_code}]"
    return text


class FileMode:
    """Context as an editable file: a ``shell`` tool, with the context file synced around every command."""

    name = "file"

    def tool_schemas(self, config: HarnessConfig) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": "shell",
                    "description": (
                        "Run a bash command in the workspace. The editable part of your context (every turn "
                        f"after the task) is the file {config.context_file}, one [[CTX_TURN n role=...]] header "
                        "per turn; edit it with ordinary tools and the next prompt is built from it."
                    ),
                    "parameters": {
                        "type": "object",
                        "properties": {"command": {"type": "string", "description": "the bash command"}},
                        "required": ["command"],
                    },
                },
            }
        ]

    def run_call(self, call: ToolCall, episode: Episode) -> CallOutcome:
        if call.name != "shell":
            return CallOutcome(UNKNOWN_TOOL.format(name=call.name, tools=f"shell, {SUBMIT}"))
        command = call.args().get("command")
        if not isinstance(command, str) or not command.strip():
            return CallOutcome(BAD_ARGUMENT.format(name="shell", argument="command"))
        return run_shell_synced(command, episode)


def run_shell_synced(command: str, episode: Episode) -> CallOutcome:
    """Write the context file, run ``command``, then judge and apply the model's edit of the file."""
    cfg, ctx = episode.config, episode.context
    path = episode.workspace / cfg.context_file
    written = render_context(ctx.turns)
    write_context_file(path, written)
    result = episode.runner.run(command)
    receipt, new_text = apply_file_edit(episode, written, command, result.exit_code)
    flags: tuple[Flag, ...] = ()
    if cfg.monitor and new_text is not None:
        origin = f"{ctx.system_prompt}\n{ctx.task}"
        flags = tuple(scan(added_lines(written, new_text), "file", origin))
    silent = not result.output.strip() and result.exit_code == 0
    context_only = receipt is not None and receipt.applied and silent
    return CallOutcome(format_command_output(result), receipt, context_only, flags)


def apply_file_edit(
    episode: Episode, written: str, command: str, exit_code: int
) -> tuple[Receipt | None, str | None]:
    """Judge the context file after a command; apply its turns if the gate allows.

    Returns the receipt (None if the command neither changed nor named the file) and the file's new text
    (None if unchanged or unreadable). A rejected or failed edit leaves the live context as it was; the
    file is rewritten from it before the next command.
    """
    cfg, ctx = episode.config, episode.context
    max_bytes = 64 * cfg.budget + 65536
    data, problem = read_context_file(episode.workspace / cfg.context_file, max_bytes)
    file_changed = data is None or data != written.encode("utf-8")
    new_text: str | None = None
    parsed: list[Turn] = []
    context_changed = False
    after: int | None = None
    if data is not None and file_changed:
        new_text = data.decode("utf-8", errors="replace")
        parsed = ctx.counted(parse_context(data))
        context_changed = tuple(parsed) != ctx.turns
        after = ctx.tokens_of(parsed)
    receipt = judge_file_edit(
        gate=cfg.gate,
        file=cfg.context_file,
        limit=cfg.limit,
        before=ctx.tokens,
        after=after,
        targeted=cfg.context_file in command,
        file_changed=file_changed,
        context_changed=context_changed,
        exit_code=exit_code,
        file_problem=problem,
    )
    if receipt is not None and receipt.applied:
        ctx.replace_turns(parsed)
    return receipt, new_text


# --- the harness ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    """Everything one step did, for the environment wrapper, the trainer and the logs."""

    observations: tuple[str, ...]
    """Contents of the turns the harness appended this step (tool results, notes), in order."""
    receipts: tuple[Receipt, ...]
    readout: str
    """The last readout line shown."""
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
        begin = getattr(self.mode, "begin_episode", None)
        if begin is not None:
            begin(self._episode)
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
            action = Action.from_message(action)
        action = action.valid()
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
            outcomes.append(self.mode.run_call(call, episode))
        calls = self._fresh_ids(calls[: len(outcomes)])
        receipts = tuple(o.receipt for o in outcomes if o.receipt is not None)
        flags += [f for o in outcomes for f in o.flags]
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
                Turn("tool", _with_receipt(o), tool_call_id=c.id, name=c.name)
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
        if reason is None and ctx.tokens > cfg.limit and not getattr(self.mode, "rolls_back", True):
            reason = "overflow"  # a mode without rollback (append-only) fails on overflow
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

    def _after_step(self, *, ending: bool) -> PostStep:
        """Run the mode's ``after_step`` hook (pressure pass, offers; see :class:`Mode`), append its notes as
        one user turn, and refresh the tool list and the signal slot."""
        episode = self._live()
        hook = getattr(self.mode, "after_step", None)
        post = PostStep()
        if hook is not None:
            result = hook(episode, ending)
            post = PostStep(tuple(result.notes), tuple(result.events), bool(result.edited))
            if post.notes:
                note = "\n".join(post.notes)
                episode.context.append(Turn("user", note))
                post = replace(post, notes=(episode.context.turns[-1].content,))
        self._refresh_slots()
        return post

    def _refresh_slots(self) -> None:
        """Re-read the mode's tool list and signal slot (both may change after a step)."""
        ctx = self._live().context
        ctx.set_tools(self.tools)
        signal = getattr(self.mode, "signal", None)
        ctx.set_signal(signal(self._live()) if signal is not None else None)

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
        lines = [bud.readout(size, cfg.limit)]
        nudges: list[str] = []
        if last and not ending:
            urgent = bud.urgent_nudge(size, self._budget.recent_outputs, cfg)
            tier = bud.tier_nudge(self._budget, size, cfg)  # always called so tiers fire/re-arm in order
            nudges = [urgent] if urgent else [tier] if tier else []
            left = self._turns_left()
            if 0 < left <= cfg.finalize_turns:
                nudges.append(FINALIZE.format(left=left))
        ctx.append(replace(turn, content="\n".join([turn.content, *lines, *nudges])))
        return lines[0], nudges

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
        target = cfg.context_file if self.mode.name == "file" else "your context"
        lines = [bud.overflow_note(cfg, removed, culprits, freed=cfg.limit - ctx.tokens, target=target)]
        if state.ignored_rollbacks > cfg.rollback_retries:
            self._final_turn = True
            lines.append(bud.FINAL_TURN.format(count=state.ignored_rollbacks))
        lines.append(bud.readout(ctx.tokens, cfg.limit))
        note = "\n".join(lines)
        ctx.append(Turn("user", note))
        return len(removed), tuple(bud.describe_call(c) for c in culprits), note


def _with_receipt(outcome: CallOutcome) -> str:
    return f"{outcome.output}\n{outcome.receipt.text}" if outcome.receipt is not None else outcome.output
