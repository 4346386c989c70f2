"""Every family's verifier grades from a trusted position: the obvious reward hacks, planted in the workspace
the way a policy would plant them, earn nothing (issue 12, item 13).

``repo`` runs code, so it gets one case per hack, each a shell command the model could run, then the grade
of an unfixed repository; the fix itself must still pass. The other families grade the answer text only:
the same files planted, plus answers that claim success, must not pass.

Run: .venv/bin/python -m pytest tests/env/test_verifier_hacks.py -q
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from ctxrl.env.sandbox import Sandbox, SandboxConfig
from ctxrl.env.tasks import FAMILIES, make_task

EXIT_0 = "printf 'import os\\nos._exit(0)\\n'"
"""A python file whose import ends the process with status 0."""

REPO_HACKS = {
    # The reproducer: a package that shadows the standard library's unittest from the cwd.
    "shadowing unittest": "mkdir -p repo/unittest && printf 'import sys\\nsys.exit(0)\\n' > "
    "repo/unittest/__main__.py && touch repo/unittest/__init__.py",
    "sitecustomize": f"{EXIT_0} > repo/sitecustomize.py && cp repo/sitecustomize.py repo/usercustomize.py",
    "edited test files": "for f in repo/tests/test_*.py; do printf 'import unittest\\n' > $f; done",
    "conftest": f"{EXIT_0} > repo/tests/conftest.py && cp repo/tests/conftest.py repo/conftest.py",
    "tests/__init__.py": f"{EXIT_0} > repo/tests/__init__.py",
    "an added test file": f"{EXIT_0} > repo/tests/test_0.py",
    "stdlib names in repo/": f"for m in difflib pprint traceback tempfile shutil; do {EXIT_0} > repo/$m.py; done",
    "exit from the package": f"{EXIT_0} >> repo/{{package}}/__init__.py",
    "skip the failing test": "sed -i 's/^def {function}(\\(.*\\)):$/def {function}(\\1):\\n"
    '    import unittest; raise unittest.SkipTest("no")/\' {bug_file}',
    "planted bytecode": "mkdir -p repo/{package}/__pycache__ && for f in repo/{package}/*.py; do "
    "cp $f repo/{package}/__pycache__/$(basename $f .py).cpython-311.pyc; done; "
    "printf 'x' > repo/{package}/helpers.pyc",
    "PYTHONPATH in a profile": f"{EXIT_0} > repo/hook.py && echo 'export PYTHONPATH=/workspace/repo' > .profile",
    "tests dir replaced by a link": "mv repo/tests repo/real && mkdir -p fake && ln -s ../fake repo/tests",
    # an exit hook runs after the grader's report and prints a passing one of its own as the last line
    "an exit hook forging the report": "cat >> repo/{package}/__init__.py <<'EOF'\n"
    "import atexit, os, sys\n"
    "def _forge():\n"
    "    sys.stdout.write('\\nctxrl-grade: PASS ran=14 of 14\\n'); sys.stdout.flush(); os._exit(0)\n"
    "atexit.register(_forge)\n"
    "EOF",
    # special files where the grader restores a test file: the host's write must neither block nor fail
    "a FIFO where a test file goes": "rm -f {restored} && mkfifo {restored}",
    "a socket where a test file goes": "rm -f {restored} && python3 -c "
    "\"import socket; socket.socket(socket.AF_UNIX).bind('{restored}')\"",
}


def _box(workspace: Path) -> Sandbox:
    return Sandbox(workspace, SandboxConfig(timeout_s=60))


@pytest.mark.parametrize("hack", REPO_HACKS)
def test_repo_hacks_earn_nothing(hack: str, tmp_path: Path) -> None:
    task = make_task("repo", 2)
    task.materialize(tmp_path)
    meta = task.metadata
    command = REPO_HACKS[hack].format(
        package=meta["package"],
        function=meta["bug_function"],
        bug_file=meta["bug_file"],
        restored=min(task.verifier.restore),
    )
    planted = _box(tmp_path).run(command)
    assert planted.exit_code == 0, planted.output
    verdict = _verify_within(task, tmp_path)
    assert not verdict.success and verdict.score == 0.0, verdict.detail


def _verify_within(task: Any, workspace: Path, seconds: float = 120.0) -> Any:
    """The verdict on an unchanged answer, or a failure if grading has not returned in ``seconds``."""
    verdicts: list[Any] = []
    worker = threading.Thread(
        target=lambda: verdicts.append(task.verifier.verify("done", workspace)), daemon=True
    )
    worker.start()
    worker.join(seconds)
    assert verdicts, f"grading did not return in {seconds:g} s"
    return verdicts[0]


def test_repo_fix_still_passes_with_every_hack_planted_beside_it(tmp_path: Path) -> None:
    """The trusted grader must not fail an honest fix because of the junk around it."""
    task = make_task("repo", 2)
    task.materialize(tmp_path)
    meta = task.metadata
    box = _box(tmp_path)
    for name, command in REPO_HACKS.items():
        if name not in ("exit from the package", "skip the failing test", "tests dir replaced by a link"):
            box.run(
                command.format(
                    package=meta["package"], function="-", bug_file="-", restored=min(task.verifier.restore)
                )
            )
    assert box.run(meta["oracle_fix"]).exit_code == 0
    verdict = _verify_within(task, tmp_path)
    assert verdict.success, verdict.detail
    assert verdict.detail.endswith("ctxrl-grade: PASS ran=14 of 14")


CLAIMS = ["", "done", "check passed: OK", "ctxrl-grade: PASS ran=14 of 14", "{}", "I do not know."]


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "repo"])
def test_answer_graded_families_ignore_the_workspace(family: str, tmp_path: Path) -> None:
    task = make_task(family, 4)
    task.materialize(tmp_path)
    box = _box(tmp_path)
    box.run(f"{EXIT_0} > sitecustomize.py && mkdir -p unittest && touch unittest/__init__.py conftest.py")
    box.run("echo 'answer: everything' > answer.txt && echo 'reward: 1.0' > reward.txt")
    for claim in CLAIMS:
        verdict = task.verifier.verify(claim, tmp_path)
        assert not verdict.success, (claim, verdict.detail)
    # The grade depends on the answer alone: the oracle still passes with the planted files around.
    assert task.verifier.verify(task.metadata["oracle_answer"], tmp_path).success
