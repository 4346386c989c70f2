"""Credit: shaped rewards, group advantages split back per step, zero-variance drop — by hand."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from ctxrl.errors import ConfigError
from ctxrl.rewards.advantages import AdvantageConfig
from ctxrl.train.credit import CreditConfig, Penalties, RewardConfig, assign_credit, shaped_reward

REFERENCE = Penalties(no_tool_call=0.3, format_failure=0.2)


def test_per_step_advantages_of_a_group(records: SimpleNamespace) -> None:
    # group: successes cost 100 and 300 (mean 200 -> efficiency +0.5, -0.5), two failures
    def ep(index: int, success: bool, cost: float, edits: list[list[int]]) -> Any:
        steps = [records.step([1, 2, k], [7] * len(m), edit=m) for k, m in enumerate(edits)]
        return records.episode(steps, index=index, success=success, cost=cost)

    eps = [
        ep(0, True, 100, [[0, 1], [1]]),
        ep(1, True, 300, [[1, 0]]),
        ep(2, False, 50, [[1]]),
        ep(3, False, 80, [[0, 0, 0]]),
    ]
    credit = assign_credit(eps)
    # rewards 1, 1, 0, 0: mean 0.5, std 0.5 -> task advantages +-1 (up to the 1e-6 eps)
    assert [c.task for c in credit] == pytest.approx([1, 1, -1, -1], abs=1e-5)
    assert [c.efficiency for c in credit] == [0.5, -0.5, 0.0, 0.0]
    # A = r + 0.25 * a_eff * m
    assert credit[0].steps == [pytest.approx([1.0, 1.125], abs=1e-5), pytest.approx([1.125], abs=1e-5)]
    assert credit[1].steps == [pytest.approx([0.875, 1.0], abs=1e-5)]
    assert credit[2].steps == [pytest.approx([-1.0], abs=1e-5)]
    assert credit[3].steps == [pytest.approx([-1.0, -1.0, -1.0], abs=1e-5)]
    assert not any(c.dropped for c in credit)


def test_groups_follow_the_group_field_and_keep_the_input_order(records: SimpleNamespace) -> None:
    s = records.step([1], [2])
    eps = [
        records.episode([s], group=1, success=True),
        records.episode([s], group=0, success=True),
        records.episode([s], group=1, success=False),
        records.episode([s], group=0, success=True),
    ]
    cfg = CreditConfig(advantages=AdvantageConfig(drop_zero_variance="task"))
    credit = assign_credit(eps, cfg)
    assert [c.dropped for c in credit] == [False, True, False, True]
    assert [c.task for c in credit] == pytest.approx([1, 0, -1, 0], abs=1e-5)


def test_penalties_only_on_failures(records: SimpleNamespace) -> None:
    silent = records.step([1], [2], calls=())
    malformed = records.step([1], [2], calls=("bash", "invalid_tool_call"))
    only_malformed = records.step([1], [2], calls=("invalid_tool_call",))
    fine = records.step([1], [2], calls=("bash",))
    assert shaped_reward(records.episode([silent], success=False), RewardConfig(penalties=REFERENCE)) == -0.3
    assert (
        shaped_reward(records.episode([fine, malformed], success=False), RewardConfig(penalties=REFERENCE))
        == -0.2
    )
    # no well-formed call at all: the no-tool-call penalty, not both
    assert (
        shaped_reward(records.episode([only_malformed], success=False), RewardConfig(penalties=REFERENCE))
        == -0.3
    )
    assert shaped_reward(records.episode([fine], success=False), RewardConfig(penalties=REFERENCE)) == 0.0
    assert shaped_reward(records.episode([silent], success=True), RewardConfig(penalties=REFERENCE)) == 1.0
    assert shaped_reward(records.episode([silent], success=False), RewardConfig(penalties=Penalties())) == 0.0


def test_graded_reward_and_penalised_group(records: SimpleNamespace) -> None:
    fine = records.step([1], [2], calls=("bash",))
    silent = records.step([1], [2], calls=())
    eps = [
        records.episode([fine], success=False, score=0.5),
        records.episode([silent], success=False, score=0.0),
    ]
    assert shaped_reward(eps[0], RewardConfig(penalties=REFERENCE, graded=True)) == 0.5
    credit = assign_credit(eps, CreditConfig(reward=RewardConfig(penalties=REFERENCE, graded=True)))
    assert [c.reward for c in credit] == [0.5, -0.3]
    # mean 0.1, std 0.4 -> +1, -1
    assert [c.task for c in credit] == pytest.approx([1, -1], abs=1e-5)


def test_an_early_submission_that_misses_a_value_earns_less_than_any_success(
    records: SimpleNamespace,
) -> None:
    """Graded reward with the efficiency channel on: the cheap early submitter (half the values) gets a lower
    reward and a lower advantage on every token than either success, the costly one included."""
    step, edit = records.step, records.step([1], [2, 3], edit=[1, 1])
    eps = [
        records.episode([step([1], [2]), edit, step([1], [4])], index=0, cost=900.0),  # success, costly
        records.episode([step([1], [2]), step([1], [4])], index=1, cost=300.0),  # success, cheap
        records.episode([step([1], [4])], index=2, success=False, score=0.5, cost=100.0),  # early, half right
    ]
    credit = assign_credit(eps, CreditConfig(reward=RewardConfig(penalties=REFERENCE, graded=True)))
    early = credit[2]
    assert early.reward < min(c.reward for c in credit[:2])
    worst_success = min(a for c in credit[:2] for s in c.steps for a in s)
    assert max(a for s in early.steps for a in s) < worst_success


def test_flops_cost_without_flops_is_a_config_error(records: SimpleNamespace) -> None:
    eps = [records.episode([records.step([1], [2])], index=i) for i in range(2)]
    with pytest.raises(ConfigError, match="geometry"):
        assign_credit(eps, CreditConfig(reward=RewardConfig(cost_unit="flops")))


def test_negative_penalty_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no_tool_call"):
        Penalties(no_tool_call=-0.3)
