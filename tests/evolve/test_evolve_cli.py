"""``ctxrl evolve`` end to end on a CPU: the skill-reading scripted manager, the offline proposer, two rounds;
everything in SQLite; a kill -9 of the real CLI process mid-round loses nothing graded and the resumed run ends
in the uninterrupted run's state."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ctxrl.cli import main
from ctxrl.env.skills import compact_percent
from ctxrl.evolve.lineage import BEST, DB_NAME, Lineage
from ctxrl.evolve.skill import parse_skill

ROOT = Path(__file__).parents[2]
SEED = ROOT / "configs" / "skills" / "file_compact90.md"


def _args(out: Path) -> list[str]:
    return [
        "evolve", "--config", str(ROOT / "configs" / "evolve_tiny.yaml"), "--out", str(out),
        f"evolve.seed_skill={SEED}", "tasks.families=[board,retention]", "evolve.rounds=2",
        "evolve.train_tasks=4", "evolve.dev_tasks=2", "evolve.test_tasks=1", "evolve.proposals=2",
        "evolve.gate.alpha=0.5", "evolve.gate.look_every=1", "evolve.gate.min_tasks=1",
    ]  # fmt: skip


def _state(run_dir: Path) -> dict[str, Any]:
    with Lineage.open(run_dir, mode="file") as lin:
        snap = lin.snapshot()
    snap["best"] = (run_dir / BEST).read_text()
    return snap


def _episodes(run_dir: Path) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    if not (run_dir / DB_NAME).exists():
        return {}
    conn = sqlite3.connect(run_dir / DB_NAME)
    try:
        rows = conn.execute(
            "SELECT skill, split, round, task_id, seed, repeat, success, score, cost FROM episodes"
        ).fetchall()
    except sqlite3.OperationalError:
        return {}
    finally:
        conn.close()
    return {row[:6]: row[6:] for row in rows}


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("evolve") / "run"
    assert main(_args(out)) == 0
    return out


@pytest.mark.slow
def test_two_rounds_end_to_end_record_everything(clean: Path) -> None:
    with Lineage.open(clean, mode="file") as lin:
        seed = lin.seed()
        assert compact_percent(seed.body) == 90 and seed.body == parse_skill(SEED.read_text()).body
        cands = lin.candidates(round=1)
        # the seed's failed train runs hit the limit: the offline proposer lowers 90 % by 10 and by 20 points
        assert [compact_percent(c.skill.body) for c in cands] == [80, 70]
        assert all(c.skill.parent == seed.id and c.skill.targets for c in cands)
        assert all(c.status in ("accepted", "rejected") and c.decision is not None for c in cands)
        assert lin.round_finished(1) and lin.round_finished(2)
        accepted = [c for c in cands if c.status == "accepted"]
        assert lin.incumbent().id == (accepted[0].skill.id if accepted else seed.id) or len(accepted) > 1
        assert parse_skill((clean / BEST).read_text()) == lin.incumbent()
        # 4 train tasks x 2 repeats of the seed; dev: the seed and each candidate on the tasks its gate saw
        assert len(lin.graded(seed.id, "train", 1)) == 8
        for c in cands:
            assert c.decision is not None
            dev = lin.graded(c.skill.id, "dev", 1)
            assert len(dev) == c.decision["n_tasks"] and dev <= lin.graded(seed.id, "dev", 1)
            for ep in lin.episodes(c.skill.id, "dev", 1):
                assert ep.skill_id == c.skill.id and ep.split == "dev" and ep.steps
        # the test split: seed and final skill only, stored outside any round
        test_skills = {k[0] for k in _episodes(clean) if k[1] == "test"}
        assert test_skills == {seed.id, lin.incumbent().id}
        assert {k[2] for k in _episodes(clean) if k[1] == "test"} == {0}
    summary = json.loads((clean / "evolve.json").read_text())
    assert summary["rounds_finished"] == 2 and summary["test"]["seed"]["skill"] == seed.id
    assert [row["round"] for row in summary["rounds"]] == [1, 2]
    assert (clean / "rounds" / "1" / "notes.md").read_text().startswith("### note n1")
    assert "| 1 |" in (clean / "report.md").read_text()


@pytest.mark.slow
def test_kill_9_mid_round_then_resume_loses_nothing_and_ends_in_the_clean_state(
    clean: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "ctxrl.cli", *_args(out)]  # a new run: --resume is for one that exists
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while len(_episodes(out)) < 8 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # kill once the train episodes are in, while the round is under way
    assert proc.poll() is None, "the run ended before the kill; the test needs a longer run"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = _episodes(out)
    with Lineage.open(out, mode="file") as lin:
        assert not lin.round_finished(1)
    assert main([*_args(out), "--resume"]) == 0
    after = _episodes(out)
    assert all(after[k] == v for k, v in before.items())  # every graded episode survived, unchanged
    assert _state(out) == _state(clean)  # same candidates, decisions, proposal numbers, episodes, best skill


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


def test_bad_input_is_one_line_before_any_episode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ctxrl.commands.common import save_config
    from ctxrl.commands.config import load_run_config

    out = tmp_path / "run"
    err = _fails([*_args(out), "evolve.seed_skill=no/such/SKILL.md"], capsys)
    assert "evolve.seed_skill: cannot read no/such/SKILL.md" in err
    err = _fails([*_args(tmp_path / "b"), "evolve.proposer=openai"], capsys)
    assert "proposer=openai needs proposer_url" in err
    err = _fails([*_args(tmp_path / "c"), "engine.policy=tools-manager"], capsys)
    assert "engine.policy=tools-manager acts in mode tools, but rollout.mode=file" in err
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("x")
    err = _fails(["evolve", "--out", str(tmp_path / "d"), "--resume"], capsys)
    assert "holds no evolution run" in err
    # issue 24: a typo'd --out with --resume is refused at once, not started as a new night
    err = _fails([*_args(tmp_path / "no-such-run"), "--resume"], capsys)
    assert f"--resume: {tmp_path / 'no-such-run'} does not exist" in err
    assert not (tmp_path / "no-such-run").exists()
    (tmp_path / "empty").mkdir()
    assert "holds no evolution run" in _fails([*_args(tmp_path / "empty"), "--resume"], capsys)
    # a resumed run may not change what it measures
    run = tmp_path / "e"
    Lineage.open(run, mode="file").close()
    save_config(load_run_config(ROOT / "configs" / "evolve_tiny.yaml", _args(run)[5:]), run)
    err = _fails(["evolve", "--out", str(run), "--resume", "evolve.dev_tasks=3"], capsys)
    assert "--resume: evolve.dev_tasks was 2 in" in err and "now 3" in err
    err = _fails(
        ["evolve", "--out", str(run), "--resume", "--model", "other/model"], capsys
    )  # a flag counts too
    assert "--resume: model was None in" in err and "now 'other/model'" in err


def test_hours_spent_end_the_rounds_and_the_test_comparison_still_runs(tmp_path: Path) -> None:
    out = tmp_path / "night"
    out.mkdir()
    (out / "night.json").write_text(json.dumps({"started": time.time() - 2 * 3600}))  # began two hours ago
    assert main([*_args(out), "--hours", "1.5", "--resume"]) == 0  # night.json alone: a night not yet begun
    summary = json.loads((out / "evolve.json").read_text())
    assert summary["stopped"] and summary["stop_reason"] == "the night's hours are spent"
    assert summary["rounds_finished"] == 0 and summary["test"]["seed"]["skill"] == summary["seed"]
    assert {k[1] for k in _episodes(out)} == {"test"}  # no train or dev batch started after the deadline


def test_the_nights_clock_starts_once(tmp_path: Path) -> None:
    from ctxrl.commands.evolve import night_deadline
    from ctxrl.errors import UsageError

    first = night_deadline(tmp_path, 10)
    started = json.loads((tmp_path / "night.json").read_text())["started"]
    assert abs(first - (started + 36000)) < 1e-6 and abs(started - time.time()) < 60
    assert night_deadline(tmp_path, 2) == started + 7200  # a restart (or another --hours) keeps the start
    with pytest.raises(UsageError, match="--hours must be > 0"):
        night_deadline(tmp_path, 0)
    (tmp_path / "night.json").write_text("{not json")
    with pytest.raises(UsageError, match=r"night\.json is unreadable"):
        night_deadline(tmp_path, 1)


def test_overnight_script_resumes_only_a_run_that_exists(tmp_path: Path) -> None:
    """The night's first try starts the run; later tries resume it (``--resume`` of no run is an error)."""
    script = ROOT / "scripts" / "evolve_overnight.sh"
    env = {**os.environ, "CTXRL": "echo ctxrl"}  # print the command the loop would run, which exits 0
    out = tmp_path / "night"
    first = subprocess.run(
        ["bash", str(script), str(out), "--hours", "1"], env=env, capture_output=True, text=True
    )
    assert first.returncode == 0 and first.stdout.split() == [
        "ctxrl",
        "evolve",
        "--hours",
        "1",
        "--out",
        str(out),
    ]
    out.mkdir()
    (out / "config.yaml").write_text("{}\n")
    again = subprocess.run(["bash", str(script), str(out)], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.split() == [
        "ctxrl",
        "evolve",
        "--out",
        str(out),
        "--resume",
    ]
