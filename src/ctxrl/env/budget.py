"""Budget awareness: the readout, tiered nudges, the urgent band and overflow rollback.

Models estimate their own context length poorly, so the harness tells them (the Context Language Models defaults, docs/seed_features.md):

- a readout of the current size against the limit on every tool result;
- one-shot nudges at fixed fill levels of the budget (25/50/75 %). A tier fires once when the context
  reaches it and re-arms when the context drops below it again. A nudge states the readout's figure
  (tokens against the limit, the same words), so one tool result never shows two denominators. The lowest tier is informational only
  (how-to text this early triggers premature wholesale deletion); the middle tiers say "finish the unit
  in flight, then tidy once"; the top tier says "compact settled spans";
- an urgent nudge on every turn while the room left is under max(10 % of the limit, 2 × the largest of
  the last 3 tool outputs), never below 50 % of the limit. Sizing it from outputs means one large
  observation cannot jump past the warning straight into overflow;
- over the limit, the newest turns are rolled back (whole exchanges: a tool call never loses its result)
  until the margin is free, and a note names the commands whose output overflowed. The margin doubles
  only after repeated ignored rollbacks; past the retry limit comes one final turn, then the episode stops.

Everything here is a pure function of numbers and turns, except :class:`BudgetState`'s few counters.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import ToolCall, Turn

READOUT = "[context: {tokens}/{limit} tokens ({percent}% of the limit)]"
# The nudges state the same figure as the readout: tokens against the limit, in the same words.
NUDGE_INFO = "[context] {percent}% of the limit is in use ({tokens}/{limit} tokens)."
NUDGE_MID = (
    "[context] {percent}% of the limit is in use ({tokens}/{limit} tokens). "
    "Finish the unit of work in flight, then {tidy} once."
)
NUDGE_HIGH = "[context] {percent}% of the limit is in use ({tokens}/{limit} tokens). {compact}"
URGENT = (
    "[context] URGENT: {room} tokens left before the limit of {limit}; the next large output may overflow. "
    "{compact_now}"
)
OVERFLOW = (
    "[context] Overflow: the context passed the limit of {limit} tokens, so the newest {turns} turn(s) were "
    "rolled back to free {free} tokens. Output that did not fit came from: {commands}.{also} {condense} "
    "before running them again, or cut their output (head, grep, wc)."
)
FINAL_TURN = (
    "[context] Final turn: the context overflowed {count} times without being condensed. "
    "Submit your answer now with the submit tool; the episode stops after this turn."
)


@dataclass(frozen=True)
class Means:
    """How a mode's nudges and overflow note name the model's own means of shrinking its context.

    Each mode words them for the tools it gives (file mode names its context file, tools mode its context
    tools, usage mode eviction and the archive), so no note points at a file or tool that does not exist.
    """

    tidy: str
    """Completes "Finish the unit of work in flight, then ... once." (the middle tiers)."""
    compact: str
    """The top tier's advice, a whole sentence."""
    compact_now: str
    """The urgent nudge's advice, a whole sentence."""
    condense: str
    """Starts "... before running them again" in the overflow note."""

    @classmethod
    def for_file(cls, name: str) -> Means:
        """File mode's wording, naming the context file ``name``."""
        return cls(
            tidy=f"tidy {name}",
            compact=(
                f"Compact settled spans of {name} (finished work, outputs already used) in one batched edit, "
                "without wiping what you still need."
            ),
            compact_now=f"Compact {name} now.",
            condense=f"Condense {name}",
        )


@dataclass(frozen=True)
class BudgetFeatures:
    """Which parts of the budget machinery a mode uses; each mode's defaults are its seed's behaviour.

    ``HarnessConfig.readout`` / ``nudges`` / ``rollback`` override them for a run (None keeps the mode's).
    """

    readout: bool = True
    """Every tool result ends with the ``[context: n/limit tokens]`` readout."""
    nudges: bool = True
    """Tier nudges and the urgent nudge."""
    rollback: bool = True
    """Over the limit, the newest turns are rolled back; False: the episode ends with ``overflow``."""
    pressure: str = "optional"
    """The mid-turn pressure pass: ``always`` (it is the mode), ``default`` (on unless the mode's config
    turns it off), ``optional`` (only with ``modes.pressure.enabled``), ``never``."""

    def resolve(self, cfg: HarnessConfig) -> BudgetFeatures:
        """These features with the run's overrides (``cfg.readout``, ``cfg.nudges``, ``cfg.rollback``) applied."""
        return BudgetFeatures(
            readout=self.readout if cfg.readout is None else cfg.readout,
            nudges=self.nudges if cfg.nudges is None else cfg.nudges,
            rollback=self.rollback if cfg.rollback is None else cfg.rollback,
            pressure=self.pressure,
        )


@dataclass
class BudgetState:
    """The budget's memory within one episode."""

    fired: list[bool]
    """Per nudge tier: fired and not re-armed yet."""
    recent_outputs: deque[int] = field(default_factory=deque)
    """Token sizes of the latest tool outputs (bounded by ``urgent_recent_outputs``)."""
    ignored_rollbacks: int = 0
    """Rollbacks since the last edit that shrank the context."""

    @classmethod
    def initial(cls, cfg: HarnessConfig) -> BudgetState:
        return cls(
            fired=[False] * len(cfg.nudge_fractions), recent_outputs=deque(maxlen=cfg.urgent_recent_outputs)
        )


def percent(tokens: int, whole: int) -> int:
    return int(100 * tokens / whole) if whole > 0 else 0


def readout(tokens: int, limit: int) -> str:
    """The readout line shown on every tool result."""
    return READOUT.format(tokens=tokens, limit=limit, percent=percent(tokens, limit))


def tier_nudge(state: BudgetState, tokens: int, cfg: HarnessConfig, means: Means | None = None) -> str | None:
    """The nudge of the highest tier newly reached at ``tokens`` (or None); fires once, re-arms below.

    Tiers reached together fire as one message, the highest. Mutates ``state.fired``. ``means`` words the
    advice (default: file mode's, naming ``cfg.context_file``).
    """
    reached = [i for i, f in enumerate(cfg.nudge_fractions) if tokens >= f * cfg.budget]
    for i, frac in enumerate(cfg.nudge_fractions):
        if tokens < frac * cfg.budget:
            state.fired[i] = False  # re-arm: the context shrank below this tier
    new = [i for i in reached if not state.fired[i]]
    for i in reached:
        state.fired[i] = True
    if not new:
        return None
    tier = max(new)
    last = len(cfg.nudge_fractions) - 1
    template = NUDGE_INFO if tier == 0 else NUDGE_HIGH if tier == last else NUDGE_MID
    means = means or Means.for_file(cfg.context_file)
    return template.format(
        percent=percent(tokens, cfg.limit),
        tokens=tokens,
        limit=cfg.limit,
        tidy=means.tidy,
        compact=means.compact,
    )


def urgent_band(limit: int, recent_outputs: Sequence[int], cfg: HarnessConfig) -> int:
    """Room (tokens) below which the urgent nudge fires."""
    largest = max(recent_outputs, default=0)
    return max(int(cfg.urgent_limit_fraction * limit), int(cfg.urgent_output_factor * largest))


def urgent_nudge(
    tokens: int, recent_outputs: Sequence[int], cfg: HarnessConfig, means: Means | None = None
) -> str | None:
    """The urgent nudge while the room left is inside the band (never below ``urgent_min_fill``)."""
    limit = cfg.limit
    room = limit - tokens
    if tokens < cfg.urgent_min_fill * limit or room >= urgent_band(limit, recent_outputs, cfg):
        return None
    means = means or Means.for_file(cfg.context_file)
    return URGENT.format(room=max(room, 0), limit=limit, compact_now=means.compact_now)


def rollback_margin(cfg: HarnessConfig, ignored_rollbacks: int) -> int:
    """Tokens to free on this rollback: the margin, doubled after every ``rollback_deepen_after`` ignored ones.

    ``ignored_rollbacks`` counts the earlier rollbacks not followed by a shrinking edit (0 for the first).
    """
    doublings = min(ignored_rollbacks // cfg.rollback_deepen_after, 16)
    return min(cfg.rollback_margin * 2**doublings, cfg.limit)


def rollback_cut(turns: Sequence[Turn], size: Callable[[Sequence[Turn]], int], target: int) -> int:
    """The longest kept head ``turns[:cut]`` with ``size(head) <= target`` that orphans no tool result.

    A cut never falls right before a tool turn, so a call and its results go together. Returns 0 if even
    the empty region does not fit.
    """
    for cut in range(len(turns), -1, -1):
        legal = cut == len(turns) or turns[cut].role != "tool"
        if legal and size(turns[:cut]) <= target:
            return cut
    return 0


def describe_call(call: ToolCall) -> str:
    """How a call is named in notes: its shell command, else ``name(arguments)``; at most 120 characters."""
    args = call.args()
    command = args.get("command")
    text = command if isinstance(command, str) else f"{call.name}({call.arguments})"
    text = " ".join(text.split())
    return text if len(text) <= 120 else text[:117] + "..."


def overflow_note(
    cfg: HarnessConfig,
    removed: Sequence[Turn],
    culprits: Sequence[ToolCall],
    freed: int,
    means: Means | None = None,
) -> str:
    """The note after a rollback: how much was freed, the calls whose output overflowed (``culprits``,
    the calls of the step that passed the limit) and any other rolled-back calls. ``means`` words what to
    condense (default: file mode's, naming the context file)."""
    culprit_ids = {c.id for c in culprits}
    named = ", ".join(f"`{describe_call(c)}`" for c in culprits) or "(no command: the model's own text)"
    others = [describe_call(c) for t in removed for c in t.tool_calls if c.id not in culprit_ids]
    also = f" Also rolled back: {', '.join(f'`{c}`' for c in others)}." if others else ""
    return OVERFLOW.format(
        limit=cfg.limit,
        turns=len(removed),
        free=freed,
        commands=named,
        also=also,
        condense=(means or Means.for_file(cfg.context_file)).condense,
    )
