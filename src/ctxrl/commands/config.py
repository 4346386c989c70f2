"""The run config: one typed schema, loaded by every subcommand with ``--config FILE`` plus ``key=value``.

    ctxrl rollout --config configs/rollout.yaml engine.name=hf rollout.group_size=8 --out runs/r1

The sections are the typed configs of the layers below, nested: ``engine`` and ``sampling``
(:mod:`ctxrl.train.engines`), ``harness`` (:class:`ctxrl.env.config.HarnessConfig`), ``tasks``,
``rollout`` (:class:`ctxrl.train.rollout.RolloutConfig`), ``train`` (:class:`ctxrl.train.config.TrainConfig`), ``evolve``
(:class:`ctxrl.evolve.config.EvolveConfig`), ``advantages``
(:class:`ctxrl.rewards.advantages.AdvantageConfig`) and ``eval``. Each class is the only home of its
defaults; a YAML file and the overrides only override fields, and an unknown or mistyped key is an error
that names it (:func:`ctxrl.config.load_config`). The resolved config is written into every run folder
(``config.yaml``), so a run can be repeated from its own folder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ctxrl.config import load_config
from ctxrl.env.config import HarnessConfig
from ctxrl.env.tasks.registry import KNOWN_FAMILIES, check_difficulty
from ctxrl.env.tasks.splits import SPLIT_RANGES, split_seeds
from ctxrl.errors import ConfigError, TaskError
from ctxrl.evolve.config import EvolveConfig
from ctxrl.rewards.advantages import AdvantageConfig
from ctxrl.train.config import TrainConfig
from ctxrl.train.engines.base import EngineConfig, SamplingConfig
from ctxrl.train.rollout import RolloutConfig
from ctxrl.train.sft import SFTConfig


def _check_names(kind: str, names: Sequence[str], valid: Sequence[str]) -> None:
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ConfigError(f"unknown {kind} {unknown[0]!r}; known: {', '.join(valid)}")


def _check_tasks(families: Sequence[str], split: str, difficulty: str) -> None:
    _check_names("family", families, list(KNOWN_FAMILIES))
    _check_names("split", [split], list(SPLIT_RANGES))
    try:
        check_difficulty(families, difficulty)
    except TaskError as exc:
        raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class TasksConfig:
    """Which built-in tasks a rollout or a training run draws."""

    families: tuple[str, ...] = ()
    """Task families (empty: all of them), taken round-robin so any prefix is balanced."""
    split: str = "train"
    """``train``, ``dev`` or ``test`` (disjoint by seed)."""
    difficulty: str = "default"
    """``easy``, ``default`` or ``hard``."""
    count: int = 4
    """Tasks per rollout (each runs ``rollout.group_size`` episodes)."""

    def __post_init__(self) -> None:
        _check_tasks(self.families, self.split, self.difficulty)
        if self.count < 1:
            raise ConfigError(f"count must be >= 1, got {self.count}")


@dataclass(frozen=True)
class EvalConfig:
    """What ``ctxrl eval`` runs: every family's first ``episodes`` seeds of ``split``, per policy or mode."""

    policies: tuple[str, ...] = ("all",)
    """With the ``scripted`` engine: the scripted reference policies (``all`` = every one), each in its
    own mode."""
    modes: tuple[str, ...] = ()
    """With a model engine: the modes the model runs in (empty: every mode)."""
    families: tuple[str, ...] = ()
    """Task families (empty: all)."""
    split: str = "test"
    difficulty: str = "default"
    episodes: int = 10
    """Episodes per family and policy (or mode): the split's first seeds (from ``offset`` on)."""
    offset: int = 0
    """Seeds of the split skipped before the evaluated ones: ``offset: 128`` with ``episodes: 128`` evaluates the
    split's seeds 128-255, a block that an evaluation of the first 128 never touched."""

    def __post_init__(self) -> None:
        _check_tasks(self.families, self.split, self.difficulty)
        if self.episodes < 1:
            raise ConfigError(f"episodes must be >= 1, got {self.episodes}")
        try:
            split_seeds(self.split, self.episodes, self.offset)
        except TaskError as exc:
            raise ConfigError(str(exc)) from None  # the loader names the section


@dataclass(frozen=True)
class RunConfig:
    """A whole run: the model, the engine, sampling, the harness, tasks, rollouts, advantages, eval."""

    model: str | None = None
    """Model folder (any Hugging Face causal-LM folder) or a registry name (`ctxrl model list`); None: the tiny
    model, built into the run folder."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    harness: HarnessConfig = field(default_factory=HarnessConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    advantages: AdvantageConfig = field(default_factory=AdvantageConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    evolve: EvolveConfig = field(default_factory=EvolveConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)


def load_run_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> RunConfig:
    """The run config from a YAML file (None: the defaults) and ``key=value`` overrides."""
    return load_config(RunConfig, path, overrides)


def to_dict(config: Any) -> Any:
    """A config as plain YAML-able data (tuples as lists, paths as strings)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: to_dict(getattr(config, f.name)) for f in dataclasses.fields(config) if f.init}
    if isinstance(config, tuple | list):
        return [to_dict(v) for v in config]
    if isinstance(config, Path):
        return str(config)
    return config


def dump_run_config(config: RunConfig) -> str:
    """The config as YAML that :func:`load_run_config` reads back to an equal config."""
    return yaml.safe_dump(to_dict(config), sort_keys=False)
