"""Every ``ctxrl bench`` subcommand, run with ``--quick``: the JSON it writes has exactly the documented keys,
and every figure is a finite positive number.

``harness`` and ``env`` run in this process; ``rollout`` starts a vLLM engine, so it runs as a command of
its own (an engine start wants a ``__main__`` guard and a process of its own; ~1-2 minutes here).

Run: .venv/bin/python -m pytest tests/test_bench.py -q
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ctxrl.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _figures(path: Path) -> dict[str, float]:
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    for key, value in data.items():
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (key, value)
    return data


def test_bench_harness_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "harness.json"
    assert main(["bench", "harness", "--quick", "--json", str(out)]) == 0
    figures = _figures(out)
    assert set(figures) == {
        *(f"step_overhead_ms_{size}" for size in ("4k", "8k", "32k")),
        *(f"step_overhead_ms_noedit_{size}" for size in ("4k", "8k", "32k")),
        "sandbox_overhead_ms",
    }
    # Sane bounds, not the targets (5 ms per step at 32k, 30 ms per command): this machine is shared and
    # loaded. A step that re-tokenised the whole 32k context would take ~100 ms; a sandbox start that
    # waited on a timeout would take seconds.
    assert figures["step_overhead_ms_32k"] < 50
    assert figures["sandbox_overhead_ms"] < 500
    assert "sandbox_overhead_ms" in capsys.readouterr().out  # the table is printed too


def test_bench_env_quick(tmp_path: Path) -> None:
    from ctxrl.env.policies import POLICY_MODES
    from ctxrl.env.tasks.registry import FAMILIES

    out = tmp_path / "env.json"
    assert main(["bench", "env", "--quick", "--json", str(out)]) == 0
    figures = _figures(out)
    assert set(figures) == {"episodes_per_s", "steps_per_s", "episodes", "seconds"}
    # one episode per policy and family
    assert figures["episodes"] == len(POLICY_MODES) * len(FAMILIES)
    assert figures["episodes_per_s"] == pytest.approx(figures["episodes"] / figures["seconds"])
    assert figures["steps_per_s"] > figures["episodes_per_s"]  # every episode takes several steps


def test_bench_rollout_quick_runs_both_engines(tmp_path: Path) -> None:
    out = tmp_path / "rollout.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "ctxrl.cli", "bench", "rollout", "--quick", "--json", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    figures = _figures(out)
    assert set(figures) == {"vllm_tokens_per_s", "hf_tokens_per_s", "vllm_vs_hf_ratio", "env_steps_per_s"}
    assert figures["vllm_vs_hf_ratio"] == pytest.approx(
        figures["vllm_tokens_per_s"] / figures["hf_tokens_per_s"]
    )


def test_bench_train_quick(tmp_path: Path) -> None:
    out = tmp_path / "train.json"
    assert main(["bench", "train", "--quick", "--json", str(out)]) == 0
    figures = _figures(out)
    assert set(figures) == {
        "packed_vs_naive_tokens",
        "packed_tokens_per_episode",
        "naive_tokens_per_episode",
        "ctxrl_vs_naive_step_time",
        "packed_step_s",
        "naive_step_s",
        "ctxrl_vs_trl_step_time",
        "ctxrl_padded_vs_trl_step_time",
        "ctxrl_step_s",
        "ctxrl_padded_step_s",
        "trl_step_s",
    }
    # --quick episodes: a 64-id prompt, 4 steps of 8 generated + 16 observed ids, an edit at step 1 that halves
    # the editable region. Rows: steps 0-1 (prompt 88 + 8) and steps 2-3 (prompt 112 + 8) = 216 ids;
    # one row per step: 72 + 96 + 96 + 120 = 384.
    assert figures["packed_tokens_per_episode"] == 216
    assert figures["naive_tokens_per_episode"] == 384
    assert figures["packed_vs_naive_tokens"] == pytest.approx(216 / 384)
    assert figures["ctxrl_vs_naive_step_time"] == pytest.approx(
        figures["packed_step_s"] / figures["naive_step_s"]
    )
    assert figures["ctxrl_vs_trl_step_time"] == pytest.approx(figures["ctxrl_step_s"] / figures["trl_step_s"])
    assert figures["ctxrl_padded_vs_trl_step_time"] == pytest.approx(
        figures["ctxrl_padded_step_s"] / figures["trl_step_s"]
    )
