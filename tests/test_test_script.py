"""``scripts/test.sh`` reports pytest's exit code, and treats "no tests collected" (exit 5) as a failure.

The script runs in a stand-in environment (``CTXRL_VENV``): a venv whose stamp matches, so setup does nothing,
whose ruff and mypy succeed, and whose python exits with the code under test. The real checks are not run.

Run: .venv/bin/python -m pytest tests/test_test_script.py -q
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _fake_venv(venv: Path, python_exit: int) -> None:
    (venv / "bin").mkdir(parents=True)
    for tool, body in (("ruff", "exit 0"), ("mypy", "exit 0"), ("python", f"exit {python_exit}")):
        path = venv / "bin" / tool
        path.write_text(f"#!/usr/bin/env bash\n{body}\n")
        path.chmod(0o755)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + (ROOT / "scripts/setup.sh").read_bytes())
    (venv / ".ctxrl-setup-stamp").write_text(f"{digest.hexdigest()[:16]}-cpu,dev\n")


@pytest.mark.parametrize(("pytest_exit", "script_exit"), [(0, 0), (1, 1), (5, 5)])
def test_exit_codes(pytest_exit: int, script_exit: int, tmp_path: Path) -> None:
    _fake_venv(tmp_path / "venv", pytest_exit)
    env = {**os.environ, "CTXRL_VENV": str(tmp_path / "venv")}
    done = subprocess.run(
        ["bash", "scripts/test.sh"], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    assert "environment" in done.stdout and "is up to date" in done.stdout  # setup really did nothing
    assert done.returncode == script_exit, done.stdout + done.stderr
    if pytest_exit == 5:
        assert "FAIL: pytest collected no tests (exit 5)" in done.stderr
