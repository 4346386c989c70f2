"""The mid-turn pressure pass: fixed rules that keep the prompt under the soft ceiling, no model control.

After every step (``harness`` mode, or underneath another mode when ``modes.pressure.enabled``):

1. **Spill.** A tool result goes to the overflow store, replaced by its stub, when it lies outside the kept
   rounds (old) or is at least ``spill_chars`` long (oversized). Results under :data:`MIN_SPILL_CHARS`
   characters stay: their stub would not be smaller. Stubs stay as they are. A body the model asked back
   with ``read_overflow`` is not spilled for its size in the round it arrives (it would never be seen); it
   spills for age like any result.
2. **Fold.** If the context is still at or above ``compact_pct`` of the limit, every exchange older than the
   kept rounds (an assistant turn with its results, or a lone note) is replaced by one user turn: a summary
   and the stub of the folded transcript (so nothing is lost: ``read_overflow`` returns it in the
   context-file format). The fold is applied only if it makes the context smaller.

Pinned turns are never spilled, and an exchange holding one is never folded. A "round" here is an
assistant turn with tool calls, counted from the end of the live context, so the pass needs no memory and
runs the same under every mode.

**Sizing.** The thresholds come from :meth:`PressureConfig.sizing` of the episode's limit, measured once
per episode: ``spill_chars`` and ``summary_chars`` as shares of the limit (converted to characters with the
chars/token the episode's counter measures on its system prompt and task), the kept rounds as the newest
rounds that fit in ``keep_pct`` of the limit; explicit ``spill_chars``/``keep_rounds``/``summary_chars``
win. See ``docs/harness_baseline.md``.

The summariser is pluggable (:data:`Summariser`): :func:`extractive_summary` (default, deterministic) or
:class:`EngineSummariser`, which asks a generation engine through any ``generate(prompt_text) -> str``.
A summariser that raises (an engine error, an empty or garbage answer) never fails the step: the fold uses
the extractive summary instead, and the pressure event records the fallback and why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ctxrl.env.context import Context, Turn
from ctxrl.env.ctxfile import render_context
from ctxrl.env.mode_config import ModesConfig, PressureConfig, PressureSizing
from ctxrl.env.modes.base import Episode, StepNotes
from ctxrl.env.modes.common import Pinned, Shared, never_pinned
from ctxrl.env.overflow import STUB_RE, OverflowStore, body_id, extract_identifiers, is_stub, preserved_block

MIN_SPILL_CHARS = 600
MIN_SUMMARY_CHARS = 16
"""An engine answer with fewer non-blank characters than this is not a summary."""
FOLD_HEADER = "[folded history: {turns} turns ({tokens} tokens) summarised; the full text is in overflow]"
SUMMARY_PROMPT = (
    "Summarise this part of an agent's work for the agent itself: what it did, what it found, the exact "
    "identifiers, paths and numbers it will need. Plain text, at most {chars} characters.\n\n{transcript}\n\n"
    "Summary:"
)

Summariser = Callable[[Sequence[Turn], int], str]
"""``(turns to fold, max_chars) -> summary text``; the pass cuts it to ``max_chars`` and adds the stub. It may
raise: the pass then uses :func:`extractive_summary` and records why."""


class SummaryError(Exception):
    """The engine's answer is not a usable summary (empty, too short, or not text)."""


def _first_line(text: str, width: int = 120) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= width else line[: width - 3] + "..."


def _preserved(turns: Sequence[Turn], max_chars: int) -> str:
    """The identifiers found in ``turns`` (stubs excluded: the fold's own stub keeps them), as a block."""
    texts = [STUB_RE.sub("", t.content) for t in turns] + [c.arguments for t in turns for c in t.tool_calls]
    return preserved_block(extract_identifiers(texts))[:max_chars]


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
    block = _preserved(turns, max_chars // 2)
    room = max_chars - len(block) - 1
    body = "\n".join(lines)
    if len(body) > room:
        body = body[: max(room - 4, 0)].rsplit("\n", 1)[0] + "\n..."
    return "\n".join(x for x in (body, block) if x)


def check_summary(answer: str) -> str:
    """``answer`` stripped, or :class:`SummaryError` when it is no summary: fewer than
    :data:`MIN_SUMMARY_CHARS` non-blank characters, or under a third of them letters or digits."""
    text = answer.strip()
    if text.lower().startswith("summary:"):
        text = text[len("summary:") :].strip()  # the model repeated the prompt's last word
    visible = "".join(text.split())
    if len(visible) < MIN_SUMMARY_CHARS:
        raise SummaryError(f"the engine's answer has {len(visible)} non-blank characters")
    if sum(c.isalnum() for c in visible) * 3 < len(visible):
        raise SummaryError("the engine's answer is mostly not letters or digits")
    return text


@dataclass(frozen=True)
class EngineSummariser:
    """Summarise with a generation engine: ``generate(prompt_text) -> str`` (any callable).

    The transcript shown to the engine is the context-file rendering of the folded turns, cut to
    ``max_prompt_chars``. The summary is the engine's answer (checked by :func:`check_summary`) followed by
    the identifiers found in the turns (the ``Preserved (compaction-safe):`` block), so exact ids survive a
    paraphrase. An engine error, or an answer that is no summary (:class:`SummaryError`), propagates: the
    pressure pass then falls back to :func:`extractive_summary` and records it.
    """

    generate: Callable[[str], str]
    max_chars: int | None = None
    """Most characters of a summary; None: the pass's ``summary_chars`` (sized to the limit)."""
    max_prompt_chars: int = 24000

    def __call__(self, turns: Sequence[Turn], max_chars: int | None = None) -> str:
        limit = max_chars or self.max_chars or 2000
        transcript = render_context(turns)[: self.max_prompt_chars]
        block = _preserved(turns, limit // 2)
        room = max(limit - len(block) - 1, 0)
        answer = check_summary(self.generate(SUMMARY_PROMPT.format(chars=room, transcript=transcript)))
        return "\n".join(x for x in (answer[:room].rstrip(), block) if x)


@dataclass(frozen=True)
class Fold:
    """What one fold did: the turns folded, the transcript's overflow id and how the summary was made."""

    turns: int
    overflow_id: str
    summary: str
    summariser: str
    """``extractive`` or ``engine`` (the one whose text is in the summary)."""
    fallback: str | None = None
    """Why the configured summariser was not used (its exception), or None."""


@dataclass(frozen=True)
class PressureResult:
    spilled: tuple[str, ...]
    """Overflow ids of the results spilled."""
    folded_turns: int
    tokens_freed: int
    fold: Fold | None = None
    sizing: PressureSizing | None = None
    kept_rounds: int = 0
    """Rounds within the kept window when the pass ran (not spilled for age)."""

    @property
    def changed(self) -> bool:
        return bool(self.spilled) or self.folded_turns > 0

    def event(self, round_: int) -> dict[str, Any]:
        event: dict[str, Any] = {
            "type": "pressure",
            "round": round_,
            "spilled": len(self.spilled),
            "folded_turns": self.folded_turns,
            "tokens_freed": self.tokens_freed,
            "overflow_ids": list(self.spilled),
            "kept_rounds": self.kept_rounds,
        }
        if self.sizing is not None:
            event["spill_chars"] = self.sizing.spill_chars
            event["summary_chars"] = self.sizing.summary_chars
        if self.fold is not None:
            event["fold"] = {
                "overflow_id": self.fold.overflow_id,
                "summariser": self.fold.summariser,
                "fallback": self.fold.fallback,
                "summary": self.fold.summary,
            }
        return event


def _exchanges(turns: Sequence[Turn]) -> list[list[int]]:
    """Indices grouped into exchanges: an assistant turn with its tool results, or one other turn."""
    groups: list[list[int]] = []
    for i, turn in enumerate(turns):
        if turn.role == "tool" and groups and turns[groups[-1][0]].tool_calls:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def recent_start(turns: Sequence[Turn], keep_rounds: int | None, keep_tokens: int) -> int:
    """Index of the first turn of the kept rounds (a round starts at an assistant turn with tool calls).

    ``keep_rounds``: the last that many rounds (``len(turns)`` when 0; 0 when there are fewer rounds).
    None: the newest rounds whose turns, from the round's start to the end, take at most ``keep_tokens``
    (``Turn.tokens``); the newest round is always kept, and 0 when no turn is part of a round.
    """
    starts = [i for i, t in enumerate(turns) if t.role == "assistant" and t.tool_calls]
    if keep_rounds is not None:
        if keep_rounds == 0:
            return len(turns)
        return starts[-keep_rounds] if len(starts) >= keep_rounds else 0
    if not starts:
        return 0
    kept, tail = starts[-1], sum(t.tokens for t in turns[starts[-1] :])
    for start, end in zip(reversed(starts[:-1]), reversed(starts[1:]), strict=True):
        tail += sum(t.tokens for t in turns[start:end])
        if tail > keep_tokens:
            break
        kept = start
    return kept


def chars_per_token(context: Context) -> float:
    """Characters per token of the episode's own text (system prompt and task) as its counter counts it."""
    text = context.system_prompt + "\n" + context.task
    counter = context.counter
    tokens = counter.count_turn(Turn("user", text)) - counter.count_turn(Turn("user", "."))
    return len(text) / tokens if tokens > 0 else 4.0


class PressurePass:
    """Spill and fold by fixed rules (see the module docstring)."""

    def __init__(self, config: PressureConfig, summariser: Summariser | None = None) -> None:
        self.config = config
        self.summariser = summariser
        """The configured summariser; None: :func:`extractive_summary`."""
        self._sized: tuple[Context, PressureSizing] | None = None

    def sizing(self, episode: Episode) -> PressureSizing:
        """The thresholds for ``episode`` (computed on its first pass, then kept for the episode)."""
        if self._sized is None or self._sized[0] is not episode.context:
            sizing = self.config.sizing(episode.config.limit, chars_per_token(episode.context))
            self._sized = (episode.context, sizing)
        return self._sized[1]

    def apply(self, episode: Episode, store: OverflowStore, pinned: Pinned) -> PressureResult:
        ctx = episode.context
        sizing = self.sizing(episode)
        before = ctx.tokens
        turns = ctx.turns
        recent = recent_start(turns, sizing.keep_rounds, sizing.keep_tokens)
        kept = sum(1 for t in turns[recent:] if t.role == "assistant" and t.tool_calls)
        spilled = self._spill(episode, store, pinned, sizing, recent)
        fold = None
        if ctx.tokens >= self.config.compact_pct * episode.config.limit:
            fold = self._fold(episode, store, pinned, sizing)
        folded = fold.turns if fold else 0
        return PressureResult(tuple(spilled), folded, before - ctx.tokens, fold, sizing, kept)

    def _spill(
        self, episode: Episode, store: OverflowStore, pinned: Pinned, sizing: PressureSizing, recent: int
    ) -> list[str]:
        """Spill the results before ``recent`` (old) and the oversized ones; return their overflow ids."""
        ctx = episode.context
        if not self.config.spill:
            return []
        turns = list(ctx.turns)
        newest = recent_start(turns, 1, 0)
        ids = []
        for i, turn in enumerate(turns):
            size = len(turn.content)
            if turn.role != "tool" or size < MIN_SPILL_CHARS or is_stub(turn.content) or pinned(turn):
                continue
            asked_back = turn.name == "read_overflow" and i >= newest
            if i < recent or (size >= sizing.spill_chars and not asked_back):
                stub = store.stub(turn.content, turn.name, turn.tool_call_id)
                ids.append(body_id(turn.content))
                turns[i] = Turn("tool", stub, tool_call_id=turn.tool_call_id, name=turn.name)
        if ids:
            ctx.replace_turns(turns)
        return ids

    def _summarise(self, chosen: Sequence[Turn], max_chars: int) -> tuple[str, str, str | None]:
        """``(summary, summariser used, fallback reason)``: the configured summariser, else the extractive."""
        if self.summariser is not None:
            try:
                return self.summariser(chosen, max_chars)[:max_chars], self.config.summariser, None
            except Exception as exc:  # any summariser failure falls back; the event says why
                reason = f"{type(exc).__name__}: {exc}"[:300]
                return extractive_summary(chosen, max_chars), "extractive", reason
        return extractive_summary(chosen, max_chars), "extractive", None

    def _fold(
        self, episode: Episode, store: OverflowStore, pinned: Pinned, sizing: PressureSizing
    ) -> Fold | None:
        ctx = episode.context
        turns = ctx.turns
        recent = recent_start(turns, sizing.keep_rounds, sizing.keep_tokens)
        old = [g for g in _exchanges(turns) if g[-1] < recent and not any(pinned(turns[i]) for i in g)]
        folded = [i for g in old for i in g]
        if not folded or (len(folded) == 1 and turns[folded[0]].content.startswith("[folded history")):
            return None
        chosen = [turns[i] for i in folded]
        summary, used, fallback = self._summarise(chosen, sizing.summary_chars)
        transcript = render_context(chosen)
        stub = store.stub(transcript, "fold", None)
        header = FOLD_HEADER.format(turns=len(chosen), tokens=sum(t.tokens for t in chosen))
        note = Turn("user", "\n".join([header, summary, stub]))
        keep = set(range(len(turns))) - set(folded)
        new = [note if i == folded[0] else turns[i] for i in range(len(turns)) if i in keep or i == folded[0]]
        counted = ctx.counted(new)
        if ctx.tokens_of(counted) >= ctx.tokens:
            return None  # the summary would not save anything
        ctx.replace_turns(new)
        return Fold(len(chosen), body_id(transcript), summary, used, fallback)


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
