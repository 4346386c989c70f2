"""TrainConfig: the ``train`` section of the run config; defaults from the reference run, and the checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxrl.commands.config import load_run_config
from ctxrl.errors import ConfigError
from ctxrl.rewards.advantages import AdvantageConfig
from ctxrl.train.config import TrainConfig
from ctxrl.train.grpo import check_setup
from ctxrl.train.rollout import RolloutConfig


def test_defaults_follow_the_reference_run() -> None:
    cfg = TrainConfig()
    assert (cfg.loss.epsilon_low, cfg.loss.epsilon_high, cfg.lr, cfg.tracker) == (0.2, 0.28, 1e-6, "none")
    assert cfg.loss.tis_cap == 2.0
    credit = cfg.credit_config(AdvantageConfig(w_eff=0.5))
    assert credit.advantages.w_eff == 0.5 and credit.reward.penalties.no_tool_call == 0.0


def test_the_train_section_loads_from_yaml_with_overrides(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        "rollout:\n  group_size: 4\ntrain:\n  steps: 3\n  reward:\n    penalties:\n      no_tool_call: 0.3\n"
        "      format_failure: 0.2\n  lora:\n    enabled: true\n    r: 8\n"
    )
    run = load_run_config(path, ["train.loss.kl_coef=0.01", "train.lora.target_modules=[q_proj, v_proj]"])
    cfg = run.train
    assert (cfg.steps, run.rollout.group_size) == (3, 4)
    assert (cfg.reward.penalties.no_tool_call, cfg.reward.penalties.format_failure) == (0.3, 0.2)
    assert cfg.lora.enabled and cfg.lora.r == 8 and cfg.lora.target_modules == ("q_proj", "v_proj")
    assert cfg.loss.kl_coef == 0.01


def test_the_learning_rate_schedule_warms_up_decays_and_holds_its_last_rate() -> None:
    assert {TrainConfig(steps=3, lr=2.0).lr_at(k) for k in range(5)} == {2.0}  # constant
    linear = TrainConfig(steps=20, lr=1.0, lr_schedule="linear", warmup_steps=2, lr_schedule_steps=6)
    rates = [linear.lr_at(k) for k in range(10)]
    assert rates[:2] == [0.5, 1.0]  # warm-up: round k of W runs at lr * (k + 1) / W
    assert rates[2:6] == pytest.approx([1.0, 0.75, 0.5, 0.25])  # 4 decay rounds, never a round at zero
    assert rates[6:] == pytest.approx([0.25] * 4)  # past the horizon: its last rate
    cosine = TrainConfig(steps=4, lr=1.0, lr_schedule="cosine")  # horizon: the run's steps
    assert [cosine.lr_at(k) for k in range(4)] == pytest.approx([1.0, 0.853553, 0.5, 0.146447], abs=1e-6)
    # the rate of a round depends on its index only, so a run stopped at 2 and resumed to 4 repeats it
    assert TrainConfig(steps=2, lr=1.0, lr_schedule="cosine", lr_schedule_steps=4).lr_at(1) == cosine.lr_at(1)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.loss.epsilon_low=1.5", "epsilon_low"),
        ("train.loss.tis_cap=0", "tis_cap"),
        ("train.tis_cap=2", "unknown config key 'train.tis_cap'; it is 'train.loss.tis_cap'"),
        ("train.graded=true", "it is 'train.reward.graded'"),
        ("train.lora.r=0", "lora.r"),
        ("train.reward.penalties.no_tool_call=-1", "no_tool_call"),
        ("train.tracker=tensorboard", "train.tracker must be one of 'none', 'wandb'"),
        ("train.learning_rate=1e-5", "unknown config key 'train.learning_rate'"),
        ("train.kl_coeff=0.1", "did you mean 'loss.kl_coef'"),
        ("train.w_eff=0.1", "unknown config key 'train.w_eff'"),  # it lives in advantages
        ("train.lr_schedule=step", "train.lr_schedule must be one of 'constant', 'linear', 'cosine'"),
        ("train.warmup_steps=-1", "warmup_steps must be >= 0"),
        ("train.lr_schedule_steps=0", r"lr_schedule_steps \(0\) must be larger than warmup_steps"),
    ],
)
def test_bad_values_name_the_field(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_run_config(None, [override])


def test_checks_across_sections_say_how_to_fix() -> None:
    with pytest.raises(ConfigError, match=r"GRPO needs >= 2 episodes per task.*set rollout\.group_size=4"):
        check_setup(TrainConfig(), RolloutConfig(group_size=1), tasks_per_step=8)
    # 3 tasks x G=2 = 6 episodes: 6 updates fit, 7 do not
    check_setup(TrainConfig(updates_per_rollout=6), RolloutConfig(group_size=2), tasks_per_step=3)
    with pytest.raises(ConfigError, match="updates_per_rollout=7 exceeds the 6 episodes"):
        check_setup(TrainConfig(updates_per_rollout=7), RolloutConfig(group_size=2), tasks_per_step=3)
