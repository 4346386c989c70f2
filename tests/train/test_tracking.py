"""Trackers: ``none`` does nothing, ``wandb`` writes an offline run into the run folder with no network."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxrl.errors import ConfigError
from ctxrl.train.tracking import NoTracker, make_tracker


def test_none_is_a_no_op_and_an_unknown_kind_is_an_error(tmp_path: Path) -> None:
    tracker = make_tracker("none", tmp_path)
    assert isinstance(tracker, NoTracker)
    tracker.log({"loss/loss": 1.0}, step=1)
    tracker.finish()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match="unknown tracker 'tensorboard'"):
        make_tracker("tensorboard", tmp_path)


def test_wandb_writes_an_offline_run_in_the_run_folder(tmp_path: Path) -> None:
    tracker = make_tracker("wandb", tmp_path, config={"train": {"lr": 1e-3}})
    tracker.log({"reward/mean": -0.3}, step=1)
    tracker.finish()
    [run] = (tmp_path / "wandb").glob("offline-run-*")
    assert list(run.glob("run-*.wandb")), "no offline run file"
