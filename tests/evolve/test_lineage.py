"""The lineage store: state survives reopening and kill -9; nothing graded is lost or duplicated."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ctxrl.evolve.gate import GateDecision
from ctxrl.evolve.lineage import BEST, DB_NAME, Lineage, LineageError
from ctxrl.evolve.skill import Dropped, Skill, parse_skill, seed_skill
from ctxrl.train.trajectory import EpisodeRecord, StepCost, StepRecord

DRIVER = Path(__file__).with_name("evolve_driver.py")
SRC = Path(__file__).resolve().parents[2] / "src"


def record(skill: Skill, task: str, score: float, cost: float, seed: int = 1) -> EpisodeRecord:
    step = StepRecord(
        prompt_ids=[1, 2, 3], token_ids=[4, 5], logprobs=[-0.1, -0.2], edit_mask=[0, 1], finish_reason="stop",
        num_cached_tokens=0, prompt_source="reset", rebuild_reason=None, text="t", tool_calls=["run"],
        edit_calls=[], receipts=["[context] applied: 9 → 5 tokens"], receipt_kinds=["applied"], readout="r",
        nudges=[], context_tokens=5, edited=True, free_turn=False, cost=StepCost(3, 0, 2, None),
    )  # fmt: skip
    return EpisodeRecord(
        task_id=task, family="retention", split="dev", seed=seed, difficulty="easy", mode="file",
        skill_id=skill.id, group=0, index=0, engine="scripted", success=score == 1.0, score=score,
        reward=score, end_reason="submit", answer="a", verdict="", cost_tokens=cost, cost_flops=None,
        steps=[step],
    )  # fmt: skip


def candidate(body: str, round: int = 1, parent: str | None = None) -> Skill:
    return Skill(body, "file", parent or seed_skill("file").id, round, ("[n1.B.s0]",), "better")


def decision(accept: bool, d: float = 0.1) -> GateDecision:
    return GateDecision("ctxrl", accept, "superior" if accept else "rejected", 40, 40, d, 0.05, 1.0, 1.0, k=1)


def test_new_run_has_the_seed_as_incumbent_and_reopens_the_same(tmp_path: Path) -> None:
    with Lineage.open(tmp_path, mode="file") as lin:
        assert lin.incumbent() == seed_skill("file") == lin.seed()
        assert lin.current_round() == 0
        mode = lin._conn.execute("PRAGMA journal_mode").fetchone()[0]
        assert mode == "wal"
    assert parse_skill((tmp_path / BEST).read_text()) == seed_skill("file")
    with Lineage.open(tmp_path, mode="file") as again:
        assert again.incumbent() == seed_skill("file")
        assert [c.status for c in again.candidates()] == ["seed"]
    with pytest.raises(LineageError, match="of mode 'file', not 'tools'"):
        Lineage.open(tmp_path, mode="tools")


def test_episodes_are_recorded_once_and_read_back(tmp_path: Path) -> None:
    lin = Lineage.open(tmp_path, mode="file")
    inc = lin.incumbent()
    assert lin.record_episode(inc.id, "dev", 1, repeat=0, record=record(inc, "a", 1.0, 10.0))
    assert lin.record_episode(inc.id, "dev", 1, repeat=1, record=record(inc, "a", 0.0, 30.0))
    assert lin.record_episode(inc.id, "dev", 1, repeat=0, record=record(inc, "b", 0.5, 20.0))
    # the same key again: refused, the stored episode kept
    assert not lin.record_episode(inc.id, "dev", 1, repeat=0, record=record(inc, "a", 0.0, 99.0))
    assert lin.episode_count() == 3
    assert lin.graded(inc.id, "dev", 1) == {("a", 1, 0), ("a", 1, 1), ("b", 1, 0)}
    assert lin.scores(inc.id, "dev", 1) == ({"a": [1.0, 0.0], "b": [0.5]}, {"a": [10.0, 30.0], "b": [20.0]})
    assert lin.scores(inc.id, "dev", 1, tasks=["b"]) == ({"b": [0.5]}, {"b": [20.0]})
    back = lin.episodes(inc.id, "dev", 1)[0]
    assert back.task_id == "a" and back.score == 1.0
    assert back.steps[0].receipts == ["[context] applied: 9 → 5 tokens"] and back.steps[0].token_ids == []
    with pytest.raises(LineageError, match="ran skill"):
        lin.record_episode("0" * 16, "dev", 1, repeat=0, record=record(inc, "c", 1.0, 1.0))
    with pytest.raises(LineageError, match="split"):
        lin.record_episode(inc.id, "val", 1, repeat=0, record=record(inc, "c", 1.0, 1.0))


def test_a_round_proposals_gate_and_promotion(tmp_path: Path) -> None:
    lin = Lineage.open(tmp_path, mode="file")
    seed = lin.incumbent()
    with pytest.raises(LineageError, match="first round is 1"):
        lin.begin_round(2)
    lin.begin_round(1)
    lin.begin_round(1)  # resumed: a no-op
    a, b = candidate("## A\nbody a"), candidate("## B\nbody b")
    dup = candidate(seed.body.strip())
    lin.record_proposals(1, [a, Dropped("junk", "no frontmatter"), b, dup])
    assert lin.proposed(1)
    with pytest.raises(LineageError, match="recorded already"):
        lin.record_proposals(1, [a])
    assert [(c.skill.id, c.slot, c.status) for c in lin.candidates(round=1)] == [
        (a.id, 0, "pending"),
        (b.id, 2, "pending"),
    ]
    assert lin.dropped(1) == [(1, 1, "no frontmatter"), (1, 3, f"duplicate of skill {seed.id} (round 0)")]
    # proposal numbers are handed out once, in the order asked, and kept
    assert lin.gate_index(b.id) == 1 and lin.gate_index(a.id) == 2 and lin.gate_index(b.id) == 1
    with pytest.raises(LineageError, match="undecided"):
        lin.finish_round(1, None)
    lin.decide(a.id, decision(True))
    lin.decide(b.id, decision(False))
    with pytest.raises(LineageError, match="not pending"):
        lin.decide(a.id, decision(True))
    with pytest.raises(LineageError, match="not an accepted candidate"):
        lin.finish_round(1, b.id)
    lin.finish_round(1, a.id)
    assert lin.incumbent() == a and parse_skill((tmp_path / BEST).read_text()) == a
    assert lin.candidates(round=1, status="accepted")[0].decision == decision(True).to_dict()
    lin.close()
    with Lineage.open(tmp_path, mode="file") as again:
        assert again.incumbent() == a and again.round_finished(1) and again.current_round() == 1
        again.begin_round(2)
        with pytest.raises(LineageError, match="round 3 cannot begin"):
            again.begin_round(3)


def test_a_stale_best_skill_file_is_rewritten_from_the_database(tmp_path: Path) -> None:
    Lineage.open(tmp_path, mode="file").close()
    (tmp_path / BEST).write_text("half a fil")
    Lineage.open(tmp_path, mode="file").close()
    assert parse_skill((tmp_path / BEST).read_text()) == seed_skill("file")
    assert not [p for p in (tmp_path / BEST).parent.iterdir() if p.name.endswith(".tmp")]


def test_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / DB_NAME).write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(LineageError, match="not a usable lineage database"):
        Lineage.open(tmp_path, mode="file")


def _driver(run_dir: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.Popen(
        [sys.executable, str(DRIVER), str(run_dir), "--sleep", "0.012"],  # ~7 s of work: ten kills fit
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _read_graded(proc: subprocess.Popen[bytes], k: int) -> list[str] | None:
    """The driver's output up to its ``k``-th ``graded`` line; None if it ends first."""
    assert proc.stdout is not None
    lines: list[str] = []
    while sum(line.startswith("graded ") for line in lines) < k:
        line = proc.stdout.readline().decode()
        if not line:
            return None
        lines.append(line.rstrip("\n"))
    return lines


def _episodes_in(run_dir: Path) -> int:
    """Episodes recorded so far (0 if the kill came before the table existed)."""
    if not (run_dir / DB_NAME).exists():
        return 0
    conn = sqlite3.connect(run_dir / DB_NAME)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM episodes").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


def _episode_keys(run_dir: Path) -> set[tuple[str, ...]]:
    conn = sqlite3.connect(run_dir / DB_NAME)
    try:
        rows = conn.execute("SELECT skill, split, round, task_id, seed, repeat FROM episodes").fetchall()
    finally:
        conn.close()
    return {tuple(str(v) for v in row) for row in rows}


def _snapshot(run_dir: Path) -> dict[str, object]:
    with Lineage.open(run_dir, mode="file") as lin:
        snap = lin.snapshot()
    snap["best"] = (run_dir / BEST).read_text()
    return snap


@pytest.mark.slow
def test_kill_9_ten_times_then_resume_gives_the_uninterrupted_state(tmp_path: Path) -> None:
    clean = _driver(tmp_path / "clean")
    out, err = clean.communicate(timeout=300)
    assert clean.returncode == 0, err.decode()
    assert out.decode().splitlines()[-1] == "done"
    want = _snapshot(tmp_path / "clean")
    assert want["incumbent"] != seed_skill("file").id  # the run did evolve (round 1 accepted a candidate)

    rng = random.Random(0)
    run = tmp_path / "killed"
    kills = 0
    counts = []
    while kills < 10:
        proc = _driver(run)
        # the kill waits for an event, not a clock: the k-th episode this process records (k at random), then
        # a random share of one episode's work, so it lands anywhere in the next episode, its write included
        lines = _read_graded(proc, rng.randint(1, 12))
        if lines is None:  # finished before the kill came
            break
        time.sleep(rng.uniform(0.0, 0.015))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        kills += 1
        counts.append(_episodes_in(run))
        # every episode the killed process reported as recorded is in the database
        reported = {
            tuple(line.split()[1:])
            for line in [*lines, *out.decode().splitlines()]
            if line.startswith("graded ")
        }
        assert reported and reported <= _episode_keys(run)
    assert kills == 10, "the run finished before ten kills; lengthen it"
    assert counts == sorted(counts) and counts[-1] > 0  # progress is kept across kills
    final = _driver(run)
    out, err = final.communicate(timeout=300)
    assert final.returncode == 0, err.decode()
    got = _snapshot(run)
    assert got == want  # same candidates, decisions, proposal numbers, episodes (each once), incumbent file


def test_the_pool_keeps_a_candidate_that_wins_one_task_and_drops_one_that_wins_none(tmp_path: Path) -> None:
    lin = Lineage.open(tmp_path, mode="file")
    seed = lin.incumbent()
    lin.begin_round(1)
    a, b = candidate("## A\nbody a"), candidate("## B\nbody b")
    lin.record_proposals(1, [a, b])
    table = {"t1": (1.0, 0.0, 0.0), "t2": (0.0, 1.0, 0.0), "t3": (1.0, 1.0, 1.0), "t4": (0.0, 0.0, 0.0)}
    for task, scores in table.items():
        for skill, score in zip((seed, a, b), scores):
            lin.record_episode(skill.id, "dev", 1, repeat=0, record=record(skill, task, score, 10.0))
    lin.decide(a.id, decision(False))
    lin.decide(b.id, decision(False))
    lin.finish_round(1, None)
    # t1 is the seed's, t2 is a's; t3 and t4 separate no one; b is best on no task
    assert lin.pool() == [(seed.id, 1), (a.id, 1)]
    assert lin.pool(before_round=1) == [(seed.id, 0)]  # the incumbent is always in it
    assert lin.round_winner(1) is None and lin.round_parent(1) is None  # no train episode was recorded
