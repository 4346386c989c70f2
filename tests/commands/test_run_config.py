"""The run config: every file in configs/ loads, the resolved config round-trips through YAML, sections are
the layers' own typed configs, and a mistake names the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxrl.commands.config import RunConfig, dump_run_config, load_run_config
from ctxrl.env.config import HarnessConfig
from ctxrl.errors import ConfigError
from ctxrl.rewards.advantages import AdvantageConfig
from ctxrl.train.engines import EngineConfig, SamplingConfig
from ctxrl.train.rollout import RolloutConfig

CONFIGS = sorted(
    p for p in (Path(__file__).parents[2] / "configs").rglob("*.yaml") if "accelerate" not in p.parts
)


def test_there_are_configs() -> None:
    assert len(CONFIGS) >= 3


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_config_file_loads_and_round_trips(path: Path, tmp_path: Path) -> None:
    config = load_run_config(path)
    assert isinstance(config, RunConfig)
    assert path.read_text().startswith("# ctxrl "), "each config's header says the command it is for"
    again = tmp_path / "again.yaml"
    again.write_text(dump_run_config(config))
    assert load_run_config(again) == config


def test_sections_are_the_layers_typed_configs_and_defaults_live_there() -> None:
    config = load_run_config(None)
    assert config.engine == EngineConfig() and config.sampling == SamplingConfig()
    assert config.harness == HarnessConfig() and config.rollout == RolloutConfig()
    assert config.advantages == AdvantageConfig() and config.advantages.w_eff == 0.25


def test_overrides_reach_every_section() -> None:
    config = load_run_config(
        Path(__file__).parents[2] / "configs" / "rollout.yaml",
        ["advantages.w_eff=0.5", "harness.modes.tools.max_pins=3", "rollout.mode=usage", "engine.name=hf"],
    )
    assert config.advantages.w_eff == 0.5 and config.harness.modes.tools.max_pins == 3
    assert (config.rollout.mode, config.engine.name, config.rollout.group_size) == ("usage", "hf", 4)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("advantages.w_eff=-1", "w_eff must be >= 0"),
        ("rollout.mode=notes", "unknown mode 'notes'"),
        ("sampling.top_p=0", "top_p must be in (0, 1]"),
        ("engine.nme=hf", "unknown config key 'engine.nme'; did you mean 'name'?"),
        ("tasks.split=holdout", "unknown split 'holdout'"),
        ("harness.budget=big", "harness.budget must be int"),
    ],
)
def test_a_mistake_names_the_key(override: str, message: str) -> None:
    with pytest.raises(
        ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        load_run_config(None, [override])


def test_exponent_floats_without_a_dot_are_numbers() -> None:
    """PyYAML reads ``5e-4`` as text (YAML 1.1); a float field takes it as the number it spells."""
    config = load_run_config(None, ["train.lr=5e-4", "advantages.w_eff=1e-1"])
    assert (config.train.lr, config.advantages.w_eff) == (5e-4, 0.1)
    with pytest.raises(ConfigError, match=r"train\.lr must be float"):
        load_run_config(None, ["train.lr=fast"])


@pytest.mark.parametrize("command", ["rollout", "sft", "train"])
def test_shortcut_flags_set_their_keys_and_win_over_overrides(command: str) -> None:
    from ctxrl.cli import build_parser
    from ctxrl.commands.common import run_config

    args = build_parser().parse_args(
        [command, "--engine", "hf", "--mode", "tools", "--model", "some/folder", "rollout.mode=usage"]
    )
    config = run_config(args)
    assert (config.engine.name, config.rollout.mode, config.model) == ("hf", "tools", "some/folder")
    plain = run_config(build_parser().parse_args([command, "rollout.mode=usage"]))
    assert (plain.engine.name, plain.rollout.mode) == ("vllm", "usage")


def test_a_bad_shortcut_value_is_a_config_error() -> None:
    from ctxrl.cli import build_parser
    from ctxrl.commands.common import run_config

    with pytest.raises(ConfigError, match="mode"):
        run_config(build_parser().parse_args(["rollout", "--mode", "files"]))


# Fields that share a name across sections but are different settings, each with why.
SAME_NAME_OTHER_SETTING = {
    "lr": "GRPO's and SFT's learning rates are different knobs (1e-6 on-policy, 2e-5 supervised)",
    "log_every": "train prints every step, SFT every 10 optimiser steps",
    "split": "tasks trains on `train`, eval measures on `test`",
    "enabled": "the tools mode is on, the pressure pass off: two features",
    "gate": "the harness's edit gate vs the evolve gate (different types)",
    "max_steps": "harness: task steps; rollout: None keeps the harness's; SFT: optimiser steps (0: epochs)",
    "modes": "eval's list of modes vs the harness's per-mode settings",
    "alpha": "the evolve gate's significance level vs the LoRA scaling",
    "dtype": "the trainer's weights vs the engine's (None: fp32 on a CPU, the checkpoint's own on CUDA for vllm)",
}


def config_classes() -> set[type]:
    """Every dataclass named ``*Config`` in ctxrl, and every dataclass reachable through their fields."""
    import dataclasses
    import importlib
    import pkgutil
    import typing

    import ctxrl

    found: set[type] = set()
    for info in pkgutil.walk_packages(ctxrl.__path__, "ctxrl."):
        module = importlib.import_module(info.name)
        found |= {
            obj
            for name, obj in vars(module).items()
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and name.endswith("Config")
        }
    todo = list(found)
    while todo:
        for hint in typing.get_type_hints(todo.pop()).values():
            if isinstance(hint, type) and dataclasses.is_dataclass(hint) and hint not in found:
                found.add(hint)
                todo.append(hint)
    return found


def test_each_setting_has_one_default() -> None:
    """A setting declared in two config classes with two defaults is two settings that drift (the trainer's
    TIS cap was 2.0 and the loss's None): nest one class in the other instead."""
    import dataclasses

    defaults: dict[str, dict[str, object]] = {}
    for cls in config_classes():
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                value = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                continue
            defaults.setdefault(f.name, {})[cls.__qualname__] = value
    assert {"RunConfig", "TrainConfig", "LossConfig", "RewardConfig", "HarnessConfig", "EvolveConfig"} <= {
        c.__qualname__ for c in config_classes()
    }
    drift = {
        name: where
        for name, where in defaults.items()
        if name not in SAME_NAME_OTHER_SETTING and len({repr(v) for v in where.values()}) > 1
    }
    assert not drift, f"settings with two defaults: {drift}"
