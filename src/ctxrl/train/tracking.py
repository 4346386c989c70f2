"""Experiment trackers behind one two-method protocol, so the training loop never branches on wandb.

    tracker = make_tracker("wandb", out, project="ctxrl", config=run_config_dict)   # or "none"
    tracker.log({"reward/success": 0.5, "loss/loss": 0.1}, step=3)
    tracker.finish()

``none`` is :class:`NoTracker` (every call does nothing; ``metrics.jsonl`` is written by the loop itself).
``wandb`` starts a run in ``<out>/wandb``, offline unless ``WANDB_MODE`` is already set: it needs no network
and no account, and ``wandb sync <out>/wandb/offline-run-*`` uploads it later.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from ctxrl.errors import ConfigError


class Tracker(Protocol):
    """Receives every step's metrics."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` (namespaced keys) at optimiser step ``step``."""
        ...

    def finish(self) -> None:
        """Flush and close the run."""
        ...


class NoTracker:
    """The tracker of ``tracker: none`` (and of every rank but the main one): does nothing."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def finish(self) -> None:
        pass


class WandbTracker:
    """A wandb run in ``<out>/wandb`` (offline unless ``WANDB_MODE`` is set)."""

    def __init__(self, out: Path, *, project: str, config: Mapping[str, Any] | None = None) -> None:
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        (out / "wandb").mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, dir=str(out), config=dict(config or {}), name=out.name)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def finish(self) -> None:
        self.run.finish()


def make_tracker(
    kind: str, out: Path, *, project: str = "ctxrl", config: Mapping[str, Any] | None = None
) -> Tracker:
    """The tracker named ``kind`` (``none`` or ``wandb``) writing under the run folder ``out``."""
    if kind == "none":
        return NoTracker()
    if kind == "wandb":
        return WandbTracker(out, project=project, config=config)
    raise ConfigError(f"unknown tracker {kind!r}; choose none or wandb")
