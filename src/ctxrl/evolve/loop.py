"""The overnight evolution loop: rounds of notes, proposals and the gate, resumable from the lineage store.

    loop = EvolveLoop(run_dir, config.evolve, mode="file", families=[...], difficulty="easy",
                      runner=RolloutRunner(engine_for, tokenizer, config.rollout), proposer=OfflineProposer())
    summary = loop.run()          # rounds up to config.rounds (or a STOP file), then the test split, once

One round ``r`` (:meth:`EvolveLoop.round`):

1. **Train.** The round's parent (:meth:`EvolveLoop.parent`: the incumbent, or a skill drawn from the Pareto
   pool) runs the round's train tasks, ``train_repeats`` episodes each.
2. **Notes.** :func:`~ctxrl.evolve.notes.build_notes` over those episodes (written to ``rounds/<r>/notes.md``).
3. **Proposals.** The proposer writes ``proposals`` proposals on the parent (edits of its rules, or rewrites);
   each is read (:func:`~ctxrl.evolve.proposal.read_proposal`, a malformed one is dropped with its reason, never
   repaired) and all are recorded in one transaction; the round's log says how many were well-formed. No notes
   (no task whose runs contrast): nothing is proposed.
4. **Dev.** Every candidate and the incumbent run the same dev tasks and seeds, look by look
   (:meth:`~ctxrl.evolve.gate.CtxrlGate.looks`): at each look one rollout batch per repeat holds the incumbent's
   and every still-undecided candidate's episodes (per-episode skills), then the gate decides what it can. A
   candidate stopped early (futility, or accepted at a look) runs no further episodes.
5. **Gate and lineage.** :func:`~ctxrl.evolve.gate.choose` picks among the accepted; the winner becomes the
   incumbent and ``best_skill/SKILL.md`` (:meth:`~ctxrl.evolve.lineage.Lineage.finish_round`).

**Crash safety and resume.** Every graded episode is committed to the lineage store when its batch returns
(a batch is one look of one repeat), keyed by (skill, split, round, task, seed, repeat); a rerun skips what is
recorded, asks the proposer nothing it already answered, and replays the gate's looks from the stored episodes,
so a kill loses at most the batch in flight and a resumed run reaches the state of an uninterrupted one when the
policy is deterministic per episode (the scripted policies, with or without jitter).

**STOP.** A file named ``STOP`` in the run folder ends the rounds cleanly before the next batch starts (so
after the current one); the test comparison then runs and the run can be continued with ``--resume`` after the
file is removed.

**The test split.** Read only by :meth:`EvolveLoop.final_test`, after the rounds: the final incumbent against
the seed skill. The gate is fed only by :meth:`EvolveLoop.dev_paired`, whose split is fixed to ``dev``, and
:meth:`EvolveLoop.run_jobs` refuses a test episode before the final phase and any task whose seed is not in
the split it is run for.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import fmean
from typing import Any, Protocol

from ctxrl.env.config import HarnessConfig
from ctxrl.env.tasks.base import Task
from ctxrl.env.tasks.registry import BuiltinTaskSource
from ctxrl.errors import CtxrlError, TaskError
from ctxrl.evolve.config import EvolveConfig
from ctxrl.evolve.gate import GateDecision, Paired, choose, pair
from ctxrl.evolve.lineage import Lineage, write_atomic
from ctxrl.evolve.notes import build_notes, known_steps, render_notes
from ctxrl.evolve.proposal import read_proposal, well_formed
from ctxrl.evolve.proposers import Proposer
from ctxrl.evolve.rules import removed_share
from ctxrl.evolve.skill import Skill
from ctxrl.rewards.cost import ModelGeometry
from ctxrl.train.engines.base import Engine, SamplingConfig
from ctxrl.train.rollout import RolloutConfig, rollout
from ctxrl.train.trajectory import EpisodeRecord

STOP_FILE = "STOP"
REPORT_FILE = "report.md"
SUMMARY_FILE = "evolve.json"
TEST_ROUND = 0
"""The round number test episodes are stored under: they belong to no round."""
DEV = "dev"


class EvolveError(CtxrlError):
    """An evolution run cannot go on as configured (a split out of seeds, a test episode before the end)."""


class Runner(Protocol):
    """Runs one batch: ``tasks[i]`` with skill text ``skills[i]``, one episode each, as repeat ``repeat``;
    returns the graded records in task order."""

    def __call__(self, tasks: Sequence[Task], skills: Sequence[str], repeat: int) -> list[EpisodeRecord]: ...


@dataclass
class RolloutRunner:
    """A :class:`Runner` over the rollout loop: ``engine_for(repeat)`` gives the engine of a repeat (a model
    engine: the same one every time; a scripted policy with jitter: one seeded per repeat)."""

    engine_for: Callable[[int], Engine]
    tokenizer: Any
    config: RolloutConfig
    harness: HarnessConfig | None = None
    sampling: SamplingConfig | None = None
    geometry: ModelGeometry | None = None
    workdir: Path | None = None
    progress: bool = True

    def __call__(self, tasks: Sequence[Task], skills: Sequence[str], repeat: int) -> list[EpisodeRecord]:
        from tqdm import tqdm

        with tqdm(
            total=len(tasks), desc="episodes", unit="ep", leave=False, disable=not self.progress
        ) as bar:
            result = rollout(
                self.engine_for(repeat),
                self.tokenizer,
                list(tasks),
                replace(self.config, group_size=1),
                workdir=self.workdir,
                geometry=self.geometry,
                on_step=lambda _taken, ended: bar.update(ended),
                harness=self.harness,
                sampling=self.sampling,
                skills=list(skills),
            )
        return result.episodes


def split_tasks(families: Sequence[str], difficulty: str, split: str, start: int, n: int) -> list[Task]:
    """Tasks ``start`` .. ``start + n - 1`` of ``split``'s task stream
    (:meth:`~ctxrl.env.tasks.registry.BuiltinTaskSource.window`, the one training and evaluation use)."""
    try:
        return BuiltinTaskSource(families, difficulty).window(split, start, n)
    except TaskError as exc:
        raise EvolveError(f"{exc}; fewer rounds") from None


@dataclass(frozen=True)
class Job:
    """One episode to grade: a skill on a task of a split, as repeat ``repeat`` of ``round``."""

    split: str
    round: int
    skill: Skill
    task: Task
    repeat: int


class EvolveLoop:
    """One evolution run in ``run_dir`` (see the module docstring)."""

    def __init__(
        self,
        run_dir: str | Path,
        config: EvolveConfig,
        *,
        mode: str,
        families: Sequence[str],
        difficulty: str,
        runner: Runner,
        proposer: Proposer,
        seed: Skill | None = None,
        log: Callable[[str], None] = print,
        deadline: float | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.config = config
        self.families = tuple(families)
        self.difficulty = difficulty
        self.runner = runner
        self.proposer = proposer
        self.log = log
        self.lineage = Lineage.open(self.run_dir, mode=mode, seed=seed)
        self.deadline = deadline
        """Unix time after which no new batch starts (``ctxrl evolve --hours``); None: no limit."""
        self.final_phase = False
        self.batches = 0
        """Batches run by this process (a resumed run counts only its own)."""

    # ------------------------------------------------------------------ helpers

    def stop_reason(self) -> str | None:
        """Why no new batch may start: a STOP file in the run folder, or the night's deadline passed."""
        if (self.run_dir / STOP_FILE).exists():
            return "STOP file found"
        if self.deadline is not None and time.time() >= self.deadline:
            return "the night's hours are spent"
        return None

    def stop_requested(self) -> bool:
        return self.stop_reason() is not None

    def tasks(self, split: str, round: int) -> list[Task]:
        """The tasks of ``split`` in ``round`` (train and dev move on each round when ``fresh_tasks``; test is
        always the split's first ``test_tasks``)."""
        cfg = self.config
        n = {"train": cfg.train_tasks, "dev": cfg.dev_tasks, "test": cfg.test_tasks}[split]
        start = (round - 1) * n if cfg.fresh_tasks and split != "test" else 0
        return split_tasks(self.families, self.difficulty, split, start, n)

    def run_jobs(self, jobs: Sequence[Job]) -> bool:
        """Grade the jobs not yet recorded, one batch per repeat, each recorded as its batch returns. Returns
        False (nothing more run) when a STOP file appears before a batch, outside the final phase."""
        for job in jobs:
            if job.split == "test" and not self.final_phase:
                raise EvolveError("a test-split episode was asked for before the rounds ended; the test split is "
                                  "read only by the final comparison")  # fmt: skip
            if job.task.split != job.split:
                raise EvolveError(f"task {job.task.task_id} is of split {job.task.split}, not {job.split}")
        graded: dict[tuple[str, str, int], set[tuple[str, int, int]]] = {}
        by_repeat: dict[int, list[Job]] = {}
        for job in jobs:
            key = (job.skill.id, job.split, job.round)
            if key not in graded:
                graded[key] = self.lineage.graded(*key)
            if (job.task.task_id, job.task.seed, job.repeat) not in graded[key]:
                by_repeat.setdefault(job.repeat, []).append(job)
        for repeat in sorted(by_repeat):
            if not self.final_phase and self.stop_requested():
                return False
            batch = by_repeat[repeat]
            records = self.runner([j.task for j in batch], [j.skill.body for j in batch], repeat)
            if len(records) != len(batch):
                raise EvolveError(f"the runner returned {len(records)} episodes for a batch of {len(batch)}")
            for job, record in zip(batch, records):
                if record.task_id != job.task.task_id:
                    raise EvolveError(f"the runner returned task {record.task_id} for {job.task.task_id}")
                self.lineage.record_episode(
                    job.skill.id, job.split, job.round, repeat=job.repeat, record=record
                )
            self.batches += 1
        return True

    def dev_paired(self, candidate: Skill, incumbent: Skill, round: int, order: Sequence[str]) -> Paired:
        """The gate's input: per-task dev scores and costs of the two skills on ``order``. The split is fixed:
        no gate ever reads another."""
        cs, cc = self.lineage.scores(candidate.id, DEV, round, order)
        is_, ic = self.lineage.scores(incumbent.id, DEV, round, order)
        return pair(cs, is_, cc, ic, order=order)

    # ------------------------------------------------------------------ the loop

    def run(self) -> dict[str, Any]:
        """Rounds up to ``config.rounds`` (finished ones skipped, a begun one resumed), then the test
        comparison; returns the summary (also ``evolve.json``; ``report.md`` is rewritten as it goes)."""
        stopped = False
        for r in range(1, self.config.rounds + 1):
            if self.lineage.round_finished(r):
                continue
            if self.stop_requested() or not self.round(r):
                stopped = True
                self.log(
                    f"{self.stop_reason() or 'stopped'}: rounds end here (round {r} unfinished); the test comparison runs"
                )
                break
            self.write_report()
        reason = (self.stop_reason() or "stopped") if stopped else None
        final = self.final_test()
        summary = self.summary(stopped=stopped, final=final, reason=reason)
        write_atomic(self.run_dir / SUMMARY_FILE, json.dumps(summary, indent=1, sort_keys=True) + "\n")
        self.write_report(summary)
        return summary

    def parent(self, r: int) -> Skill:
        """The skill round ``r``'s proposals start from: the incumbent, or with ``parents: pool`` one drawn from
        the Pareto pool of the rounds before ``r`` (:meth:`Lineage.pool`) with weights its wins (the incumbent
        at least 1). The draw is seeded by the round, so a resumed round draws the same parent."""
        inc = self.lineage.incumbent()
        if self.config.parents == "incumbent":
            return inc
        pool = self.lineage.pool(before_round=r)
        ids = [sid for sid, _ in pool]
        weights = [max(wins, 1) if sid == inc.id else wins for sid, wins in pool]
        return self.lineage.skill(random.Random(f"parent of round {r}").choices(ids, weights)[0])

    def round(self, r: int) -> bool:
        """Run (or resume) round ``r``; False if a STOP file ended it early."""
        cfg, lin, gate = self.config, self.lineage, self.config.gate
        lin.begin_round(r)
        inc = lin.incumbent()
        parent = self.parent(r)
        # 1. the parent on the train tasks
        train = self.tasks("train", r)
        jobs = [Job("train", r, parent, t, rep) for rep in range(cfg.train_repeats) for t in train]
        if not self.run_jobs(jobs):
            return False
        # 2-3. contrastive notes -> proposals -> validation, recorded once
        if not lin.proposed(r):
            episodes = lin.episodes(parent.id, "train", r)
            notes = build_notes(episodes, max_notes=cfg.max_notes)
            folder = self.run_dir / "rounds" / str(r)
            write_atomic(folder / "notes.md", render_notes(notes) + "\n" if notes else "(no contrast)\n")
            texts = (
                self.proposer.propose(parent, notes, cfg.proposals, round=r)[: cfg.proposals] if notes else []
            )
            steps = known_steps(notes)
            outcomes = [
                read_proposal(t, parent=parent, round=r, known_steps=steps, max_chars=cfg.max_chars)
                for t in texts
            ]
            lin.record_proposals(r, outcomes)
            solved = sum(e.success for e in episodes)
            reasons = [reason for _, _, reason in lin.dropped(r)]
            shown = getattr(self.proposer, "notes_shown", None) if notes else None
            fitted = (
                f" ({shown} shown: the rest did not fit the context)"
                if shown not in (None, len(notes))
                else ""
            )
            self.log(
                f"round {r}: parent {parent.id}{' (the incumbent)' if parent.id == inc.id else ''} solved "
                f"{solved}/{len(episodes)} train episodes; {len(notes)} notes{fitted}; {len(texts)} proposed, "
                f"{len(texts) - sum(not well_formed(x) for x in reasons)} well-formed, {len(reasons)} dropped"
            )
        # 4. candidates and incumbent on the same dev tasks and seeds, look by look
        pending = lin.candidates(round=r, status="pending")
        ks = {c.skill.id: lin.gate_index(c.skill.id) for c in pending}  # slot order: the same after a resume
        dev = self.tasks(DEV, r)
        order = [t.task_id for t in dev]
        live = [c.skill for c in pending]
        for n in gate.looks(len(dev)):
            if not live:
                break
            jobs = [
                Job(DEV, r, skill, task, rep)
                for rep in range(cfg.repeats)
                for skill in (inc, *live)
                for task in dev[:n]
            ]
            if not self.run_jobs(jobs):
                return False
            still = []
            for cand in live:
                decision = gate.decide(
                    self.dev_paired(cand, inc, r, order[:n]),
                    k=ks[cand.id],
                    n_planned=len(dev),
                    repeats=cfg.repeats,
                )
                if decision is None:
                    still.append(cand)
                    continue
                lin.decide(cand.id, decision)
                self.log(f"round {r}: candidate {cand.id} {_describe(decision)}")
            live = still
        # 5. the winner, if any, becomes the incumbent
        accepted = lin.candidates(round=r, status="accepted")
        winner = None
        if accepted:
            decisions = [GateDecision(**a.decision) for a in accepted if a.decision is not None]
            winner = accepted[choose(decisions)].skill.id
        lin.finish_round(r, winner)
        self.log(f"round {r}: " + (f"{winner} is the new incumbent" if winner else f"{inc.id} stays"))
        return True

    def final_test(self, final: Skill | None = None) -> dict[str, Any]:
        """The final incumbent (or ``final``, another optimiser's result: the GEPA baseline's best candidate)
        and the seed skill on the test split's first ``test_tasks`` (the only reader of the test split)."""
        self.final_phase = True
        lin, cfg = self.lineage, self.config
        seed = lin.seed()
        final = lin.incumbent() if final is None else final
        tasks = self.tasks("test", TEST_ROUND)
        skills = [seed] if final.id == seed.id else [seed, final]
        jobs = [
            Job("test", TEST_ROUND, s, t, rep) for rep in range(cfg.repeats) for s in skills for t in tasks
        ]
        self.run_jobs(jobs)
        order = [t.task_id for t in tasks]
        out: dict[str, Any] = {"tasks": len(tasks), "repeats": cfg.repeats}
        for name, skill in (("seed", seed), ("final", final)):
            episodes = lin.episodes(skill.id, "test", TEST_ROUND)
            p = fmean(e.success for e in episodes)
            out[name] = {
                "skill": skill.id,
                "success": p,
                "success_se": math.sqrt(p * (1 - p) / len(episodes)),
                "score": fmean(e.score for e in episodes),
                "cost_tokens": fmean(e.cost_tokens for e in episodes),
            }
        fs, fc = lin.scores(final.id, "test", TEST_ROUND, order)
        ss, sc = lin.scores(seed.id, "test", TEST_ROUND, order)
        out["d_score"] = fmean(pair(fs, ss, fc, sc, order=order).diffs)
        self.log(
            f"test ({len(tasks)} tasks x {cfg.repeats}): seed {seed.id} solved {out['seed']['success']:.1%} "
            f"(score {out['seed']['score']:.3f}), final {final.id} {out['final']['success']:.1%} "
            f"(score {out['final']['score']:.3f}); cost {out['seed']['cost_tokens']:.0f} -> "
            f"{out['final']['cost_tokens']:.0f} tokens/episode"
        )
        return out

    # ------------------------------------------------------------------ reporting

    def round_rows(self) -> list[dict[str, Any]]:
        """Per round: incumbent, parent, candidates with their decisions, length and share of the parent they
        dropped, proposals well-formed, dev episodes run and planned, the incumbent's length after the round."""
        lin, cfg = self.lineage, self.config
        rows = []
        for r in range(1, lin.current_round() + 1):
            cands = lin.candidates(round=r)
            inc_id = lin.round_incumbent(r) or lin.incumbent().id
            run = len(lin.graded(inc_id, DEV, r)) + sum(len(lin.graded(c.skill.id, DEV, r)) for c in cands)
            planned = (1 + len(cands)) * cfg.dev_tasks * cfg.repeats if cands else 0
            dropped = [reason for _, _, reason in lin.dropped(r)]
            after = lin.round_winner(r) or inc_id
            rows.append(
                {
                    "round": r,
                    "incumbent": inc_id,
                    "parent": lin.round_parent(r),
                    "finished": lin.round_finished(r),
                    "candidates": [
                        {
                            "skill": c.skill.id,
                            "parent": c.skill.parent,
                            "status": c.status,
                            "predicts": c.skill.predicts,
                            "decision": c.decision,
                            "chars": len(c.skill.body),
                            "removed_share": round(share, 3),
                            "flagged": share > cfg.max_removed_share,
                        }
                        for c in cands
                        for share in [removed_share(lin.skill(c.skill.parent or inc_id).body, c.skill.body)]
                    ],
                    "dropped": dropped,
                    "proposed": len(cands) + len(dropped),
                    "well_formed": len(cands) + sum(well_formed(reason) for reason in dropped),
                    "skill_chars": len(lin.skill(after).body),
                    "dev_episodes_run": run,
                    "dev_episodes_planned": planned,
                }
            )
        return rows

    def summary(self, *, stopped: bool, final: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        rows = self.round_rows()
        return {
            "stopped": stopped,
            "stop_reason": reason,
            "rounds_finished": sum(r["finished"] for r in rows),
            "seed": self.lineage.seed().id,
            "incumbent": self.lineage.incumbent().id,
            "rounds": rows,
            "dev_episodes_run": sum(r["dev_episodes_run"] for r in rows),
            "dev_episodes_planned": sum(r["dev_episodes_planned"] for r in rows),
            "proposals": sum(r["proposed"] for r in rows),
            "well_formed": sum(r["well_formed"] for r in rows),
            "pool": [{"skill": sid, "wins": wins} for sid, wins in self.lineage.pool()],
            "episodes": self.lineage.episode_count(),
            "test": final,
        }

    def write_report(self, summary: dict[str, Any] | None = None) -> None:
        """``report.md``: rounds, every candidate's decision, dev episodes saved, the test comparison."""
        rows = summary["rounds"] if summary else self.round_rows()
        lines = [
            "# ctxrl evolve",
            "",
            f"Incumbent: `{self.lineage.incumbent().id}` (seed `{self.lineage.seed().id}`).",
            "",
            "| round | incumbent | candidate | predicts | decision | dev tasks run | d (score) | p (superior) | alpha_k |",
            "|---:|---|---|---|---|---:|---:|---:|---:|",
        ]
        for row in rows:
            if not row["candidates"]:
                lines.append(f"| {row['round']} | `{row['incumbent']}` | (none) | | | | | | |")
            for c in row["candidates"]:
                d = c["decision"] or {}
                p = d.get("p_superior")
                flag = f" (flagged: drops {c['removed_share']:.0%} of its parent)" if c["flagged"] else ""
                lines.append(
                    f"| {row['round']} | `{row['incumbent']}` | `{c['skill']}`{flag} | {c['predicts'][:60]} | "
                    f"{c['status']} ({d.get('branch', '-')}) | {d.get('n_tasks', '-')}/{d.get('n_planned', '-')} | "
                    f"{d.get('d', float('nan')):+.3f} | {'-' if p is None else f'{p:.4f}'} | "
                    f"{d.get('alpha_k', float('nan')):.4f} |"
                )
        run = sum(r["dev_episodes_run"] for r in rows)
        planned = sum(r["dev_episodes_planned"] for r in rows)
        proposed = sum(r["proposed"] for r in rows)
        formed = sum(r["well_formed"] for r in rows)
        pool = ", ".join(f"`{sid}` ({wins})" for sid, wins in self.lineage.pool())
        lines += [
            "",
            f"Dev episodes run {run} of {planned} planned (saved by early stops: {planned - run}).",
            f"Proposals well-formed: {formed} of {proposed}. Skill length after each round (characters): "
            + (", ".join(str(r["skill_chars"]) for r in rows) or "-")
            + ".",
            f"Pareto pool (tasks best on): {pool}.",
        ]
        if summary and summary.get("test"):
            t = summary["test"]
            lines += [
                "",
                f"Test split ({t['tasks']} tasks x {t['repeats']}), read once after the rounds:",
                "",
                "| skill | success | score | cost tokens/ep |",
                "|---|---:|---:|---:|",
                *(
                    f"| {name} `{t[name]['skill']}` | {t[name]['success']:.3f} ± {t[name]['success_se']:.3f} | "
                    f"{t[name]['score']:.3f} | {t[name]['cost_tokens']:,.0f} |"
                    for name in ("seed", "final")
                ),
            ]
        write_atomic(self.run_dir / REPORT_FILE, "\n".join(lines) + "\n")

    def close(self) -> None:
        self.lineage.close()


def _describe(decision: GateDecision) -> str:
    verdict = "accepted" if decision.accept else "rejected"
    p = (
        ""
        if decision.p_superior is None
        else f", p {decision.p_superior:.4f} vs alpha_k {decision.alpha_k:.4f}"
    )
    return (
        f"{verdict} ({decision.branch}) after {decision.n_tasks}/{decision.n_planned} dev tasks: "
        f"d {decision.d:+.3f}{p}, cost {decision.cost_incumbent:.0f} -> {decision.cost_candidate:.0f}, "
        f"{decision.episodes_saved} episodes saved"
    )
