"""The mid-turn pressure pass: fixed rules that keep the prompt under the soft ceiling, no model control.

After every step (``harness`` mode, or underneath another mode when ``modes.pressure.enabled``):

1. **Spill.** A tool result goes to the overflow store, replaced by its stub, when it lies outside the last
   ``keep_rounds`` rounds (old) or is at least ``spill_chars`` long (oversized). Results under
   :data:`MIN_SPILL_CHARS` characters stay: their stub would not be smaller. Stubs stay as they are.
2. **Fold.** If the context is still at or above ``compact_pct`` of the limit, every exchange older than the
   last ``keep_rounds`` rounds (an assistant turn with its results, or a lone note) is replaced by one user
   turn: a summary and the stub of the folded transcript (so nothing is lost: ``read_overflow`` returns it in
   the context-file format). The fold is applied only if it makes the context smaller.

Pinned turns are never spilled, and an exchange holding one is never folded. A "round" here is an
assistant turn with tool calls, counted from the end of the live context, so the pass needs no memory and
runs the same under every mode.

The summariser is pluggable (:data:`Summariser`): :func:`extractive_summary` (default, deterministic) or
:class:`EngineSummariser`, which asks a generation engine through any ``generate(prompt_text) -> str``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ctxrl.env.context import Turn
from ctxrl.env.ctxfile import render_context
from ctxrl.env.mode_config import ModesConfig, PressureConfig
from ctxrl.env.modes.base import Episode, StepNotes
from ctxrl.env.modes.common import Pinned, Shared, never_pinned
from ctxrl.env.overflow import STUB_RE, OverflowStore, body_id, extract_identifiers, is_stub, preserved_block

MIN_SPILL_CHARS = 600
FOLD_HEADER = "[folded history: {turns} turns ({tokens} tokens) summarised; the full text is in overflow]"
SUMMARY_PROMPT = (
    "Summarise this part of an agent's work for the agent itself: what it did, what it found, the exact "
    "identifiers, paths and numbers it will need. Plain text, at most {chars} characters.\n\n{transcript}\n\n"
    "Summary:"
)

Summariser = Callable[[Sequence[Turn]], str]
"""Turns to fold -> summary text (the pass cuts it to ``summary_chars`` and adds the stub)."""


def _first_line(text: str, width: int = 120) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= width else line[: width - 3] + "..."


def extractive_summary(turns: Sequence[Turn], max_chars: int = 2000) -> str:
    """A deterministic summary: one short line per turn (what you said and called, each result's first
    line; stubs are skipped, the fold's own stub keeps them) and the identifiers found in the turns, which
    are kept even when the per-turn lines are cut to fit ``max_chars``."""
    lines = []
    for turn in turns:
        if turn.role == "assistant":
            calls = ", ".join(f"{c.name}({_first_line(c.arguments, 60)})" for c in turn.tool_calls)
            said = _first_line(turn.content, 80)
            lines.append("- you: " + "; ".join(x for x in (said, calls and f"called {calls}") if x))
        elif is_stub(turn.content):
            continue
        elif turn.role == "tool":
            lines.append(f"- {turn.name or 'tool'} result: {_first_line(turn.content, 80)}")
        else:
            lines.append(f"- note: {_first_line(turn.content, 80)}")
    texts = [STUB_RE.sub("", t.content) for t in turns] + [c.arguments for t in turns for c in t.tool_calls]
    block = preserved_block(extract_identifiers(texts))[: max_chars // 2]
    room = max_chars - len(block) - 1
    body = "\n".join(lines)
    if len(body) > room:
        body = body[: max(room - 4, 0)].rsplit("\n", 1)[0] + "\n..."
    return "\n".join(x for x in (body, block) if x)


@dataclass(frozen=True)
class EngineSummariser:
    """Summarise with a generation engine: ``generate(prompt_text) -> str`` (any callable).

    The transcript shown to the engine is the context-file rendering of the folded turns, cut to
    ``max_prompt_chars``. An empty answer falls back to :func:`extractive_summary`; an engine error propagates.
    """

    generate: Callable[[str], str]
    max_chars: int = 2000
    max_prompt_chars: int = 24000

    def __call__(self, turns: Sequence[Turn]) -> str:
        transcript = render_context(turns)[: self.max_prompt_chars]
        answer = self.generate(SUMMARY_PROMPT.format(chars=self.max_chars, transcript=transcript)).strip()
        if not answer:
            return extractive_summary(turns, self.max_chars)
        return answer[: self.max_chars]


@dataclass(frozen=True)
class PressureResult:
    spilled: tuple[str, ...]
    """Overflow ids of the results spilled."""
    folded_turns: int
    tokens_freed: int

    @property
    def changed(self) -> bool:
        return bool(self.spilled) or self.folded_turns > 0

    def event(self, round_: int) -> dict[str, Any]:
        return {
            "type": "pressure",
            "round": round_,
            "spilled": len(self.spilled),
            "folded_turns": self.folded_turns,
            "tokens_freed": self.tokens_freed,
            "overflow_ids": list(self.spilled),
        }


def _exchanges(turns: Sequence[Turn]) -> list[list[int]]:
    """Indices grouped into exchanges: an assistant turn with its tool results, or one other turn."""
    groups: list[list[int]] = []
    for i, turn in enumerate(turns):
        if turn.role == "tool" and groups and turns[groups[-1][0]].tool_calls:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _recent_start(turns: Sequence[Turn], keep_rounds: int) -> int:
    """Index of the first turn of the last ``keep_rounds`` rounds (len(turns) when keep_rounds is 0)."""
    if keep_rounds == 0:
        return len(turns)
    starts = [i for i, t in enumerate(turns) if t.role == "assistant" and t.tool_calls]
    return starts[-keep_rounds] if len(starts) >= keep_rounds else 0


class PressurePass:
    """Spill and fold by fixed rules (see the module docstring)."""

    def __init__(self, config: PressureConfig, summariser: Summariser | None = None) -> None:
        self.config = config
        self.summariser: Summariser = summariser or (
            lambda turns: extractive_summary(turns, config.summary_chars)
        )

    def apply(self, episode: Episode, store: OverflowStore, pinned: Pinned) -> PressureResult:
        ctx = episode.context
        before = ctx.tokens
        spilled = self._spill(episode, store, pinned)
        folded = 0
        if ctx.tokens >= self.config.compact_pct * episode.config.limit:
            folded = self._fold(episode, store, pinned)
        return PressureResult(tuple(spilled), folded, before - ctx.tokens)

    def _spill(self, episode: Episode, store: OverflowStore, pinned: Pinned) -> list[str]:
        ctx, cfg = episode.context, self.config
        if not cfg.spill:
            return []
        turns = list(ctx.turns)
        recent = _recent_start(turns, cfg.keep_rounds)
        ids = []
        for i, turn in enumerate(turns):
            size = len(turn.content)
            if turn.role != "tool" or size < MIN_SPILL_CHARS or is_stub(turn.content) or pinned(turn):
                continue
            if i < recent or size >= cfg.spill_chars:
                stub = store.stub(turn.content, turn.name, turn.tool_call_id)
                ids.append(body_id(turn.content))
                turns[i] = Turn("tool", stub, tool_call_id=turn.tool_call_id, name=turn.name)
        if ids:
            ctx.replace_turns(turns)
        return ids

    def _fold(self, episode: Episode, store: OverflowStore, pinned: Pinned) -> int:
        ctx = episode.context
        turns = ctx.turns
        recent = _recent_start(turns, self.config.keep_rounds)
        old = [g for g in _exchanges(turns) if g[-1] < recent and not any(pinned(turns[i]) for i in g)]
        folded = [i for g in old for i in g]
        if not folded or (len(folded) == 1 and turns[folded[0]].content.startswith("[folded history")):
            return 0
        chosen = [turns[i] for i in folded]
        summary = self.summariser(chosen)[: self.config.summary_chars]
        stub = store.stub(render_context(chosen), "fold", None)
        header = FOLD_HEADER.format(turns=len(chosen), tokens=sum(t.tokens for t in chosen))
        note = Turn("user", "\n".join([header, summary, stub]))
        keep = set(range(len(turns))) - set(folded)
        new = [note if i == folded[0] else turns[i] for i in range(len(turns)) if i in keep or i == folded[0]]
        counted = ctx.counted(new)
        if ctx.tokens_of(counted) >= ctx.tokens:
            return 0  # the summary would not save anything
        ctx.replace_turns(new)
        return len(chosen)


class PressureHooks:
    """The per-episode state and ``after_step`` of a mode whose only management is the pressure pass."""

    def __init__(self, config: ModesConfig, pressure: PressurePass | None) -> None:
        self.config = config
        self.pressure = pressure
        self._shared: Shared | None = None

    def begin_episode(self, episode: Episode) -> None:
        self._shared = Shared.begin(episode, self.config)

    def shared(self, episode: Episode) -> Shared:
        if self._shared is None or self._shared.episode is not episode:
            self.begin_episode(episode)
        assert self._shared is not None
        return self._shared

    def after_step(self, episode: Episode, ending: bool) -> StepNotes:
        shared = self.shared(episode)
        shared.rounds.advance()
        if self.pressure is None or ending:
            return StepNotes((), shared.drain_events())
        result = self.pressure.apply(episode, shared.store, never_pinned)
        if result.changed:
            shared.events.append(result.event(shared.rounds.current - 1))
        return StepNotes((), shared.drain_events(), result.changed)
