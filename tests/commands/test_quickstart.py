"""The quickstart: its last stage (per-group advantages read back from a trajectory file), the tiny-model
step (``ensure_tiny_model``), and the whole ``ctxrl quickstart`` command."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ctxrl.commands.common import ensure_tiny_model
from ctxrl.commands.quickstart import _Story, advantage_report
from ctxrl.train.trajectory import EpisodeRecord, StepCost, StepRecord, load_trajectories, save_trajectories

ROOT = Path(__file__).resolve().parents[2]


def _episode(group: int, index: int, success: bool, flops: float, mask: list[int]) -> EpisodeRecord:
    step = StepRecord(
        prompt_ids=[1, 2, 3], token_ids=[4] * len(mask), logprobs=[0.0] * len(mask), edit_mask=mask,
        finish_reason="stop", num_cached_tokens=0, prompt_source="reset", rebuild_reason=None, text="",
        tool_calls=[], edit_calls=[], receipts=[], receipt_kinds=[], readout="", nudges=[],
        context_tokens=3, edited=False, free_turn=False, cost=StepCost(3, 0, len(mask), flops),
    )  # fmt: skip
    return EpisodeRecord(
        task_id=f"t{group}", family="retention", split="train", seed=group, difficulty="default", mode="file",
        skill_id="s", group=group, index=index, engine="scripted", success=success, score=float(success),
        reward=float(success), end_reason="submit", answer="a", verdict="", cost_tokens=10.0,
        cost_flops=flops, steps=[step],
    )  # fmt: skip


def test_advantage_report_reads_groups_back(tmp_path: Path) -> None:
    episodes = [
        _episode(0, 0, True, 100.0, [1, 1, 0]),
        _episode(0, 1, True, 300.0, [0, 1, 0]),
        _episode(0, 2, False, 50.0, [0, 0, 0]),
        _episode(0, 3, False, 80.0, [0, 0, 0]),
        _episode(1, 0, False, 10.0, [0, 0]),
        _episode(1, 1, False, 20.0, [0, 0]),
    ]
    lines = advantage_report(save_trajectories(episodes, tmp_path / "t.jsonl"))
    # group 0: success normalised to ±1; the cheaper success gains, the dearer loses (mean cost 200)
    assert lines[0] == (
        "  group 0 (retention): 2/4 solved, task adv [1.0, 1.0, -1.0, -1.0], "
        "efficiency adv [0.5, -0.5, 0.0, 0.0], edit tokens 3"
    )
    # group 1: no success, no signal
    assert lines[1].startswith(
        "  group 1 (retention): 0/2 solved, task adv [0.0, 0.0], efficiency adv [0.0, 0.0]"
    )


@pytest.mark.slow
def test_ctxrl_quickstart_runs_every_stage(tmp_path: Path) -> None:
    """``ctxrl quickstart`` as a user runs it (the vLLM engine), as its own process: every stage leaves its
    artefact, the terminal gets one line per stage, and library noise goes to the log file."""
    out = tmp_path / "qs"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "ctxrl.cli", "quickstart", "--out", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    stages = [line[:5] for line in done.stdout.splitlines() if line.startswith("[")]
    assert stages == [f"[{i}/7]" for i in range(1, 8)]
    assert (out / "model" / "config.json").is_file()
    assert (
        len(load_trajectories(out / "sft" / "demos" / "trajectories.jsonl")) == 2
    )  # scripted demonstrations
    assert (out / "sft" / "model" / "config.json").is_file()
    metrics = [json.loads(line) for line in (out / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all("loss/loss" in m for m in metrics)
    assert (out / "export" / "SKILL.md").is_file() and (out / "export" / "config.json").is_file()
    summary = json.loads((out / "eval" / "eval.json").read_text())["summary"]
    assert set(summary) == {"file", "append", "file-manager"}
    assert summary["file-manager"]["overall"]["success"] == 1.0  # the baselines behave as in the table
    assert summary["append"]["overall"]["success"] == 0.0
    assert (out / "evolve" / "lineage.sqlite").is_file() and (
        out / "evolve" / "best_skill" / "SKILL.md"
    ).is_file()
    assert (out / "report.html").is_file()
    # the story stays readable: the engines' noise is in the log, not on the terminal
    assert "CPU backend" not in done.stdout + done.stderr and (out / "logs.txt").stat().st_size > 0
    assert done.stdout.splitlines()[-1].startswith("done in ") and str(out / "report.html") in done.stdout


def test_ensure_tiny_model_builds_once_and_keeps_a_model_that_is_there(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    folder = ensure_tiny_model(tmp_path / "m")
    assert _digest(folder) == _digest(tiny_model_dir)  # seed 0: the same bytes as the session's model
    (folder / "marker.txt").write_text("kept")
    before = (folder / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(folder) == folder
    assert (folder / "marker.txt").read_text() == "kept"  # nothing rebuilt
    assert (folder / "model.safetensors").stat().st_mtime_ns == before
    # a folder without a model (say, a half-written one) is rebuilt from scratch
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / "junk.bin").write_bytes(b"x")
    assert ensure_tiny_model(stale, seed=1) == stale
    assert (stale / "config.json").is_file() and not (stale / "junk.bin").exists()


def _digest(folder: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())}


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_story_prints_one_line_per_stage_and_a_bar_only_on_a_terminal() -> None:
    plain = io.StringIO()
    story = _Story(plain)
    story.begin("first")
    story.end("ok")
    story.close()
    assert plain.getvalue() == "[1/7] first\n      ok (0 s)\n"  # a log or a capture: the lines alone
    terminal = _Terminal()
    story = _Story(terminal)
    story.begin("first")
    story.end("ok")
    story.close()
    text = terminal.getvalue()
    assert "[1/7] first\n" in text and "      ok (0 s)\n" in text
    assert "1/7 stages |" in text  # the bar, redrawn below the lines after the stage ended
