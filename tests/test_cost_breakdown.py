"""scripts/cost_breakdown.py, which the learning benchmark's write-up cites for where a policy's compute goes: its
turn kinds on a hand-built episode, and the whole script on a recorded rollout (so a change of the trajectory
format cannot leave it reading zeros)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("cost_breakdown", ROOT / "scripts" / "cost_breakdown.py")
assert SPEC is not None and SPEC.loader is not None
cost_breakdown = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(cost_breakdown)


def _turn(tools: list[str], flops: float, *, edited: bool = False, rebuilt: bool = False) -> dict:
    return {
        "tool_calls": tools,
        "edited": edited,
        "cost": {"flops": flops},
        "prompt_source": "rebuild" if rebuilt else "extend",
        "rebuild_reason": "edit" if rebuilt else None,
    }


def _episode(success: bool, steps: list[dict]) -> dict:
    return {"task_id": "retention:small:1", "family": "retention", "difficulty": "small", "success": success,
            "steps": steps}  # fmt: skip


def test_reads_past_the_streams_end_edits_and_rebuilt_turns_are_told_apart() -> None:
    # `small` has three parts: the fourth read is the end check and the fifth a late read, an edit between or not
    long = _episode(True, [
        _turn(["next_chunk"], 10), _turn(["next_chunk"], 10), _turn(["shell"], 30, edited=True),
        _turn(["next_chunk"], 20, rebuilt=True), _turn(["next_chunk"], 5), _turn(["next_chunk"], 5),
        _turn(["submit"], 20),
    ])  # fmt: skip
    short = _episode(False, [_turn(["next_chunk"], 40), _turn(["shell"], 10), _turn(["submit"], 50)])
    row = cost_breakdown.breakdown([long, short])
    assert row["compute_share"] == pytest.approx(
        {"read": 80 / 200, "end_check": 5 / 200, "late_read": 5 / 200, "edit": 30 / 200, "submit": 70 / 200,
         "other": 10 / 200}
    )  # fmt: skip
    assert row["per_episode"]["read"] == 2.0
    assert row["per_episode"]["end_check"] == 0.5 and row["per_episode"]["late_read"] == 0.5
    assert row["rebuilt_after_edit_share"] == pytest.approx(20 / 200)
    assert row["solved"] == 1 and row["gflop_per_success"] == pytest.approx(200 / 1e9)
    assert row["read_every_part"] == 1
    assert row["success_if_read_every_part"] == 1.0 and row["success_otherwise"] == 0.0


def test_an_episode_of_another_family_or_a_broken_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="board:easy:3: not a retention episode"):
        cost_breakdown.breakdown([{"task_id": "board:easy:3", "family": "board", "steps": []}])
    with pytest.raises(ValueError, match="retention:huge:1: unknown retention level 'huge'"):
        cost_breakdown.breakdown(
            [{"task_id": "retention:huge:1", "family": "retention", "difficulty": "huge"}]
        )
    (tmp_path / "trajectories.jsonl").write_text('{"a": 1}\n{broken\n')
    assert cost_breakdown.main([str(tmp_path)]) == 2


@pytest.mark.slow
def test_the_script_reads_a_recorded_rollout(tmp_path: Path, tiny_model_dir: Path) -> None:
    roll = tmp_path / "roll"
    recorded = subprocess.run(
        [sys.executable, "-m", "ctxrl.cli", "rollout", "--model", str(tiny_model_dir), "--out", str(roll),
         "engine.name=scripted", "engine.policy=file-manager", "rollout.group_size=2", "tasks.count=2",
         "tasks.families=[retention]", "tasks.difficulty=small"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert recorded.returncode == 0, recorded.stderr[-2000:]
    out = tmp_path / "breakdown.json"
    ran = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cost_breakdown.py"), str(roll), "--out", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    row = json.loads(out.read_text())["roll"]
    # the scripted manager reads the three parts once each, keeps its notes in an edit and solves every task
    assert row["episodes"] == 4 and row["solved"] == 4
    assert row["per_episode"]["read"] == 3.0 and row["per_episode"]["late_read"] == 0.0
    assert row["per_episode"]["end_check"] == 0.0  # it stops at the count of parts the prompt names
    assert row["per_episode"]["edit"] >= 1.0 and row["compute_share"]["edit"] > 0
    assert sum(row["compute_share"].values()) == pytest.approx(1.0)
    assert row["success_if_read_every_part"] == 1.0
