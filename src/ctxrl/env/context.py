"""The context model: a pinned prefix and an editable region of turns, counted in the policy's tokens.

- **Pinned prefix**: the system prompt (which holds the skill) and the task. Set once per episode; no action
  can change it, and it is never rendered into the context file.
- **Editable region**: a list of :class:`Turn` (role ``user`` / ``assistant`` / ``tool``). Assistant turns
  may carry tool calls; each tool call is followed directly by the ``tool`` turn that holds its result.

Structural legality (:func:`normalize_turns`, applied to every parse-back and every replacement):

1. Emptied turns (whitespace only, no tool calls) are dropped.
2. A tool call is never separated from its result. A call whose result is gone keeps a stub result
   (:data:`STUB_RESULT`): the model keeps the record that it ran the call, at a cost of a few tokens. A result
   whose call is gone is folded into a ``user`` turn with its text unchanged, so nothing it held is lost.
   A result placed elsewhere is moved back directly after its call; a duplicated call id keeps its first call.
3. Adjacent ``user`` turns, and adjacent ``assistant`` turns (the first without tool calls), are merged.

Token counts use the policy's tokenizer and chat template (:class:`ChatTemplateCounter`), one count per turn,
cached by the turn's content, so a step at 32k tokens only tokenises the turns that are new or edited. Text
that spells one of the tokenizer's special tokens is counted, like it is rendered, neutralised
(:mod:`ctxrl.env.special`): it never becomes a control token.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal, Protocol

from ctxrl.env.gate import loads_bounded
from ctxrl.env.special import neutral_messages, special_spellings

Role = Literal["user", "assistant", "tool"]

STUB_RESULT = "(result removed from the context)"
"""Content of the stub that replaces a deleted tool result whose call was kept."""

_SAFE_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """``text`` with every lone surrogate (a code point no UTF-8 text can hold) replaced by U+FFFD.

    Model output decoded leniently, or JSON with a ``\\ud800`` escape, can carry them; tokenizers, files and
    programs all reject them.

    >>> valid_text("a\\ud800b")
    'a\ufffdb'
    """
    return _SURROGATE.sub("\ufffd", text) if not text.isascii() else text


def safe_identifier(text: str) -> bool:
    """True if ``text`` can appear in a turn header as a tool-call id or tool name (no spaces or brackets)."""
    return _SAFE_ID.fullmatch(text) is not None


def canonical_json(arguments: Mapping[str, Any]) -> str:
    """The one JSON spelling of tool-call arguments used in turns, files and messages; always valid text (a
    lone surrogate in a value, say from a ``\\ud800`` escape, becomes U+FFFD)."""
    return valid_text(json.dumps(dict(arguments), ensure_ascii=False, sort_keys=True))


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def valid_arguments(text: str) -> str:
    """Tool-call arguments text that neither holds nor decodes to a lone surrogate.

    Text without a surrogate escape is returned as is (only raw surrogates replaced); with one, it is
    re-spelled through :func:`canonical_json` when it parses.
    """
    text = valid_text(text)
    if _SURROGATE_ESCAPE.search(text) is None:
        return text
    try:
        value = loads_bounded(text)
        return canonical_json(value) if isinstance(value, dict) else text
    except ValueError:
        return text


@dataclass(frozen=True)
class ToolCall:
    """One tool call of an assistant turn; ``arguments`` is the canonical JSON object text."""

    id: str
    name: str
    arguments: str = "{}"

    @classmethod
    def make(cls, id: str, name: str, arguments: Mapping[str, Any]) -> ToolCall:
        return cls(id=id, name=name, arguments=canonical_json(arguments))

    def args(self) -> dict[str, Any]:
        """The arguments as a dict (``{}`` if the stored text is not a JSON object, or nests too deep to read)."""
        try:
            value = loads_bounded(self.arguments)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Turn:
    """One message of the editable region. ``tokens`` is filled in by :class:`Context` and not compared."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    """Calls of an assistant turn, in order; each is answered by the tool turn(s) that follow."""
    tool_call_id: str | None = None
    """Tool turns: the id of the call this result answers."""
    name: str | None = None
    """Tool turns: the tool's name."""
    tokens: int = field(default=0, compare=False)
    """Tokens this turn adds to the prompt (chat template included); 0 until counted."""


def _is_empty(turn: Turn) -> bool:
    return not turn.content.strip() and not turn.tool_calls


def _join(a: str, b: str) -> str:
    return f"{a}\n{b}" if a and b else a or b


def normalize_turns(turns: Iterable[Turn]) -> list[Turn]:
    """Make a turn list structurally legal (see the module docstring); idempotent."""
    kept = [t for t in turns if not _is_empty(t)]
    return _merge_adjacent(_pair_tool_calls(kept))


def _pair_tool_calls(turns: list[Turn]) -> list[Turn]:
    first_result: dict[str, int] = {}
    for i, t in enumerate(turns):
        if t.role == "tool" and t.tool_call_id is not None:
            first_result.setdefault(t.tool_call_id, i)
    placed: set[int] = set()
    seen_calls: set[str] = set()
    out: list[Turn] = []
    for i, t in enumerate(turns):
        if t.role == "tool":
            if i not in placed:  # its call is gone (or comes later): keep the text as a user note
                out.append(Turn("user", t.content))
            continue
        if t.role != "assistant" or not t.tool_calls:
            out.append(Turn(t.role, t.content, tokens=t.tokens) if t.role == "user" else t)
            continue
        calls = []
        for call in t.tool_calls:
            if call.id not in seen_calls:
                seen_calls.add(call.id)
                calls.append(call)
        if not calls and not t.content.strip():
            continue
        out.append(t if len(calls) == len(t.tool_calls) else replace(t, tool_calls=tuple(calls), tokens=0))
        for call in calls:
            j = first_result.get(call.id)
            if j is not None and j > i and j not in placed:
                placed.add(j)
                res = turns[j]
                out.append(res if res.name == call.name else replace(res, name=call.name, tokens=0))
            else:
                out.append(Turn("tool", STUB_RESULT, tool_call_id=call.id, name=call.name))
    return out


def _merge_adjacent(turns: list[Turn]) -> list[Turn]:
    out: list[Turn] = []
    for t in turns:
        prev = out[-1] if out else None
        if prev is not None and prev.role == t.role and t.role != "tool" and not prev.tool_calls:
            out[-1] = Turn(t.role, _join(prev.content, t.content), tool_calls=t.tool_calls)
        else:
            out.append(t)
    return out


def turn_to_message(turn: Turn) -> dict[str, Any]:
    """The chat-template message of one turn (OpenAI-style tool calls with dict arguments)."""
    if turn.role == "tool":
        return {"role": "tool", "tool_call_id": turn.tool_call_id, "name": turn.name, "content": turn.content}
    message: dict[str, Any] = {"role": turn.role, "content": turn.content}
    if turn.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.args()}}
            for c in turn.tool_calls
        ]
    return message


class TokenCounter(Protocol):
    """Counts prompt tokens the way the engine will see them."""

    def count_prefix(self, system_prompt: str, task: str, tools: Sequence[Mapping[str, Any]] | None) -> int:
        """Tokens of the pinned prefix plus the generation prompt (the cost of an empty editable region)."""
        ...

    def count_turn(self, turn: Turn) -> int:
        """Tokens one turn adds when appended after the prefix."""
        ...


class ChatTemplateCounter:
    """Counts with a Hugging Face tokenizer and its chat template; per-turn counts are cached.

    A turn's count is the difference between rendering ``[anchor, turn]`` and ``[anchor]``, which is exact
    for templates that render each message on its own (ChatML and its relatives); engine calibration
    (:meth:`Context.calibrate`) absorbs what a template does across messages.
    """

    _ANCHOR: ClassVar[dict[str, str]] = {"role": "user", "content": "."}

    def __init__(self, tokenizer: Any, cache_size: int = 16384) -> None:
        self.tokenizer = tokenizer
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self.spellings = special_spellings(tokenizer)
        """The tokenizer's special tokens: text in messages that spells one is neutralised before rendering."""
        self._cache: dict[Turn, int] = {}
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._anchor_tokens = self.count_text(self._render([self._ANCHOR]))

    def _render(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        safe = neutral_messages(messages, self.spellings)  # text never renders as a control token
        text: str = self.tokenizer.apply_chat_template(safe, tokenize=False, **kwargs)
        return text

    def count_text(self, text: str) -> int:
        """Tokens of ``text`` on its own (no special tokens added); lone surrogates count as U+FFFD."""
        text = valid_text(text)
        # The Rust backend directly: no max-length warning for long turns, and faster than __call__.
        if self._backend is not None:
            return len(self._backend.encode(text, add_special_tokens=False).ids)
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def count_prefix(self, system_prompt: str, task: str, tools: Sequence[Mapping[str, Any]] | None) -> int:
        messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": task}]
        return self.count_text(
            self._render(messages, tools=list(tools) if tools else None, add_generation_prompt=True)
        )

    def count_turn(self, turn: Turn) -> int:
        cached = self._cache.get(turn)
        if cached is not None:
            return cached
        n = self.count_text(self._render([self._ANCHOR, turn_to_message(turn)])) - self._anchor_tokens
        with self._lock:  # one counter serves the episodes of a rollout, stepped in several threads
            if len(self._cache) >= self._cache_size:
                self._cache.pop(next(iter(self._cache)), None)  # oldest first: dicts keep insertion order
            self._cache[turn] = n
        return n


class Context:
    """Pinned prefix + editable region of one episode, with token counts.

    ``tokens`` is the calibrated prompt size (prefix + turns + generation prompt) that the budget uses.
    The prefix is fixed at construction: there is no setter for it.
    """

    def __init__(
        self,
        system_prompt: str,
        task: str,
        counter: TokenCounter,
        tools: Sequence[Mapping[str, Any]] | None = None,
        calibration: tuple[float, float] = (0.8, 1.25),
    ) -> None:
        self._system_prompt = system_prompt
        self._task = task
        self._tools = [dict(t) for t in tools] if tools else []
        self.counter = counter
        self.prefix_tokens = counter.count_prefix(system_prompt, task, self._tools)
        self._turns: list[Turn] = []
        self._turn_tokens = 0
        self._ratio = 1.0
        self._clamp = calibration
        self._signal: str | None = None
        self._signal_tokens = 0
        self._turn_floor: int | None = None

    @property
    def system_prompt(self) -> str:
        return self._system_prompt

    @property
    def task(self) -> str:
        return self._task

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [dict(t) for t in self._tools]

    @property
    def signal(self) -> str | None:
        """The signal slot: text rendered as one user message after the conversation (None: no slot)."""
        return self._signal

    def set_signal(self, text: str | None) -> None:
        """Rewrite the signal slot (a mode's status block); its tokens count in ``tokens``."""
        self._signal = text or None
        self._signal_tokens = self.counter.count_turn(Turn("user", text)) if text else 0

    def set_tools(self, tools: Sequence[Mapping[str, Any]] | None) -> None:
        """Change the tool schemas the prompt offers (a mode's offer changed); the prefix is recounted."""
        new = [dict(t) for t in tools] if tools else []
        if new != self._tools:
            self._tools = new
            self.prefix_tokens = self.counter.count_prefix(self._system_prompt, self._task, self._tools)

    @property
    def turns(self) -> tuple[Turn, ...]:
        return tuple(self._turns)

    @property
    def raw_tokens(self) -> int:
        """Locally counted prompt tokens, uncalibrated."""
        return self.prefix_tokens + self._signal_tokens + self._turn_tokens

    @property
    def tokens(self) -> int:
        """Calibrated prompt tokens: what the budget, readout and receipts report."""
        return self._calibrated(self.raw_tokens)

    @property
    def calibration_ratio(self) -> float:
        return self._ratio

    def _calibrated(self, raw: int) -> int:
        return raw if self._ratio == 1.0 else round(raw * self._ratio)

    def counted(self, turns: Iterable[Turn]) -> list[Turn]:
        """``turns`` with their ``tokens`` filled in (cached counts are reused)."""
        out = []
        for t in turns:
            n = self.counter.count_turn(t)
            # Direct construction: dataclasses.replace is several times slower, and this runs per turn per step.
            out.append(
                t if t.tokens == n else Turn(t.role, t.content, t.tool_calls, t.tool_call_id, t.name, n)
            )
        return out

    def fewest_tokens(self, n_turns: int) -> int:
        """A lower bound of :meth:`tokens_of` for any ``n_turns`` non-empty turns, without counting them: each
        takes at least what its role's empty turn takes, less one token (its text may merge with the
        template's newline before it). Lets a file of thousands of small turns be judged without rendering
        each one."""
        if self._turn_floor is None:
            try:
                empty = min(self.counter.count_turn(Turn(role, "")) for role in ("user", "assistant", "tool"))
            except Exception:  # a template that cannot render an empty turn: no bound
                empty = 1
            self._turn_floor = max(0, empty - 1)
        return self._calibrated(self.prefix_tokens + self._signal_tokens + n_turns * self._turn_floor)

    def tokens_of(self, turns: Sequence[Turn]) -> int:
        """Calibrated prompt tokens if the editable region were ``turns`` (already counted)."""
        return self._calibrated(self.prefix_tokens + self._signal_tokens + sum(t.tokens for t in turns))

    def append(self, turn: Turn) -> None:
        """Append one turn, merging it into the last turn where :func:`normalize_turns` would.

        The caller keeps tool calls and results paired (an assistant turn with calls is followed by its
        results); an empty turn is not appended.
        """
        if _is_empty(turn):
            return
        last = self._turns[-1] if self._turns else None
        if last is not None and last.role == turn.role and turn.role != "tool" and not last.tool_calls:
            self._turns.pop()
            self._turn_tokens -= last.tokens
            turn = Turn(turn.role, _join(last.content, turn.content), tool_calls=turn.tool_calls)
        counted = replace(turn, tokens=self.counter.count_turn(turn))
        self._turns.append(counted)
        self._turn_tokens += counted.tokens

    def replace_turns(self, turns: Iterable[Turn]) -> None:
        """Replace the editable region with ``turns`` (normalised and counted); the prefix stays."""
        self._turns = self.counted(normalize_turns(turns))
        self._turn_tokens = sum(t.tokens for t in self._turns)

    def calibrate(self, engine_prompt_tokens: int) -> float:
        """Scale counts to the engine's reported prompt size; the ratio is clamped. Returns the ratio."""
        if engine_prompt_tokens > 0 and self.raw_tokens > 0:
            lo, hi = self._clamp
            self._ratio = min(hi, max(lo, engine_prompt_tokens / self.raw_tokens))
        return self._ratio

    def to_messages(self) -> list[dict[str, Any]]:
        """Chat messages for ``tokenizer.apply_chat_template(messages, tools=context.tools)``:
        system prompt, user task, then the editable region."""
        head = [{"role": "system", "content": self._system_prompt}, {"role": "user", "content": self._task}]
        tail = [{"role": "user", "content": self._signal}] if self._signal else []
        return head + [turn_to_message(t) for t in self._turns] + tail
