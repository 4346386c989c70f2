"""Contrastive notes: for one task, a better and a worse run of the same skill, digested step by step.

    notes = build_notes(episodes)          # EpisodeRecords of the incumbent on train tasks (with repeats)
    text = render_notes(notes)             # what a proposer reads
    steps = known_steps(notes)             # the citations a candidate may use

A note exists for a task when its runs contrast:

- ``success_vs_failure``: at least one run succeeded and one failed. Run A is the cheapest success, run B the
  first failure (lowest episode index, so the choice does not depend on the order episodes finished in);
- ``cost``: every run succeeded and the dearest cost at least ``min_cost_ratio`` times the cheapest. Run A is
  the cheapest, run B the dearest.

Tasks where every run failed, or whose successes cost about the same, teach nothing by contrast and get no note.
Notes are labelled ``n1``, ``n2``, ... in task-id order. Each run is digested one line per step, with the
step's index (``s0`` is the first model call): the context size after the step (the budget timeline), the
calls, whether the step edited the context and the receipt it got, and the budget nudges it triggered; then how
the run ended. A proposer cites a step as ``[n2.B.s7]`` (step 7 of run B of note n2).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ctxrl.train.trajectory import EpisodeRecord, StepRecord

MIN_COST_RATIO = 1.2
"""Two successes contrast on cost when the dearer costs at least this many times the cheaper."""
MAX_STEPS_SHOWN = 40
"""Steps shown per run: a longer run shows its first 10 and last 30 steps (only shown steps can be cited)."""


@dataclass(frozen=True)
class StepDigest:
    """What one step did to the context, in the terms a skill can speak about."""

    index: int
    context_tokens: int
    calls: tuple[str, ...]
    edit: bool
    """The step targeted the context (an edit call) or the harness rewrote the region (rollback)."""
    receipts: tuple[str, ...]
    nudges: tuple[str, ...]
    """The nudge kinds the step triggered: ``info``, ``urgent``, ``overflow``."""

    def line(self) -> str:
        parts = [f"s{self.index}", f"ctx {self.context_tokens}", ", ".join(self.calls) or "(no call)"]
        if self.receipts:
            parts.append("receipt: " + "; ".join(r[:120] for r in self.receipts))
        elif self.edit:
            parts.append("edit")
        if self.nudges:
            parts.append("nudge: " + ", ".join(self.nudges))
        return " | ".join(parts)


@dataclass(frozen=True)
class RunDigest:
    """One run (episode) of a note: its verdict, cost, end and step digests."""

    label: str
    """``A`` (the better run) or ``B`` (the worse)."""
    episode_index: int
    success: bool
    score: float
    end_reason: str
    verdict: str
    cost_tokens: float
    steps: tuple[StepDigest, ...]

    @property
    def overflowed(self) -> bool:
        """The run passed its context limit at least once (a rollback) or ended on overflow."""
        return self.end_reason == "overflow" or any("overflow" in s.nudges for s in self.steps)

    @property
    def urgent_steps(self) -> tuple[int, ...]:
        return tuple(s.index for s in self.steps if "urgent" in s.nudges or "overflow" in s.nudges)

    @property
    def edit_steps(self) -> tuple[int, ...]:
        return tuple(s.index for s in self.steps if s.edit)

    @property
    def peak_context(self) -> int:
        return max((s.context_tokens for s in self.steps), default=0)

    def shown_steps(self) -> tuple[StepDigest, ...]:
        if len(self.steps) <= MAX_STEPS_SHOWN:
            return self.steps
        return self.steps[:10] + self.steps[-(MAX_STEPS_SHOWN - 10) :]

    def render(self) -> str:
        head = (
            f"run {self.label} (episode {self.episode_index}): {'success' if self.success else 'failure'}, "
            f"score {self.score:g}, {len(self.steps)} steps, cost {self.cost_tokens:.0f} tokens, "
            f"peak context {self.peak_context}, ended by {self.end_reason}"
        )
        if self.verdict:
            head += f" ({self.verdict[:160]})"
        lines = [head]
        shown = self.shown_steps()
        for i, step in enumerate(shown):
            if i > 0 and step.index != shown[i - 1].index + 1:
                lines.append(f"  ... {step.index - shown[i - 1].index - 1} steps not shown ...")
            lines.append("  " + step.line())
        return "\n".join(lines)


@dataclass(frozen=True)
class ContrastNote:
    """A better (A) and a worse (B) run of one task under the same skill."""

    label: str
    task_id: str
    family: str
    kind: str
    """``success_vs_failure`` or ``cost``."""
    better: RunDigest
    worse: RunDigest

    def render(self) -> str:
        what = (
            "a success and a failure"
            if self.kind == "success_vs_failure"
            else "two successes, different cost"
        )
        return (
            f"### note {self.label}: task {self.task_id} ({self.family}), {what}\n"
            f"{self.better.render()}\n{self.worse.render()}"
        )

    def citations(self) -> frozenset[str]:
        """Every citation of a shown step of this note: ``[n1.A.s0]`` ..."""
        return frozenset(
            f"[{self.label}.{run.label}.s{step.index}]"
            for run in (self.better, self.worse)
            for step in run.shown_steps()
        )


def _nudge_kinds(step: StepRecord) -> tuple[str, ...]:
    kinds = []
    for text in step.nudges:
        if "Overflow" in text:
            kinds.append("overflow")
        elif "URGENT" in text:
            kinds.append("urgent")
        else:
            kinds.append("info")
    return tuple(kinds)


def digest_step(index: int, step: StepRecord) -> StepDigest:
    """The digest of step ``index`` of an episode."""
    return StepDigest(
        index=index,
        context_tokens=step.context_tokens,
        calls=tuple(step.tool_calls),
        edit=bool(step.edit_calls) or step.edited,
        receipts=tuple(step.receipts),
        nudges=_nudge_kinds(step),
    )


def digest_run(label: str, episode: EpisodeRecord) -> RunDigest:
    return RunDigest(
        label=label,
        episode_index=episode.index,
        success=episode.success,
        score=episode.score,
        end_reason=episode.end_reason,
        verdict=episode.verdict,
        cost_tokens=episode.cost_tokens,
        steps=tuple(digest_step(i, s) for i, s in enumerate(episode.steps)),
    )


def contrast(
    label: str, runs: Sequence[EpisodeRecord], *, min_cost_ratio: float = MIN_COST_RATIO
) -> ContrastNote | None:
    """The note of one task's runs (all of one task and skill), or None when they do not contrast."""
    ordered = sorted(runs, key=lambda e: (e.index, e.seed))
    successes = [e for e in ordered if e.success]
    failures = [e for e in ordered if not e.success]
    if not successes:
        return None
    best = min(successes, key=lambda e: e.cost_tokens)  # min keeps the first of equal costs
    if failures:
        kind, worst = "success_vs_failure", failures[0]
    else:
        worst = max(successes, key=lambda e: e.cost_tokens)
        if worst.cost_tokens < min_cost_ratio * best.cost_tokens or worst is best:
            return None
        kind = "cost"
    first = ordered[0]
    return ContrastNote(
        label=label,
        task_id=first.task_id,
        family=first.family,
        kind=kind,
        better=digest_run("A", best),
        worse=digest_run("B", worst),
    )


def build_notes(
    episodes: Iterable[EpisodeRecord],
    *,
    min_cost_ratio: float = MIN_COST_RATIO,
    max_notes: int | None = None,
) -> list[ContrastNote]:
    """One note per task whose runs contrast, in task-id order, labelled n1, n2, ...; at most ``max_notes``
    (success-vs-failure notes first, since they speak about the primary signal)."""
    by_task: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for ep in episodes:
        by_task[ep.task_id].append(ep)
    found = [
        note
        for task in sorted(by_task)
        if (note := contrast("", by_task[task], min_cost_ratio=min_cost_ratio)) is not None
    ]
    found.sort(key=lambda n: n.kind != "success_vs_failure")  # stable: task order within each kind
    if max_notes is not None:
        found = found[:max_notes]
    found.sort(key=lambda n: n.task_id)
    return [
        ContrastNote(f"n{i}", n.task_id, n.family, n.kind, n.better, n.worse) for i, n in enumerate(found, 1)
    ]


def render_notes(notes: Sequence[ContrastNote]) -> str:
    """All notes as the markdown a proposer reads."""
    return "\n\n".join(n.render() for n in notes)


def known_steps(notes: Sequence[ContrastNote]) -> frozenset[str]:
    """Every citation a candidate may use: the shown steps of all notes."""
    out: frozenset[str] = frozenset()
    for note in notes:
        out |= note.citations()
    return out
