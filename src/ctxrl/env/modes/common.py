"""What the managed modes share: tool schemas and argument checks, format receipts, the plain shell, rounds,
per-episode state (the overflow store, events) and the ``read_overflow`` tool.

The hooks a mode may implement are declared, with no-op defaults, on :class:`ctxrl.env.modes.base.Mode`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxrl.env.context import Context, ToolCall, Turn
from ctxrl.env.gate import loads_bounded
from ctxrl.env.mode_config import ModesConfig
from ctxrl.env.modes.base import SUBMIT, CallOutcome, Episode, format_command_output
from ctxrl.env.overflow import OverflowStore
from ctxrl.env.receipts import Receipt, ReceiptKind, gate_allows

Schema = dict[str, Any]

FORMAT_PROBLEM = "[harness] Malformed call to {name}: {problem}."
FORMAT_RECEIPT = "[context] rejected by rule format: {problem}; context unchanged ({tokens} tokens)"
UNKNOWN_TOOL = "unknown tool {name!r}; the tools are: {tools}"


def function_schema(name: str, description: str, properties: Schema, required: Sequence[str] = ()) -> Schema:
    """An OpenAI-style function tool, the shape chat templates render."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(required)},
        },
    }


SHELL_TOOL = function_schema(
    "shell",
    "Run a bash command in the workspace and see its output.",
    {"command": {"type": "string", "description": "the bash command"}},
    ["command"],
)

READ_OVERFLOW_TOOL = function_schema(
    "read_overflow",
    "Read back a body the context no longer holds, by the id in its [overflow id=...] stub.",
    {
        "id": {
            "type": "string",
            "description": "the overflow id (or a unique prefix of at least 8 characters)",
        }
    },
    ["id"],
)


# --- argument checks -------------------------------------------------------------------------------------


def parse_arguments(call: ToolCall, tool: Schema) -> tuple[dict[str, Any], str | None]:
    """The call's arguments checked against the tool's JSON schema: ``(args, None)`` or ``({}, problem)``.

    Checks what our schemas use: a JSON object, required keys, no unknown keys, ``string`` / ``integer`` /
    ``boolean`` / ``array`` types with ``minimum`` / ``maximum`` / ``minLength`` / ``maxLength`` /
    ``minItems`` / ``maxItems``.
    """
    try:
        value = loads_bounded(call.arguments)
    except ValueError:
        return {}, "the arguments are not valid JSON"
    if not isinstance(value, dict):
        return {}, "the arguments must be a JSON object"
    params = tool["function"]["parameters"]
    properties: Mapping[str, Schema] = params["properties"]
    for key in params["required"]:
        if key not in value:
            return {}, f"missing argument {key!r}"
    for key, item in value.items():
        if key not in properties:
            return {}, f"unknown argument {key!r} (arguments: {', '.join(properties) or 'none'})"
        problem = _check_value(item, properties[key], key)
        if problem:
            return {}, problem
    return value, None


def _check_value(value: Any, schema: Schema, path: str) -> str | None:
    kind = schema.get("type")
    if kind == "string":
        if not isinstance(value, str):
            return f"{path} must be a string"
        if len(value) < schema.get("minLength", 0):
            return f"{path} must have at least {schema['minLength']} characters"
        if len(value) > schema.get("maxLength", len(value)):
            return f"{path} must have at most {schema['maxLength']} characters, not {len(value)}"
    elif kind == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return f"{path} must be an integer"
        if not schema.get("minimum", value) <= value <= schema.get("maximum", value):
            return f"{path} must be in [{schema.get('minimum', '-inf')}, {schema.get('maximum', 'inf')}]"
    elif kind == "boolean":
        if not isinstance(value, bool):
            return f"{path} must be true or false"
    elif kind == "array":
        if not isinstance(value, list):
            return f"{path} must be a list"
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
            return f"{path} must have {schema.get('minItems', 0)} to {schema.get('maxItems', 'any')} items"
        for i, item in enumerate(value):
            problem = _check_value(item, schema["items"], f"{path}[{i}]")
            if problem:
                return problem
    return None


def format_outcome(name: str, problem: str, context: Context) -> CallOutcome:
    """A malformed call's outcome: what is wrong, and a format receipt (the context is unchanged)."""
    tokens = context.tokens
    receipt = Receipt(
        ReceiptKind.REJECTED, FORMAT_RECEIPT.format(problem=problem, tokens=tokens), tokens, tokens
    )
    return CallOutcome(FORMAT_PROBLEM.format(name=name, problem=problem), receipt)


def unknown_tool(call: ToolCall, tools: Sequence[Schema], context: Context) -> CallOutcome:
    names = ", ".join([*(t["function"]["name"] for t in tools), SUBMIT])
    return format_outcome(call.name, UNKNOWN_TOOL.format(name=call.name, tools=names), context)


def gated_replace(episode: Episode, turns: Sequence[Turn], what: str) -> Receipt:
    """Apply ``turns`` as the new editable region if the edit gate allows; return the receipt."""
    cfg, ctx = episode.config, episode.context
    before = ctx.tokens
    counted = ctx.counted(turns)
    after = ctx.tokens_of(counted)
    if not gate_allows(cfg.gate, before, after, cfg.limit):
        text = (
            f"[context] rejected by rule {cfg.gate}: {what} would take the context {before} → {after} tokens"
            f" (limit {cfg.limit}); context unchanged"
        )
        return Receipt(ReceiptKind.REJECTED, text, before, after)
    ctx.replace_turns(turns)
    after = ctx.tokens
    if after > before:
        text = f"[context] applied but grew: {what}, {before} → {after} tokens (+{after - before})"
        return Receipt(ReceiptKind.GREW, text, before, after)
    return Receipt(
        ReceiptKind.APPLIED, f"[context] applied: {what}, {before} → {after} tokens", before, after
    )


# --- the plain shell ------------------------------------------------------------------------------------


def run_shell(call: ToolCall, episode: Episode) -> CallOutcome:
    """Run the call's command in the sandbox with no context file (every mode but file mode)."""
    args, problem = parse_arguments(call, SHELL_TOOL)
    if problem:
        return format_outcome(call.name, problem, episode.context)
    command = args["command"]
    if not command.strip():
        return format_outcome(call.name, "command is empty", episode.context)
    return CallOutcome(format_command_output(episode.runner.run(command)))


# --- rounds and per-episode state -----------------------------------------------------------------------


@dataclass
class Rounds:
    """Round (step) numbers, 1-based and monotonic, and the (round, index) of every call's result."""

    current: int = 1
    calls: dict[str, tuple[int, int]] = field(default_factory=dict)
    """call id -> (round, 1-based index of the result within its round)."""

    def record(self, call_id: str) -> None:
        if call_id not in self.calls:
            index = 1 + sum(1 for r, _ in self.calls.values() if r == self.current)
            self.calls[call_id] = (self.current, index)

    def advance(self) -> None:
        self.current += 1


def store_root(workspace: Path, config: ModesConfig) -> Path | None:
    """Where this episode's overflow bodies go (None for memory-only): always outside the workspace."""
    if config.storage == "memory-only":
        return None
    if config.overflow_dir is not None:
        return Path(config.overflow_dir) / workspace.name
    return workspace.parent / f"{workspace.name}.overflow"


@dataclass
class Shared:
    """Per-episode state every managed mode has: the episode, its overflow store, rounds, pending events."""

    episode: Episode
    store: OverflowStore
    rounds: Rounds = field(default_factory=Rounds)
    events: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def begin(cls, episode: Episode, config: ModesConfig) -> Shared:
        return cls(episode, OverflowStore(store_root(episode.workspace, config)))

    def drain_events(self) -> tuple[dict[str, Any], ...]:
        events = tuple(self.events)
        self.events.clear()
        return events


def read_overflow(call: ToolCall, shared: Shared) -> CallOutcome:
    """``read_overflow {id}``: the stored body, or why it cannot be given back."""
    args, problem = parse_arguments(call, READ_OVERFLOW_TOOL)
    if problem:
        return format_outcome(call.name, problem, shared.episode.context)
    ref = args["id"]
    if shared.store.root is None:
        return CallOutcome(f"[read_overflow] {ref}: storage is memory-only, so this body cannot be restored.")
    body = shared.store.get(ref)
    if body is None:
        return CallOutcome(f"[read_overflow] no stored body has the id {ref!r} (give the id of a stub).")
    return CallOutcome(body)


Pinned = Callable[[Turn], bool]


def never_pinned(turn: Turn) -> bool:
    return False
