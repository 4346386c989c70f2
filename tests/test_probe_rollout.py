"""scripts/probe_rollout.py, which the throughput notes cite for the separate effects of engine.compile and
top-p, runs the inflight bench's rollouts with the settings it is given."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_probe_rollout_passes_its_settings_through(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "probe_rollout.py"), "--model", "tiny", "--engine", "hf",
         "--groups", "1,2", "--group-size", "2", "--steps", "2", "--new-tokens", "8", "--top-p", "0.5",
         "--temperature", "0.7"],
        capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["sampling"]["top_p"], report["sampling"]["temperature"]) == (0.5, 0.7)
    assert report["engine"]["name"] == "hf" and report["sampling"]["max_new_tokens"] == 8
    figures = report["figures"]
    for n in (2, 4):  # one rollout per number of groups, each at most 2 steps of 8 tokens
        assert 0 < figures[f"inflight_{n}_decode_passes"] <= 16
        assert figures[f"inflight_{n}_generated_tokens"] <= n * 16
        assert figures[f"inflight_{n}_rollout_flops_efficiency"] > 0


def test_probe_rollout_refuses_compile_on_an_engine_that_does_not_compile(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "probe_rollout.py"), "--model", "tiny", "--engine", "hf",
         "--compile"],
        capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode != 0 and "engine.compile: the hf engine does not compile" in done.stderr
