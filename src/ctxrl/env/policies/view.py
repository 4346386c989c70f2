"""What a scripted policy may look at: the chat messages and tool list a model would be prompted with.

:func:`read_view` turns ``(messages, tools)`` into a :class:`View`: the system prompt (with the skill), the task
text, the editable region as :class:`Item` s in order, the usage block of the signal slot, the latest budget readout and the offered tool
names (those of the tool list, and the context tools an offer note in the region announces: tools mode
offers them mid-episode by a note, not in the tool list). Nothing else reaches a policy, so whatever a policy knows is in its context; if a manager drops a value
from the context, the policy has lost it.

Actions go back as text in the chat-template tool-call format (:func:`render_action`), the same text a model
generates, so the policies can teach a model by supervised warm start.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ctxrl.env.actions import parse_tool_calls
from ctxrl.env.gate import loads_bounded
from ctxrl.env.modes import EDIT_TOOLS
from ctxrl.env.modes.tools import RESULT_TAG_RE, announced_tools

READOUT_RE = re.compile(r"\[context: (\d+)/(\d+) tokens \(\d+% of the limit\)\]")
STATUS_RE = re.compile(r"\[context_status\] ([\d,]+) / ([\d,]+) tokens")
"""The usage line of a ``context_status`` result (tools mode, which shows no readout)."""
USAGE_HEADER = "Context Usage:"
_CONTEXT_FILE = re.compile(r"is the file (\S+), one \[\[CTX_TURN")
STUB_PREFIX = "[overflow id="
FACTS_HEADER = "[kept facts]"
"""First line of every block of kept facts a manager writes (a note, a context file turn, prose)."""


@dataclass(frozen=True)
class Call:
    """One tool call of an action: the function name and its arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def render(self) -> str:
        """The call in the chat-template format the environment parses (:mod:`ctxrl.env.actions`)."""
        return "<tool_call>" + json.dumps({"name": self.name, "arguments": self.arguments}) + "</tool_call>"


@dataclass(frozen=True)
class Item:
    """One message of the editable region (or the signal slot)."""

    role: str
    """``assistant``, ``tool`` or ``user`` (harness notes and kept-facts notes are user messages)."""
    text: str
    calls: tuple[tuple[str, Call], ...] = ()
    """An assistant message's tool calls as (call id, call)."""
    call_id: str | None = None
    """A tool result's call id."""
    name: str | None = None
    """A tool result's tool name."""

    @property
    def is_stub(self) -> bool:
        """A result whose body was moved to the overflow store (only its stub line is left)."""
        return self.text.lstrip().startswith(STUB_PREFIX)


@dataclass(frozen=True)
class View:
    """A policy's whole input, parsed. ``items`` excludes the system prompt, the task and the signal slot."""

    task: str
    items: tuple[Item, ...]
    tools: frozenset[str]
    signal: str | None = None
    """The usage block (usage mode, above its threshold), else None."""
    tokens: int | None = None
    """Context size of the latest budget readout, if any readout is in view."""
    limit: int | None = None
    context_file: str = "context.md"
    """The context file file mode mirrors the region to (named in the ``shell`` tool's description)."""
    system: str = ""
    """The system prompt (base instructions and the skill), without the tool list."""
    tools_chars: int = 0
    """Characters of the tool list as JSON (a fixed part of every prompt)."""
    measured_chars: int | None = None
    """Where ``tokens`` came from a ``context_status`` result: the characters of the prompt (tools, system, task
    and region) up to it. The prompt has changed since; :attr:`fill` scales the reading by its length."""

    @property
    def fill(self) -> float:
        """The latest reading as a fraction of the limit (0.0 before the first): the readout, or a
        ``context_status`` reading scaled by how much the region's text has grown since it was taken."""
        if self.tokens is None or not self.limit:
            return 0.0
        if self.measured_chars:
            return self.tokens / self.limit * self.prompt_chars() / self.measured_chars
        return self.tokens / self.limit

    def prompt_chars(self, end: int | None = None) -> int:
        """Characters of the tool list, the system prompt, the task and the region's texts (``items[:end]``)."""
        fixed = self.tools_chars + len(self.system) + len(self.task)
        return fixed + sum(len(i.text) for i in self.items[:end])

    def last_calls(self) -> tuple[str, ...]:
        """Names of the latest assistant message's tool calls."""
        last = next((i for i in reversed(self.items) if i.role == "assistant"), None)
        return tuple(call.name for _, call in last.calls) if last is not None else ()

    def texts(self) -> Iterator[str]:
        """Every text of the region in order: message contents (assistant prose included); no call arguments."""
        for item in self.items:
            if item.text:
                yield item.text

    def calls(self) -> Iterator[tuple[int, str, Call]]:
        """Every tool call the policy made that is still in view, as (item index, call id, call)."""
        for index, item in enumerate(self.items):
            for call_id, call in item.calls:
                yield index, call_id, call

    def result_of(self, call_id: str) -> Item | None:
        """The tool result answering ``call_id``, if it is in view."""
        return next((i for i in self.items if i.role == "tool" and i.call_id == call_id), None)

    def last_action_edited(self) -> bool:
        """True if the latest assistant message edited the context: a call of a mode's context-editing tool
        (:data:`ctxrl.env.modes.EDIT_TOOLS`), or a shell command that writes kept facts (file mode)."""
        last = next((i for i in reversed(self.items) if i.role == "assistant"), None)
        if last is None:
            return False
        return any(_is_edit(call) for _, call in last.calls)


def _is_edit(call: Call) -> bool:
    if call.name in EDIT_TOOLS:
        return True
    command = call.arguments.get("command")
    return call.name == "shell" and isinstance(command, str) and FACTS_HEADER in command


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, str):
        try:
            value = loads_bounded(raw)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}
    return {}


def read_view(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> View:
    """Parse the prompt a model would see: messages ``[system, task, *region, signal?]`` and the tool list."""
    if len(messages) < 2:
        raise ValueError("a prompt has at least the system message and the task")
    task = str(messages[1].get("content") or "")
    region = list(messages[2:])
    signal = None
    if (
        region
        and region[-1].get("role") == "user"
        and str(region[-1].get("content") or "").startswith(USAGE_HEADER)
    ):
        signal = str(region.pop()["content"])
    items = []
    for message in region:
        role = str(message.get("role") or "user")
        calls = tuple(
            (str(raw.get("id") or ""), Call(str(fn.get("name") or ""), _arguments(fn.get("arguments"))))
            for raw in message.get("tool_calls") or ()
            for fn in [raw.get("function", raw)]
        )
        items.append(
            Item(
                role=role,
                text=str(message.get("content") or ""),
                calls=calls,
                call_id=message.get("tool_call_id"),
                name=message.get("name"),
            )
        )
    tokens = limit = measured = None
    for index in range(len(items) - 1, -1, -1):
        text = items[index].text
        found = READOUT_RE.findall(text)
        status = STATUS_RE.findall(text)
        if found:
            tokens, limit = int(found[-1][0]), int(found[-1][1])
            break
        if status:
            tokens, limit = (int(x.replace(",", "")) for x in status[-1])
            measured = index + 1  # made a character count below, once the system prompt is known
            break
    names = frozenset(str(t.get("function", t).get("name") or "") for t in tools).union(
        *(announced_tools(item.text) for item in items if item.role == "user")
    )
    descriptions = " ".join(str(t.get("function", t).get("description") or "") for t in tools)
    named = _CONTEXT_FILE.search(descriptions)
    context_file = named.group(1) if named else "context.md"
    system = str(messages[0].get("content") or "")
    view = View(
        task, tuple(items), names, signal, tokens, limit, context_file, system, len(json.dumps(tools))
    )
    return view if measured is None else replace(view, measured_chars=view.prompt_chars(measured))


_MESSAGE = re.compile(r"<\|im_start\|>([a-z]+)\n(.*?)<\|im_end\|>\n", re.DOTALL)
_TOOLS_BLOCK = re.compile(r"\n\n# Tools\n<tools>\n(.*?)</tools>\n[^\n]*\Z", re.DOTALL)
_RESPONSE = re.compile(r"\A<tool_response>\n(.*)\n</tool_response>\Z", re.DOTALL)


def parse_prompt(text: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The messages and tools a ChatML prompt was rendered from, as far as the text shows them.

    Tool calls come back from their ``<tool_call>`` markup; a tool result is paired with the calls of the
    assistant message before it, in order (the harness appends one result per call), and gets that call's
    name and a positional call id (``c<message>.<call>``): the template renders no call ids, so no handle
    the model cannot see reaches a policy. The system message's tool list becomes the tools.
    """
    messages: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (call id, name) of the last assistant message's unanswered calls
    for role, content in _MESSAGE.findall(text):
        if role == "system" and not messages:
            block = _TOOLS_BLOCK.search(content)
            if block is not None:
                tools = [loads_bounded(line) for line in block.group(1).splitlines() if line.strip()]
                content = content[: block.start()]
            messages.append({"role": "system", "content": content})
        elif role == "assistant":
            prose, calls = parse_tool_calls(content)
            ids = [f"c{len(messages)}.{i}" for i in range(len(calls))]
            messages.append(
                {
                    "role": "assistant",
                    "content": prose,
                    "tool_calls": [
                        {"id": i, "function": {"name": c.name, "arguments": c.arguments}}
                        for i, c in zip(ids, calls)
                    ],
                }
            )
            pending = [(i, c.name) for i, c in zip(ids, calls)]
        elif role == "tool":
            body = _RESPONSE.match(content)
            call_id, name = pending.pop(0) if pending else (None, None)
            messages.append(
                {
                    "role": "tool",
                    "content": body.group(1) if body else content,
                    "tool_call_id": call_id,
                    "name": name,
                }
            )
        else:
            pending = []
            messages.append({"role": role, "content": content})
    return messages, tools


def read_prompt(text: str) -> View:
    """The :class:`View` of a prompt given as text (see :func:`parse_prompt`)."""
    messages, tools = parse_prompt(text)
    return read_view(messages, tools)


def render_action(calls: Sequence[Call], prose: str = "") -> str:
    """The generated text of one action: optional prose, then the calls."""
    parts = [prose.strip()] if prose.strip() else []
    parts += [call.render() for call in calls]
    return "\n".join(parts)


def facts_block(facts: Sequence[str]) -> str:
    """The kept facts as one block of text: the header line, then one fact per line."""
    return "\n".join([FACTS_HEADER, *facts])


@dataclass(frozen=True)
class Plan:
    """A solver's decision for the next step: the task action, and the facts worth keeping.

    ``facts`` are lines the same solver reads back (a manager writes them verbatim into a note, the context
    file or its own prose), so a compacted context still holds everything the solver relies on.
    """

    calls: tuple[Call, ...]
    facts: tuple[str, ...] = ()


_TURN_HEADER = re.compile(r"\ATurn #\d+\n[\d,]+ tokens\n----\n")


def strip_turn_header(text: str) -> str:
    """A tool result's text without the header its mode puts on it: usage mode's ``Turn #r`` block, or tools
    mode's handle tag ``[r<round>.<i>]``."""
    return RESULT_TAG_RE.sub("", _TURN_HEADER.sub("", text, count=1), count=1)


def result_handle(text: str) -> str | None:
    """The handle tools mode shows on the first line of a tool result (``r3.1`` of ``[r3.1]``), else None."""
    match = RESULT_TAG_RE.match(text)
    return match.group(1) if match else None
