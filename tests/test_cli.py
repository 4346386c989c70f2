"""The CLI's contract: instant --help without heavy imports, one-line usage errors with exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "transformers", "vllm", "trl", "datasets", "peft", "accelerate")


def _ctxrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ctxrl.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_help_imports_no_heavy_module() -> None:
    code = (
        "import sys\n"
        "from ctxrl.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        f"print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "tiny-model" in res.stdout
    assert res.stdout.strip().splitlines()[-1] == "HEAVY="  # no heavy module was imported


def test_bad_flag_exits_2_with_one_usage_line() -> None:
    res = _ctxrl("tiny-model", "--out", "unused", "--bogus")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "unrecognized arguments: --bogus" in lines[0]
    assert "--help" in lines[0]
    assert "Traceback" not in res.stderr


def test_unknown_subcommand_exits_2() -> None:
    res = _ctxrl("no-such-command")
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1
    assert "invalid choice" in res.stderr


def test_tiny_model_refuses_non_empty_out(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("user data")
    res = _ctxrl("tiny-model", "--out", str(tmp_path))
    assert res.returncode == 1
    assert "not empty" in res.stderr and "--force" in res.stderr
    assert "Traceback" not in res.stderr
    assert (tmp_path / "keep.txt").read_text() == "user data"  # nothing lost
