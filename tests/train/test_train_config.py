"""TrainConfig: defaults from the reference run, loading through load_config, and the checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxrl.config import load_config
from ctxrl.errors import ConfigError
from ctxrl.train.config import TrainConfig


def test_defaults_follow_the_reference_run() -> None:
    cfg = TrainConfig()
    assert (cfg.epsilon_low, cfg.epsilon_high, cfg.w_eff, cfg.lr) == (0.2, 0.28, 0.25, 1e-6)
    assert cfg.loss_config().epsilon_high == 0.28
    assert cfg.credit_config().advantages.w_eff == 0.25


def test_loads_from_yaml_with_overrides(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        "model: models/tiny\nsteps: 3\nrollout:\n  group_size: 4\n  max_steps: 2\n"
        "penalties:\n  no_tool_call: 0.3\n  format_failure: 0.2\nlora:\n  enabled: true\n  r: 8\n"
    )
    cfg = load_config(TrainConfig, path, ["kl_coef=0.01", "lora.target_modules=[q_proj, v_proj]"])
    assert (cfg.model, cfg.steps, cfg.rollout.group_size, cfg.rollout.max_steps) == ("models/tiny", 3, 4, 2)
    assert (cfg.penalties.no_tool_call, cfg.penalties.format_failure) == (0.3, 0.2)
    assert cfg.lora.enabled and cfg.lora.r == 8 and cfg.lora.target_modules == ("q_proj", "v_proj")
    assert cfg.loss_config().kl_coef == 0.01
    assert cfg.credit_config().penalties.no_tool_call == 0.3


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("epsilon_low=1.5", "epsilon_low"),
        ("tis_cap=0", "tis_cap"),
        ("rollout.group_size=1", "group_size"),
        ("lora.r=0", "lora.r"),
        ("penalties.no_tool_call=-1", "no_tool_call"),
        ("w_eff=-0.1", "w_eff"),
        ("updates_per_rollout=1000", "updates_per_rollout"),
        ("drop_zero_variance=always", "drop_zero_variance"),
        ("learning_rate=1e-5", "unknown config key .learning_rate"),
        ("kl_coeff=0.1", "did you mean .kl_coef"),
    ],
)
def test_bad_values_name_the_field(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(TrainConfig, None, [override])
