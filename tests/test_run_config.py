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
    p for p in (Path(__file__).parents[1] / "configs").rglob("*.yaml") if "accelerate" not in p.parts
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
        Path(__file__).parents[1] / "configs" / "rollout.yaml",
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
