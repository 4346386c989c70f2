"""Rounds of evolution composed from the evolve pieces, with a fake skill-reading evaluator: the subject of the
kill -9 test (and a sketch of how the round loop composes them).

    python tests/evolve/evolve_driver.py RUN_DIR [--rounds 2] [--sleep 0.005]

The evaluator is not a model: an episode's outcome is a hash of (task, seed, repeat) compared with a success
probability that depends on the compaction threshold the skill states (best near 35 %), so the same episode
key always gives the same result and the offline proposer's edits change the outcome. Failed episodes show an
urgent nudge and end by overflow, which the notes and the proposer act on.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

from ctxrl.evolve.gate import CtxrlGate, GateDecision, choose, pair
from ctxrl.evolve.lineage import Lineage
from ctxrl.evolve.notes import build_notes, known_steps
from ctxrl.evolve.proposal import read_proposal
from ctxrl.evolve.proposers import OfflineProposer, compact_percent
from ctxrl.evolve.skill import Skill
from ctxrl.train.trajectory import EpisodeRecord, StepCost, StepRecord

TRAIN = [(f"train-{i}", 1000 + i) for i in range(6)]
DEV = [(f"dev-{i:02d}", 2000 + i) for i in range(40)]
REPEATS = {"train": 2, "dev": 2}
CANDIDATES = 3
URGENT = "[context] URGENT: 100 tokens left before the limit of 2000; the next large output may overflow."


def _u(*key: object) -> float:
    digest = hashlib.sha256(repr(key).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _step(ctx: int, nudges: list[str]) -> StepRecord:
    return StepRecord(
        prompt_ids=[], token_ids=[], logprobs=[], edit_mask=[], finish_reason="stop", num_cached_tokens=0,
        prompt_source="extend", rebuild_reason=None, text="", tool_calls=["run"], edit_calls=[], receipts=[],
        receipt_kinds=[], readout="", nudges=nudges, context_tokens=ctx, edited=False, free_turn=False,
        cost=StepCost(ctx, 0, 10, None),
    )  # fmt: skip


def evaluate(skill: Skill, split: str, task: str, seed: int, repeat: int) -> EpisodeRecord:
    percent = compact_percent(skill.body) or 60
    p = max(0.05, 0.95 - abs(percent - 35) / 60)
    u = _u(task, seed, repeat)  # common random numbers: the skill changes the probability, not the draw
    success = u < p
    steps = [
        _step(800, []),
        _step(1500, []),
        _step(1900 if not success else 900, [] if success else [URGENT]),
    ]
    return EpisodeRecord(
        task_id=task, family="fake", split=split, seed=seed, difficulty="easy", mode=skill.mode,
        skill_id=skill.id, group=0, index=repeat, engine="fake", success=success, score=float(success),
        reward=float(success), end_reason="submit" if success else "overflow", answer=None, verdict="",
        cost_tokens=1000.0 + 10 * percent + 100 * u, cost_flops=None, steps=steps,
    )  # fmt: skip


def run_missing(
    lineage: Lineage, skill: Skill, split: str, round: int, tasks: list[tuple[str, int]], sleep: float
) -> None:
    """Grade every (task, seed, repeat) of ``tasks`` not yet recorded; record each as it completes."""
    done = lineage.graded(skill.id, split, round)
    for task, seed in tasks:
        for repeat in range(REPEATS[split]):
            if (task, seed, repeat) in done:
                continue
            time.sleep(sleep)  # stands in for the episode's work: a kill can land here
            record = evaluate(skill, split, task, seed, repeat)
            assert lineage.record_episode(skill.id, split, round, repeat=repeat, record=record)
            print(f"graded {skill.id} {split} {round} {task} {seed} {repeat}", flush=True)


def evolve(run_dir: str, rounds: int, sleep: float) -> None:
    lineage = Lineage.open(run_dir, mode="file")
    gate = CtxrlGate(look_every=10)
    for r in range(1, rounds + 1):
        if lineage.round_finished(r):
            continue
        lineage.begin_round(r)
        inc = lineage.skill(lineage.incumbent().id)
        run_missing(lineage, inc, "train", r, TRAIN, sleep)
        notes = build_notes(lineage.episodes(inc.id, "train", r))
        if not lineage.proposed(r):
            texts = OfflineProposer().propose(inc, notes, CANDIDATES, round=r)
            steps = known_steps(notes)
            lineage.record_proposals(
                r, [read_proposal(t, parent=inc, round=r, known_steps=steps) for t in texts]
            )
        for row in lineage.candidates(round=r, status="pending"):
            k = lineage.gate_index(row.skill.id)
            for n in gate.looks(len(DEV)):
                for skill in (inc, row.skill):
                    run_missing(lineage, skill, "dev", r, DEV[:n], sleep)
                order = [t for t, _ in DEV[:n]]
                cs, cc = lineage.scores(row.skill.id, "dev", r, order)
                is_, ic = lineage.scores(inc.id, "dev", r, order)
                decision = gate.decide(pair(cs, is_, cc, ic, order=order), k=k, n_planned=len(DEV), repeats=2)
                if decision is not None:
                    lineage.decide(row.skill.id, decision)
                    break
        accepted = lineage.candidates(round=r, status="accepted")
        winner = None
        if accepted:
            decisions = [GateDecision(**a.decision) for a in accepted if a.decision is not None]
            winner = accepted[choose(decisions)].skill.id
        lineage.finish_round(r, winner)
        print(f"round {r} winner {winner}", flush=True)
    lineage.close()
    print("done", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()
    evolve(args.run_dir, args.rounds, args.sleep)
    return None


if __name__ == "__main__":
    sys.exit(main())
