"""``scripts/test.sh`` reports pytest's exit code, and treats "no tests collected" (exit 5) as a failure;
``scripts/setup.sh`` does nothing on an environment whose stamp matches.

The script runs in a stand-in environment (``CTXRL_VENV``): a venv whose stamp matches, so setup does nothing,
whose ruff, mypy and lint-imports succeed, and whose python exits with the code under test. The real checks are not run.

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
    tools = (
        ("ruff", "exit 0"),
        ("mypy", "exit 0"),
        ("lint-imports", "exit 0"),
        ("python", f"exit {python_exit}"),
    )
    for tool, body in tools:
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


def test_setup_does_nothing_when_the_stamp_matches(tmp_path: Path) -> None:
    """``scripts/setup.sh`` is idempotent: run again on an environment whose stamp matches pyproject.toml and
    the script, it exits 0 at once, without calling the environment's python (no venv, no pip install)."""
    venv = tmp_path / "venv"
    _fake_venv(venv, 0)
    calls = tmp_path / "calls.log"
    (venv / "bin" / "python").write_text(f'#!/usr/bin/env bash\necho "$@" >> {calls}\nexit 0\n')
    stamp = (venv / ".ctxrl-setup-stamp").read_text()
    env = {**os.environ, "CTXRL_VENV": str(venv)}
    for _ in range(2):
        done = subprocess.run(
            ["bash", "scripts/setup.sh"], cwd=ROOT, env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"[setup] environment {venv} is up to date" in done.stdout
    assert not calls.exists()  # nothing was installed or even asked of the interpreter
    assert (venv / ".ctxrl-setup-stamp").read_text() == stamp
    assert sorted(p.name for p in (venv / "bin").iterdir()) == ["lint-imports", "mypy", "python", "ruff"]


def test_setup_stamp_covers_the_extras(tmp_path: Path) -> None:
    """A stamp written for other extras does not match: setup goes on to install. The stand-in interpreter
    records the call and fails, so nothing is installed."""
    venv = tmp_path / "venv"
    _fake_venv(venv, 0)
    calls = tmp_path / "calls.log"
    # an interpreter that records its calls and fails, so a (wrong) install attempt stops at once
    (venv / "bin" / "python").write_text(f'#!/usr/bin/env bash\necho "$@" >> {calls}\nexit 3\n')
    env = {**os.environ, "CTXRL_VENV": str(venv), "CTXRL_EXTRAS": "cpu"}
    done = subprocess.run(
        ["bash", "scripts/setup.sh"], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    assert "is up to date" not in done.stdout
    assert done.returncode != 0 and calls.read_text().startswith("-m pip install")
