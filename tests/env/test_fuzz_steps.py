"""Whole-step fuzzing (:mod:`ctxrl.env.fuzz`): a fixed-seed slice of every mode × family through
``TaskEpisode.step`` on the real sandbox, the fuzzer's own checks shown to catch what they claim to, and the
two crashes it found (a command past the argument-size limit; a lone surrogate in a text action).

The long run is ``ctxrl bench fuzz --seconds N``."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from ctxrl.env import fuzz as fz
from ctxrl.env.episode import PromptBuilder, TaskEpisode
from ctxrl.env.modes import MODES
from ctxrl.env.sandbox import MAX_COMMAND_BYTES, Sandbox, SandboxConfig
from ctxrl.env.tasks.registry import FAMILIES


def test_every_mode_and_family_survives_hostile_steps(tiny_tokenizer: Any, tmp_path: Path) -> None:
    report = fz.fuzz(tiny_tokenizer, episodes=len(MODES) * len(FAMILIES), seed=7, workdir=tmp_path)
    assert report.episodes == 25 and report.steps >= 50
    assert (report.crashes, report.stalls, report.invariant_breaks) == (0, 0, 0), report.examples


def test_the_grammar_reaches_every_hostile_form() -> None:
    texts = [fz.hostile_text(random.Random(i), ["shell", "submit"]) for i in range(400)]
    joined = "".join(texts)
    assert all(len(t) <= fz.MAX_TURN_CHARS for t in texts)
    assert "[[[[[[" in joined or '{"k": {"k": ' in joined  # deep nesting
    assert "sleep 60" in joined and "/dev/zero" in joined and "seq 400" in joined  # sleep, disk, fork
    assert "<|im_start|>system" in joined and "\ud800" in joined and "\u0000" in joined
    assert any(t.count("<tool_call>") >= 20 for t in texts)  # many calls in one turn
    assert any(
        t.rstrip().endswith(("}", '"')) and "</tool_call>" not in t[-12:] for t in texts
    )  # half-closed


def test_the_checks_catch_a_crash_and_a_broken_invariant(
    tiny_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative controls: a step that raises is a crash; a step that rewrites the task message breaks the
    pinned-prefix invariant; a slow step is a stall."""
    real_step = TaskEpisode.step

    def raising(self: TaskEpisode, generated: Any, *, stopped: bool = True) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(TaskEpisode, "step", raising)
    report = fz.fuzz(tiny_tokenizer, episodes=1, modes=("file",), families=("retention",), workdir=tmp_path)
    assert report.crashes == 1 and "boom" in report.examples[0]["what"]

    def tampering(self: TaskEpisode, generated: Any, *, stopped: bool = True) -> Any:
        out = real_step(self, generated, stopped=stopped)
        self.live.context._task += " and obey the log"  # a bug that rewrites the task message, simulated
        return out

    monkeypatch.setattr(TaskEpisode, "step", tampering)
    report = fz.fuzz(tiny_tokenizer, episodes=1, modes=("append",), families=("retention",), workdir=tmp_path)
    assert report.invariant_breaks >= 1 and report.examples[0]["what"] == "the pinned prefix changed"

    monkeypatch.setattr(fz, "STALL_S", 0.0)
    monkeypatch.setattr(TaskEpisode, "step", real_step)
    report = fz.fuzz(tiny_tokenizer, episodes=1, modes=("append",), families=("retention",), workdir=tmp_path)
    assert report.stalls == report.steps >= 1


def test_a_command_longer_than_one_argument_is_refused_not_raised(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, SandboxConfig(timeout_s=10))
    result = box.run("echo " + "x" * MAX_COMMAND_BYTES)
    assert result.exit_code == 126 and "byte limit of one program argument" in result.output
    assert box.run("echo " + "x" * (MAX_COMMAND_BYTES - 5)).exit_code == 0  # just under the limit runs


def test_a_text_action_with_a_lone_surrogate_encodes(tiny_tokenizer: Any) -> None:
    builder = PromptBuilder(tiny_tokenizer)
    ids = builder.action_ids("a\ud800b")
    assert builder.decode(ids[:-1]) == "a\ufffdb"


def test_a_task_that_fails_to_generate_is_a_recorded_crash(
    tiny_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fuzz run of hours must not die on one episode's set-up (it once did, on a repo seed's generator):
    the failure is counted and kept as an example, with its seed and episode, and the run goes on."""

    def broken(family: str, seed: int, difficulty: str) -> Any:
        raise AssertionError(f"cannot generate {family} {seed}")

    monkeypatch.setattr(fz, "make_task", broken)
    report = fz.fuzz(tiny_tokenizer, episodes=2, modes=("file",), families=("repo",), workdir=tmp_path)
    assert (report.episodes, report.crashes, report.steps) == (2, 2, 0)
    assert report.examples[0]["episode"] == 0 and "cannot generate repo" in report.examples[0]["what"]
