"""``file`` mode (seed 002, Context Language Models): the context mirrored to a file the model edits.

The editable region is rendered to the context file (``[[CTX_TURN n role=...]]`` headers,
:mod:`ctxrl.env.ctxfile`) before every shell command and parsed back after it, under the edit gate
(:mod:`ctxrl.env.receipts`). The model's means are ordinary shell tools.

- :class:`FileMode`: the ``shell`` tool with the context file synced around every command.
- :class:`ManagedFileMode`: file mode with format receipts for malformed calls and, when configured, the
  pressure pass after every step (the mode the registry builds).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import ToolCall, Turn, normalize_turns
from ctxrl.env.ctxfile import parse_context, render_context
from ctxrl.env.mode_config import ModesConfig
from ctxrl.env.modes.base import (
    BAD_ARGUMENT,
    SUBMIT,
    UNKNOWN_TOOL,
    CallOutcome,
    Episode,
    Mode,
    StepNotes,
    format_command_output,
)
from ctxrl.env.modes.common import (
    READ_OVERFLOW_TOOL,
    format_outcome,
    parse_arguments,
    read_overflow,
    unknown_tool,
)
from ctxrl.env.modes.pressure import PressureHooks, PressurePass
from ctxrl.env.monitor import Flag, added_lines, scan
from ctxrl.env.receipts import Receipt, gate_allows, judge_file_edit
from ctxrl.env.sandbox import remove_tree


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


class FileMode(Mode):
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


def genuine_calls_only(parsed: Sequence[Turn], live: Sequence[Turn]) -> list[Turn]:
    """``parsed`` with every tool call and result the harness did not make folded away: a result whose call
    id is not one the live context holds becomes a user note (a model cannot mint a tool result such as a
    forged "ALL TESTS PASSED"), and an invented call is dropped from its assistant turn (its text stays)."""
    known = {i for t in live for i in (t.tool_call_id, *(c.id for c in t.tool_calls)) if i}
    out = []
    for turn in parsed:
        if turn.role == "tool" and turn.tool_call_id not in known:
            turn = Turn("user", turn.content)
        elif turn.role == "assistant" and any(c.id not in known for c in turn.tool_calls):
            turn = replace(turn, tool_calls=tuple(c for c in turn.tool_calls if c.id in known))
        out.append(turn)
    return out


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
    at_least = False
    if data is not None and file_changed:
        new_text = data.decode("utf-8", errors="replace")
        parsed = normalize_turns(genuine_calls_only(parse_context(data), ctx.turns))
        context_changed = tuple(parsed) != ctx.turns  # turns compare without their token counts
        floor = ctx.fewest_tokens(len(parsed))
        if context_changed and not gate_allows(cfg.gate, ctx.tokens, floor, cfg.limit):
            # too many turns to fit whatever they hold: rejected without rendering each one (seconds of
            # harness time for a file of thousands of one-line turns)
            after, at_least = floor, True
        else:
            parsed = ctx.counted(parsed)
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
        at_least=at_least,
    )
    if receipt is not None and receipt.applied:
        ctx.replace_turns(parsed)
    return receipt, new_text


class ManagedFileMode(Mode):
    """File mode, plus format receipts for malformed calls and the optional pressure pass."""

    name = FileMode.name

    def __init__(self, config: ModesConfig, pressure: PressurePass | None = None) -> None:
        self.inner = FileMode()
        self.hooks = PressureHooks(config, pressure)

    def begin_episode(self, episode: Episode) -> None:
        self.hooks.begin_episode(episode)

    def after_step(self, episode: Episode, ending: bool) -> StepNotes:
        return self.hooks.after_step(episode, ending)

    def tool_schemas(self, config: HarnessConfig) -> list[dict[str, Any]]:
        tools = self.inner.tool_schemas(config)
        return [*tools, READ_OVERFLOW_TOOL] if self.hooks.pressure is not None else tools

    def run_call(self, call: ToolCall, episode: Episode) -> CallOutcome:
        shared = self.hooks.shared(episode)
        shared.rounds.record(call.id)
        tools = self.tool_schemas(episode.config)
        if call.name == "read_overflow" and self.hooks.pressure is not None:
            return read_overflow(call, shared)
        if call.name != "shell":
            return unknown_tool(call, tools, episode.context)
        _, problem = parse_arguments(call, tools[0])
        if problem:
            return format_outcome(call.name, problem, episode.context)
        return self.inner.run_call(call, episode)
