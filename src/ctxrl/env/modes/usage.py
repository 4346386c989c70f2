"""``usage`` mode (seed 001): a context-usage signal, file-view eviction, and a searchable thread archive.

Tools: ``shell``, ``read_file {path, start_line?, max_lines?}``; ``evict_file_view {path?}`` when eviction is
granted; ``archive_thread {ranges}`` and ``search_archive {query}`` together when archiving is granted
(``read_overflow`` too when the pressure pass runs underneath).

**Categories** of the usage block, in this fixed order (a category holding nothing is left out):
System Prompt (the system message with the tool schemas and the generation prompt), Task Prompt, Your
Messages (assistant turns), Tool Output (tool results that are not file views, and the harness's notes),
File Views (results of ``read_file``, and of the task tools that read a document, ``ToolSpec.view``: a report,
a corpus document, a page of a spec, keyed by the document's path or id, and shown to the model on the
result's first line, ``File view: <key>``; a failed read is no view; a shell ``cat`` is Tool Output). Our message model has no text views,
so that band never appears. Shares are of the limit (budget − reserve: the window less what is held back),
the same figure the threshold reads; the block is computed without itself.

**Signal slot**: the block is the text of one slot rendered after the conversation, rebuilt after every
step (never two); below ``threshold_pct`` there is none.

**Turn numbers**: round r (the r-th model call of the episode, 1-based, never renumbered) is ``Turn #r``.
When archiving is granted each tool result starts with ``Turn #r`` / ``<n> tokens`` (the result without the
header) / ``----``. ``archive_thread`` removes a turn's results (into the archive) and the assistant message
that made the calls (not archived); the task and system prompt are never in reach.

**Locked** specifications: the paths in ``modes.usage.locked_paths``; their views are never evicted or listed.

Each reclaim (evict, archive) records ``{"type": "ContextManaged", "action", "reclaimed_tokens",
"items_removed", "earliest_position", "detail"}``; ``earliest_position`` is the 0-based index of the earliest
removed item in the editable region.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxrl.env.budget import BudgetFeatures, Means
from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import Context, ToolCall, Turn
from ctxrl.env.mode_config import ModesConfig, UsageModeConfig
from ctxrl.env.modes.base import CallOutcome, Episode, Mode, StepNotes
from ctxrl.env.modes.common import (
    READ_OVERFLOW_TOOL,
    SHELL_TOOL,
    Schema,
    Shared,
    format_outcome,
    function_schema,
    never_pinned,
    parse_arguments,
    read_overflow,
    run_shell,
    unknown_tool,
)
from ctxrl.env.modes.file import read_context_file
from ctxrl.env.modes.pressure import PressurePass
from ctxrl.env.receipts import Receipt, ReceiptKind
from ctxrl.env.sandbox import SANDBOX_WORKDIR

MAX_RANGES = 32
MAX_SEARCH_RESULTS = 8
HEADER = "Turn #{turn}\n{tokens:,} tokens\n----\n"
VIEW_HEAD = "File view: {key}\n"
"""First line of a task tool's document view (after the turn header): the key ``evict_file_view`` takes."""
_FAILED = re.compile(r"\n\[(?:exit code \d+|timed out [^\]\n]*)\]\Z")
"""The status line :func:`ctxrl.env.modes.base.format_command_output` ends a failed command's output with."""
EVICTED = "[file view evicted: {path}; the file is unchanged, read it again with {tool}]"
CATEGORIES = ("System Prompt", "Task Prompt", "Your Messages", "Tool Output", "File Views")
EVICT_LINE = (
    "evict_file_view {path}: drop the views of a file; it is unchanged on disk and can be read again."
)
ARCHIVE_LINE = (
    "archive_thread {ranges}: move whole turns (the Turn # on your results) to the archive; "
    "search_archive {query} finds them again."
)

READ_FILE_TOOL = function_schema(
    "read_file",
    "Read a workspace file (or a page of it) into the context.",
    {
        "path": {"type": "string", "minLength": 1, "description": "path relative to the workspace"},
        "start_line": {"type": "integer", "minimum": 1, "description": "first line (default 1)"},
        "max_lines": {"type": "integer", "minimum": 1, "description": "lines to read (default: all)"},
    },
    ["path"],
)
EVICT_TOOL = function_schema(
    "evict_file_view",
    "Drop file views from the context (every page of one path, or with no path every view).",
    {
        "path": {
            "type": "string",
            "minLength": 1,
            "description": "the path to evict; omit to evict every view",
        }
    },
)
ARCHIVE_TOOL = function_schema(
    "archive_thread",
    "Archive whole turns by the numbers on the turn headers: inclusive [from, to] pairs.",
    {
        "ranges": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_RANGES,
            "items": {
                "type": "array",
                "items": {"type": "integer", "minimum": 1},
                "minItems": 2,
                "maxItems": 2,
            },
            "description": "inclusive [from, to] turn ranges, e.g. [[4, 19], [22, 25]]",
        }
    },
    ["ranges"],
)
SEARCH_TOOL = function_schema(
    "search_archive",
    "Search the archived turns (case-insensitive substring); returns up to 8 entries in full.",
    {"query": {"type": "string", "minLength": 1, "description": "text to look for"}},
    ["query"],
)


def normalize_path(path: str) -> str:
    """A workspace path in one spelling: relative, normalised, sandbox prefix removed."""
    path = path.strip()
    if path.startswith(SANDBOX_WORKDIR + "/"):
        path = path[len(SANDBOX_WORKDIR) + 1 :]
    return posixpath.normpath(path.lstrip("/")) if path else path


@dataclass(frozen=True)
class ArchiveEntry:
    """One archived tool result, with the call that produced it."""

    ordinal: int
    turn: int
    tool: str
    arguments: str
    text: str

    def searchable(self) -> str:
        return f"{self.tool} {self.arguments}\n{self.text}".lower()


@dataclass
class UsageState:
    shared: Shared
    file_views: dict[str, str] = field(default_factory=dict)
    """Call id of a live file view (a ``read_file`` or document-reading task tool result) -> its key (the
    normalised path, or the task tool's document key)."""
    view_tools: dict[str, str] = field(default_factory=dict)
    """Call id of a live file view -> the tool that read it (named in the eviction stub)."""
    announced: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Call id of a task tool call about to run -> (document key, tool): a view if it succeeds."""
    archive: list[ArchiveEntry] = field(default_factory=list)


class UsageMode(Mode):
    """Agent-managed context; see the module docstring for categories, headers and grants."""

    name = "usage"
    budget = BudgetFeatures(readout=False, nudges=False, rollback=False, pressure="default")
    """Seed 001: the usage block (above its threshold) is the only signal; compaction (the pressure pass's
    fold, no spill) is the automatic backstop, not a rollback."""

    def __init__(self, config: ModesConfig, pressure: PressurePass | None = None) -> None:
        self.config = config
        self.pressure = pressure
        self._state: UsageState | None = None

    @property
    def ucfg(self) -> UsageModeConfig:
        return self.config.usage

    # --- hooks -------------------------------------------------------------------------------------------

    def begin_episode(self, episode: Episode) -> None:
        self._state = UsageState(Shared.begin(episode, self.config))

    def state(self, episode: Episode) -> UsageState:
        if self._state is None or self._state.shared.episode is not episode:
            self.begin_episode(episode)
        assert self._state is not None
        return self._state

    def after_step(self, episode: Episode, ending: bool) -> StepNotes:
        state = self.state(episode)
        shared = state.shared
        shared.rounds.advance()
        edited = False
        if self.pressure is not None and not ending:
            result = self.pressure.apply(episode, shared.store, never_pinned)
            if result.changed:
                shared.events.append(result.event(shared.rounds.current - 1))
                edited = True
        return StepNotes((), shared.drain_events(), edited)

    def means(self, config: HarnessConfig) -> Means:
        ways = []
        if self.ucfg.evict:
            ways.append("evict file views you can re-read (evict_file_view)")
        if self.ucfg.archive:
            ways.append("archive finished turns (archive_thread)")
        if not ways:
            ways.append("keep outputs short (head, grep, wc)")
        said = " and ".join(ways)
        return Means(
            tidy=said,
            compact=f"In one step, {said}; write the exact values you still need in your own message first.",
            compact_now=f"{said[0].upper()}{said[1:]} now.",
            condense=f"{said[0].upper()}{said[1:]}",
        )

    def signal(self, episode: Episode) -> str | None:
        """The usage block for the signal slot, or None below the threshold."""
        state = self.state(episode)
        return usage_block(episode.context, episode.config, self.ucfg, self._live_views(episode, state))

    # --- tools -------------------------------------------------------------------------------------------

    def tool_schemas(self, config: HarnessConfig) -> list[dict[str, Any]]:
        tools: list[Schema] = [SHELL_TOOL, READ_FILE_TOOL]
        if self.ucfg.evict:
            tools.append(EVICT_TOOL)
        if self.ucfg.archive:
            tools += [ARCHIVE_TOOL, SEARCH_TOOL]
        if self.pressure is not None:
            tools.append(READ_OVERFLOW_TOOL)
        return tools

    def run_call(self, call: ToolCall, episode: Episode) -> CallOutcome:
        state = self.state(episode)
        state.shared.rounds.record(call.id)
        offered = {t["function"]["name"] for t in self.tool_schemas(episode.config)}
        if call.name not in offered:
            return unknown_tool(call, self.tool_schemas(episode.config), episode.context)
        handlers = {
            "shell": lambda: run_shell(call, episode),
            "read_file": lambda: self._read_file(call, episode, state),
            "evict_file_view": lambda: self._evict(call, episode, state),
            "archive_thread": lambda: self._archive(call, episode, state),
            "search_archive": lambda: self._search(call, episode, state),
            "read_overflow": lambda: read_overflow(call, state.shared),
        }
        outcome = handlers[call.name]()
        if call.id in state.announced:
            key, tool = state.announced.pop(call.id)
            if not _FAILED.search(outcome.output):
                state.file_views[call.id], state.view_tools[call.id] = key, tool
                outcome = CallOutcome(
                    VIEW_HEAD.format(key=key) + outcome.output,
                    outcome.receipt,
                    outcome.context_only,
                    outcome.flags,
                )
        if not self.ucfg.archive:
            return outcome
        tokens = episode.context.counter.count_turn(
            Turn("tool", outcome.output, tool_call_id=call.id, name=call.name)
        )
        header = HEADER.format(turn=state.shared.rounds.current, tokens=tokens)
        return CallOutcome(header + outcome.output, outcome.receipt, outcome.context_only, outcome.flags)

    def file_view(self, episode: Episode, call_id: str, key: str, tool: str) -> None:
        """The next call ``call_id`` reads the document ``key``: its result, if the command succeeds, is a
        file view (see the module docstring)."""
        self.state(episode).announced[call_id] = (normalize_path(key), tool)

    def _live_views(self, episode: Episode, state: UsageState) -> dict[str, str]:
        """File views still in the context (call id -> path)."""
        live = {t.tool_call_id for t in episode.context.turns if t.role == "tool"}
        return {cid: p for cid, p in state.file_views.items() if cid in live}

    def _read_file(self, call: ToolCall, episode: Episode, state: UsageState) -> CallOutcome:
        args, problem = parse_arguments(call, READ_FILE_TOOL)
        if problem:
            return format_outcome(call.name, problem, episode.context)
        path = normalize_path(args["path"])
        text, error = read_workspace_file(episode.workspace, path, episode.config.sandbox.max_output_bytes)
        if text is None:
            return CallOutcome(f"[read_file] {path}: {error}")
        lines = text.splitlines()
        start = args.get("start_line", 1)
        count = args.get("max_lines", max(len(lines) - start + 1, 0))
        page = lines[start - 1 : start - 1 + count]
        end = start + len(page) - 1
        state.file_views[call.id] = path
        state.view_tools[call.id] = "read_file"
        head = (
            f"File: {path}:{start}-{end} of {len(lines)} lines"
            if page
            else f"File: {path}: no lines from {start} (of {len(lines)})"
        )
        return CallOutcome("\n".join([head, *page]))

    def _evict(self, call: ToolCall, episode: Episode, state: UsageState) -> CallOutcome:
        args, problem = parse_arguments(call, EVICT_TOOL)
        if problem:
            return format_outcome(call.name, problem, episode.context)
        ctx = episode.context
        locked = {normalize_path(p) for p in self.ucfg.locked_paths}
        views = self._live_views(episode, state)
        target = normalize_path(args["path"]) if "path" in args else None
        if target is not None and target in locked:
            tokens = ctx.tokens
            text = f"[context] rejected by rule locked: {target} is a locked specification ({tokens} tokens)"
            return CallOutcome(
                f"[evict_file_view] {target} is a locked specification; it is never evicted.",
                Receipt(ReceiptKind.REJECTED, text, tokens, tokens),
            )
        chosen = {cid for cid, p in views.items() if p not in locked and (target is None or p == target)}
        turns = list(ctx.turns)
        positions = [i for i, t in enumerate(turns) if t.role == "tool" and t.tool_call_id in chosen]
        if not positions:
            what = f"no view of {target} is open" if target else "no file view is open"
            tokens = ctx.tokens
            receipt = Receipt(
                ReceiptKind.MATCHED_NOTHING,
                f"[context] matched nothing: {what} ({tokens} tokens)",
                tokens,
                tokens,
            )
            return CallOutcome(f"[evict_file_view] {what}.", receipt)
        before = ctx.tokens
        for i in positions:
            t = turns[i]
            cid = t.tool_call_id or ""
            stub = EVICTED.format(path=views[cid], tool=state.view_tools.pop(cid, "read_file"))
            turns[i] = Turn("tool", stub, (), t.tool_call_id, t.name)
            state.file_views.pop(cid, None)
        ctx.replace_turns(turns)
        freed = before - ctx.tokens
        paths = sorted({views[turns[i].tool_call_id or ""] for i in positions})
        detail = f"evicted {len(positions)} view(s) of {', '.join(paths)}"
        state.shared.events.append(_managed("evict_file_views", freed, len(positions), positions[0], detail))
        receipt = Receipt(
            ReceiptKind.APPLIED,
            f"[context] applied: {detail}, {before} → {ctx.tokens} tokens",
            before,
            ctx.tokens,
        )
        return CallOutcome(f"[evict_file_view] {detail}; {freed:,} tokens reclaimed.", receipt, True)

    def _archive(self, call: ToolCall, episode: Episode, state: UsageState) -> CallOutcome:
        args, problem = parse_arguments(call, ARCHIVE_TOOL)
        if problem:
            return format_outcome(call.name, problem, episode.context)
        ranges = [(a, b) for a, b in args["ranges"]]
        reversed_ = [f"[{a}, {b}]" for a, b in ranges if a > b]
        ctx = episode.context
        if reversed_:
            return format_outcome(
                call.name, f"reversed range {', '.join(reversed_)} (write [from, to] with from <= to)", ctx
            )
        named = {n for a, b in ranges for n in range(a, min(b, state.shared.rounds.current) + 1)}
        calls = state.shared.rounds.calls
        turns = list(ctx.turns)
        doomed: set[int] = set()
        emptied: set[int] = set()
        entries = []
        for i, t in enumerate(turns):
            if t.role != "assistant" or not t.tool_calls:
                continue
            rounds_of = {calls[c.id][0] for c in t.tool_calls if c.id in calls}
            if not rounds_of & named:
                continue
            emptied |= rounds_of & named
            doomed.add(i)
            by_id = {c.id: c for c in t.tool_calls}
            for j in range(i + 1, len(turns)):
                if turns[j].role != "tool" or turns[j].tool_call_id not in by_id:
                    break
                doomed.add(j)
                c = by_id[turns[j].tool_call_id or ""]
                entries.append((calls.get(c.id, (0, 0))[0], c, turns[j]))
        missing = _spans(sorted(named - emptied), none="")
        current = state.shared.rounds.current
        if any(b >= current for _, b in ranges):  # this turn and later ones have no results yet
            missing = ", ".join(x for x in (missing, f"{current} and later") if x)
        if not doomed:
            tokens = ctx.tokens
            what = f"turn(s) {missing} are not in the window"
            receipt = Receipt(
                ReceiptKind.MATCHED_NOTHING,
                f"[context] matched nothing: {what} ({tokens} tokens)",
                tokens,
                tokens,
            )
            self_note = f"[archive_thread] nothing archived: {what}."
            return CallOutcome(self_note, receipt)
        before = ctx.tokens
        for turn_no, c, result in entries:
            state.archive.append(
                ArchiveEntry(len(state.archive) + 1, turn_no, c.name, c.arguments, result.content)
            )
        ctx.replace_turns([t for i, t in enumerate(turns) if i not in doomed])
        freed = before - ctx.tokens
        detail = f"archived turn(s) {_spans(sorted(emptied))} ({len(entries)} result(s))"
        state.shared.events.append(_managed("archive_thread", freed, len(doomed), min(doomed), detail))
        out = f"[archive_thread] {detail}; {freed:,} tokens reclaimed."
        if missing:
            out += f" Not in the window: {missing}."
        receipt = Receipt(
            ReceiptKind.APPLIED,
            f"[context] applied: {detail}, {before} → {ctx.tokens} tokens",
            before,
            ctx.tokens,
        )
        return CallOutcome(out, receipt, True)

    def _search(self, call: ToolCall, episode: Episode, state: UsageState) -> CallOutcome:
        args, problem = parse_arguments(call, SEARCH_TOOL)
        if problem:
            return format_outcome(call.name, problem, episode.context)
        query = args["query"].lower()
        hits = [e for e in state.archive if query in e.searchable()]
        shown = hits[:MAX_SEARCH_RESULTS]
        head = f"[search_archive] {len(hits)} matching entr{'y' if len(hits) == 1 else 'ies'}"
        if len(hits) > len(shown):
            head += f", the first {len(shown)} shown"
        blocks = [f"#{e.ordinal} (turn {e.turn}) {e.tool} {e.arguments}\n{e.text}" for e in shown]
        return CallOutcome("\n\n".join([head, *blocks]))


def read_workspace_file(workspace: Path, path: str, max_bytes: int) -> tuple[str | None, str]:
    """A workspace file's text, or ``(None, why not)``. Never reads outside the workspace: the resolved
    path (symlinks followed) must stay inside it, and the file itself is opened without following a link."""
    if not path or path.startswith(".."):
        return None, "not a path inside the workspace"
    root = Path(os.path.realpath(workspace))
    full = Path(os.path.realpath(workspace / path))
    if full != root and root not in full.parents:
        return None, "not a path inside the workspace"
    data, problem = read_context_file(full, max_bytes)
    if data is None:
        return None, f"the file {problem}"
    return data.decode("utf-8", errors="replace"), ""


def _managed(action: str, freed: int, items: int, earliest: int, detail: str) -> dict[str, Any]:
    return {
        "type": "ContextManaged",
        "action": action,
        "reclaimed_tokens": freed,
        "items_removed": items,
        "earliest_position": earliest,
        "detail": detail,
    }


def _spans(numbers: Sequence[int], none: str = "none") -> str:
    """``[1, 2, 3, 5]`` -> ``1-3, 5``."""
    out: list[str] = []
    for n in numbers:
        if out and out[-1].split("-")[-1] == str(n - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ", ".join(out) or none


def category_tokens(ctx: Context, views: dict[str, str]) -> dict[str, int]:
    """Raw tokens per category (see the module docstring), in the fixed order."""
    task = ctx.counter.count_turn(Turn("user", ctx.task))
    out = dict.fromkeys(CATEGORIES, 0)
    out["System Prompt"] = ctx.prefix_tokens - task
    out["Task Prompt"] = task
    for t in ctx.turns:
        if t.role == "assistant":
            out["Your Messages"] += t.tokens
        elif t.role == "tool" and t.tool_call_id in views:
            out["File Views"] += t.tokens
        else:
            out["Tool Output"] += t.tokens
    return out


def usage_block(
    ctx: Context, config: HarnessConfig, ucfg: UsageModeConfig, views: dict[str, str]
) -> str | None:
    """The context-usage block, or None while usage is under ``ucfg.threshold_pct``."""
    scale = ctx.calibration_ratio * 100 / config.limit
    per = category_tokens(ctx, views)
    overall = sum(per.values()) * scale
    if overall < ucfg.threshold_pct:
        return None
    lines = ["Context Usage:", f"- Overall: {overall:.1f}%"]
    for name, tokens in per.items():
        if tokens <= 0:
            continue
        lines.append(f"- {name}: {tokens * scale:.1f}%")
        if name == "File Views" and ucfg.evict:
            lines += _top_views(ctx, views, ucfg, scale)
    if ucfg.evict:
        lines.append(EVICT_LINE)
    if ucfg.archive:
        lines.append(ARCHIVE_LINE)
    return "\n".join(lines)


def _top_views(ctx: Context, views: dict[str, str], ucfg: UsageModeConfig, scale: float) -> list[str]:
    locked = {normalize_path(p) for p in ucfg.locked_paths}
    per_path: dict[str, int] = {}
    for t in ctx.turns:
        path = views.get(t.tool_call_id or "")
        if t.role == "tool" and path is not None and path not in locked:
            per_path[path] = per_path.get(path, 0) + t.tokens
    top = sorted(per_path.items(), key=lambda kv: (-kv[1], kv[0]))[: ucfg.top_file_views]
    if not top:
        return []
    return ["- Top File Views:", *(f"  - `{path}`: {tokens * scale:.1f}%" for path, tokens in top)]
