"""The evolution loop with a fake runner (no episodes run): rounds, resume, STOP, and the test split kept away
from the gate."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ctxrl.env.skills import compact_percent
from ctxrl.env.tasks.base import Task
from ctxrl.evolve.config import EvolveConfig
from ctxrl.evolve.gate import CtxrlGate
from ctxrl.evolve.lineage import BEST, Lineage
from ctxrl.evolve.loop import STOP_FILE, EvolveError, EvolveLoop, Job, split_tasks
from ctxrl.evolve.notes import known_steps
from ctxrl.evolve.proposers import OfflineProposer
from ctxrl.evolve.skill import parse_skill, seed_skill
from ctxrl.train.trajectory import EpisodeRecord, StepCost, StepRecord, skill_id

URGENT = "[context] URGENT: 100 tokens left before the limit of 2000; the next large output may overflow."
FAMILIES = ("retention", "board")


def _step(ctx: int, nudges: list[str]) -> StepRecord:
    return StepRecord(
        prompt_ids=[], token_ids=[], logprobs=[], edit_mask=[], finish_reason="stop", num_cached_tokens=0,
        prompt_source="extend", rebuild_reason=None, text="", tool_calls=["run"], edit_calls=[], receipts=[],
        receipt_kinds=[], readout="", nudges=nudges, context_tokens=ctx, edited=False, free_turn=False,
        cost=StepCost(ctx, 0, 10, None),
    )  # fmt: skip


class FakeRunner:
    """Success with probability falling off from a best threshold of 35 %, drawn from (task, repeat) alone:
    common random numbers, so a lower stated threshold (the offline proposer's move on failures) does better."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, str, int]]] = []

    def __call__(self, tasks: Sequence[Task], skills: Sequence[str], repeat: int) -> list[EpisodeRecord]:
        self.batches.append([(t.task_id, skill_id(s), repeat) for t, s in zip(tasks, skills)])
        out = []
        for task, body in zip(tasks, skills):
            percent = compact_percent(body) or 60
            p = max(0.05, 0.95 - abs(percent - 35) / 60)
            u = (
                int.from_bytes(hashlib.sha256(f"{task.task_id}:{repeat}".encode()).digest()[:8], "big")
                / 2**64
            )
            ok = u < p
            steps = [_step(800, []), _step(1900 if not ok else 900, [] if ok else [URGENT])]
            out.append(
                EpisodeRecord(
                    task_id=task.task_id, family=task.family, split=task.split, seed=task.seed,
                    difficulty=task.difficulty, mode="file", skill_id=skill_id(body), group=0, index=repeat,
                    engine="fake", success=ok, score=float(ok), reward=float(ok),
                    end_reason="submit" if ok else "overflow", answer=None, verdict="",
                    cost_tokens=1000.0 + 10 * percent, cost_flops=None, steps=steps,
                )
            )  # fmt: skip
        return out


CONFIG = EvolveConfig(
    rounds=2, proposals=3, train_tasks=6, train_repeats=2, dev_tasks=12, repeats=1, test_tasks=6,
    gate=CtxrlGate(alpha=0.5, look_every=4, min_tasks=4),
)  # fmt: skip


def _loop(run_dir: Path, runner: Any, config: EvolveConfig = CONFIG) -> EvolveLoop:
    return EvolveLoop(
        run_dir, config, mode="file", families=FAMILIES, difficulty="easy", runner=runner,
        proposer=OfflineProposer(), log=lambda _: None,
    )  # fmt: skip


def _is_test(task_id: str) -> bool:
    return int(task_id.rsplit(":", 1)[1]) >= 110_000


def _state(run_dir: Path) -> dict[str, Any]:
    with Lineage.open(run_dir, mode="file") as lin:
        snap = lin.snapshot()
    snap["best"] = (run_dir / BEST).read_text()
    return snap


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], FakeRunner]:
    run = tmp_path_factory.mktemp("clean")
    runner = FakeRunner()
    loop = _loop(run, runner)
    summary = loop.run()
    loop.close()
    return run, summary, runner


def test_two_rounds_evolve_and_record_everything(clean: tuple[Path, dict[str, Any], FakeRunner]) -> None:
    run, summary, _ = clean
    with Lineage.open(run, mode="file") as lin:
        first = lin.candidates(round=1)
        # the seed states no threshold (60 %); failures with urgent steps -> 60-10, 60-20, 60-5
        assert [compact_percent(c.skill.body) for c in first] == [50, 40, 55]
        assert [c.proposal_k for c in first] == [1, 2, 3]
        assert all(c.status in ("accepted", "rejected") for c in first)
        # 40 % is nearest the fake's best (35 %): round 1's winner
        assert lin.round_incumbent(2) == first[1].skill.id
        assert parse_skill((run / BEST).read_text()) == lin.incumbent()
        # every dev episode a decision saw is recorded, for candidate and incumbent on the same task keys
        for c in first:
            assert c.decision is not None
            inc = {k for k in lin.graded(seed_skill("file").id, "dev", 1)}
            mine = lin.graded(c.skill.id, "dev", 1)
            assert len(mine) == c.decision["n_tasks"] and mine <= inc
        # round 1 proposes on the seed; round 2 on a skill of the pool the first round left
        rows = summary["rounds"]
        assert rows[0]["parent"] == seed_skill("file").id
        assert rows[1]["parent"] in [sid for sid, _ in lin.pool(before_round=2)]
        assert rows[0]["skill_chars"] == len(lin.skill(rows[1]["incumbent"]).body)
    # every proposal well-formed; edits only add a rule, so none drops any of its parent
    assert summary["well_formed"] == summary["proposals"] == sum(len(r["candidates"]) for r in rows) > 0
    assert all(c["removed_share"] == 0.0 and not c["flagged"] for r in rows for c in r["candidates"])
    assert summary["incumbent"] in [p["skill"] for p in summary["pool"]]
    assert summary["rounds_finished"] == 2 and not summary["stopped"]
    assert summary["test"]["seed"]["skill"] == seed_skill("file").id
    assert summary["test"]["final"]["skill"] == summary["incumbent"] != seed_skill("file").id
    report = (run / "report.md").read_text()
    assert report.count("| 1 |") == 3
    assert f"Proposals well-formed: {summary['well_formed']} of {summary['proposals']}." in report


def test_the_gate_reads_the_dev_split_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[tuple[str, bool]] = []
    decided: list[tuple[str, ...]] = []
    loop = _loop(tmp_path, FakeRunner(), replace(CONFIG, rounds=1))
    real_scores = Lineage.scores

    def scores(self: Lineage, skill: str, split: str, round: int, tasks: Any = None) -> Any:
        reads.append((split, loop.final_phase))
        return real_scores(self, skill, split, round, tasks)

    real_decide = CtxrlGate.decide

    def decide(self: CtxrlGate, paired: Any, **kw: Any) -> Any:
        decided.append(paired.tasks)
        return real_decide(self, paired, **kw)

    monkeypatch.setattr(Lineage, "scores", scores)
    monkeypatch.setattr(CtxrlGate, "decide", decide)
    loop.run()
    test_ids = {t.task_id for t in split_tasks(FAMILIES, "easy", "test", 0, 6)}
    assert decided and all(not set(tasks) & test_ids for tasks in decided)
    assert all(split == "dev" for split, final in reads if not final)
    assert {split for split, final in reads if final} == {"test"}
    # a test episode before the final phase, or a task of another split, is refused
    loop.final_phase = False
    seed = loop.lineage.seed()
    (test_task,) = split_tasks(FAMILIES, "easy", "test", 0, 1)
    with pytest.raises(EvolveError, match="test split is read only by the final comparison"):
        loop.run_jobs([Job("test", 0, seed, test_task, 0)])
    with pytest.raises(EvolveError, match="is of split test, not dev"):
        loop.run_jobs([Job("dev", 1, seed, test_task, 0)])
    loop.close()


def test_stop_file_ends_cleanly_and_resume_reaches_the_clean_state(
    tmp_path: Path, clean: tuple[Path, dict[str, Any], FakeRunner]
) -> None:
    clean_run, _, clean_runner = clean

    class StopAfter(FakeRunner):
        def __call__(self, tasks: Sequence[Task], skills: Sequence[str], repeat: int) -> list[EpisodeRecord]:
            if len(self.batches) == 4:  # mid-run: the next batch is not started
                (tmp_path / STOP_FILE).touch()
            return super().__call__(tasks, skills, repeat)

    first = StopAfter()
    loop = _loop(tmp_path, first)
    summary = loop.run()
    loop.close()
    assert summary["stopped"] and summary["rounds_finished"] < 2
    assert len(first.batches) == 6  # 5 batches, then only the test comparison's
    assert all(_is_test(task) for task, _, _ in first.batches[5])
    (tmp_path / STOP_FILE).unlink()
    second = FakeRunner()
    loop = _loop(tmp_path, second)
    loop.run()
    loop.close()
    got, want = _state(tmp_path), _state(clean_run)
    assert got == want
    # nothing graded twice: the resumed run asked only for what the stopped one had not recorded
    ran = [key for b in first.batches[:5] + second.batches for key in b]
    dev_train = [k for k in ran if not _is_test(k[0])]
    assert len(dev_train) == len(set(dev_train))
    assert sum(len(b) for b in clean_runner.batches) == len(got["episodes"])


def test_a_rewrite_that_drops_most_of_its_parent_is_flagged(tmp_path: Path) -> None:
    class Collapse:
        def propose(self, parent: Any, notes: Any, n: int, *, round: int) -> list[str]:
            cite = sorted(known_steps(notes))[0]
            return [json.dumps({"targets": [cite], "predicts": "shorter", "body": "## Context\nBe brief."})]

    loop = EvolveLoop(
        tmp_path, replace(CONFIG, rounds=1, proposals=1, proposal_style="rewrite"), mode="file",
        families=FAMILIES, difficulty="easy", runner=FakeRunner(), proposer=Collapse(), log=lambda _: None,
    )  # fmt: skip
    (row,) = loop.round_rows() if loop.round(1) else []
    (cand,) = row["candidates"]
    assert cand["flagged"] and cand["removed_share"] > 0.9 and cand["chars"] == len("## Context\nBe brief.")
    loop.write_report()
    loop.close()
    assert "(flagged: drops" in (tmp_path / "report.md").read_text()


class NoiseRunner:
    """Every skill equally good: success and cost are a hash of (task, repeat, skill), so any accept is false."""

    def __call__(self, tasks: Sequence[Task], skills: Sequence[str], repeat: int) -> list[EpisodeRecord]:
        out = []
        for task, body in zip(tasks, skills):
            sid = skill_id(body)
            u = (
                int.from_bytes(hashlib.sha256(f"{task.task_id}:{repeat}:{sid}".encode()).digest()[:8], "big")
                / 2**64
            )
            ok = u < 0.5
            steps = [_step(800, []), _step(1900 if not ok else 900, [] if ok else [URGENT])]
            out.append(
                EpisodeRecord(
                    task_id=task.task_id, family=task.family, split=task.split, seed=task.seed,
                    difficulty=task.difficulty, mode="file", skill_id=sid, group=0, index=repeat,
                    engine="fake", success=ok, score=float(ok), reward=float(ok),
                    end_reason="submit" if ok else "overflow", answer=None, verdict="",
                    cost_tokens=1000.0 + 1000.0 * u, cost_flops=None, steps=steps,
                )
            )  # fmt: skip
        return out


def test_with_parents_from_the_pool_every_proposal_still_spends_its_own_alpha(tmp_path: Path) -> None:
    """A null night (every skill equally good) with parents drawn from the pool: each proposal of the night gets
    its own number k (the gate's alpha spending goes on across rounds and parents), some round proposes from
    a skill other than the incumbent, and the gate at alpha = 0.05 accepts none of the noise."""
    config = replace(CONFIG, rounds=6, gate=CtxrlGate(look_every=4, min_tasks=4))
    loop = _loop(tmp_path, NoiseRunner(), config)
    summary = loop.run()
    with Lineage.open(tmp_path, mode="file") as lin:
        cands = lin.candidates()
        ks = [c.proposal_k for c in cands if c.status != "seed"]
    loop.close()
    assert len(ks) >= 6 and sorted(ks) == list(range(1, len(ks) + 1))
    assert any(r["parent"] != r["incumbent"] for r in summary["rounds"])
    assert all(c["status"] == "rejected" for r in summary["rounds"] for c in r["candidates"])
