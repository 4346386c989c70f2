"""Advantages: each option against hand-computed numbers, and the properties the issue requires."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxrl.errors import ConfigError
from ctxrl.rewards.advantages import (
    AdvantageConfig,
    batch_advantages,
    efficiency_advantages,
    group_advantages,
    task_advantages,
    token_advantages,
)


def plain_grpo(rewards: list[float], scale_by_std: bool = True, eps: float = 1e-6) -> list[float]:
    """Reference GRPO advantage, written out independently of the module."""
    n = len(rewards)
    mean = sum(rewards) / n
    std = (sum((r - mean) ** 2 for r in rewards) / n) ** 0.5
    return [(r - mean) / (std + eps) if scale_by_std else r - mean for r in rewards]


def test_task_channel_options() -> None:
    # mean 0.25, std sqrt(0.1875) = 0.4330
    assert task_advantages([1, 0, 0, 0]) == pytest.approx(
        [1.7320508, -0.5773503, -0.5773503, -0.5773503], rel=1e-5
    )
    assert task_advantages([1, 0, 0, 0], scale_by_std=False).tolist() == [0.75, -0.25, -0.25, -0.25]
    assert task_advantages([1, 1, 1]).tolist() == [0.0, 0.0, 0.0]


def test_efficiency_relative_by_hand() -> None:
    # eligible: 0, 1, 3 (2 failed, 4 not clean); mean of 100, 200, 600 = 300
    adv = efficiency_advantages(
        [100, 200, 10, 600, 50], [1, 1, 0, 1, 1], clean=[True, True, True, True, False]
    )
    assert adv.tolist() == pytest.approx([2 / 3, 1 / 3, 0.0, -1.0, 0.0])
    # clipped: mean of 10 and 1000 = 505 -> (505 − 1000)/505 = −0.98; a single dearer one clips at −1
    assert efficiency_advantages([10, 10, 10, 10_000], [1, 1, 1, 1])[3] == -1.0
    assert efficiency_advantages([100, 300, 50], [1, 0, 0]).tolist() == [0.0, 0.0, 0.0]  # < 2 successes
    assert efficiency_advantages([0, 0], [1, 1]).tolist() == [0.0, 0.0]


def test_efficiency_rank_by_hand() -> None:
    adv = efficiency_advantages([300, 100, 200, 200, 5], [1, 1, 1, 1, 0], method="rank")
    # eligible costs 300, 100, 200, 200 -> ranks 3, 0, 1.5, 1.5 -> 1 − 2r/3
    assert adv.tolist() == pytest.approx([-1.0, 1.0, 0.0, 0.0, 0.0])


def test_per_token_and_drop_options() -> None:
    masks = [[0, 1, 1, 0], [1, 0], [0, 0, 0], [1]]
    g = group_advantages([1, 1, 0, 0], [100, 300, 50, 80], [1, 1, 0, 0], masks)
    r = 0.5 / (0.5 + 1e-6)  # (1 − mean 0.5) / std 0.5
    assert g.task == pytest.approx([r, r, -r, -r])
    assert g.efficiency.tolist() == [0.5, -0.5, 0.0, 0.0]
    assert g.tokens[0] == pytest.approx([r, r + 0.125, r + 0.125, r])
    assert g.tokens[1] == pytest.approx([r - 0.125, r])
    assert g.tokens[3] == pytest.approx([-r])
    assert not g.dropped

    all_success = ([1, 1], [100, 300], [1, 1], [[1], [1]])
    all_fail = ([0, 0], [100, 300], [0, 0], [[1], [1]])
    mixed = ([1, 0], [100, 300], [1, 0], [[1], [1]])
    groups = [all_success, all_fail, mixed]
    assert batch_advantages(groups)[1] == []
    assert batch_advantages(groups, config=AdvantageConfig(drop_zero_variance="task"))[1] == [0, 1]
    # all successes with different costs still carry an efficiency signal on edit tokens: kept
    results, dropped = batch_advantages(groups, config=AdvantageConfig(drop_zero_variance="signal"))
    assert dropped == [1]
    assert results[0].tokens[0].tolist() == [0.25 * 0.5]


def test_efficiency_on_every_action_token_is_the_same_gated_advantage_without_the_mask() -> None:
    rewards, costs, success = [1, 1, 1, 0], [100, 300, 200, 50], [True, True, True, False]
    masks = [[1, 0, 0], [0, 0, 1], [0, 0, 0], [1, 1, 0]]
    edits = group_advantages(rewards, costs, success, masks)
    actions = group_advantages(
        rewards, costs, success, masks, config=AdvantageConfig(efficiency_tokens="actions")
    )
    # The episode-level channels are the same; successful costs 100, 300, 200 around their mean 200.
    assert actions.task.tolist() == edits.task.tolist()
    assert actions.efficiency.tolist() == edits.efficiency.tolist() == [0.5, -0.5, 0.0, 0.0]
    # Every token of an episode now carries task + w_eff * efficiency, whatever its edit mask says ...
    win, lose = 0.25 / 0.4330127, -0.75 / 0.4330127
    expected = [[win + 0.125] * 3, [win - 0.125] * 3, [win] * 3, [lose] * 3]
    for got, want in zip(actions.tokens, expected):
        assert got == pytest.approx(want, abs=1e-5)
    # ... where under the reference design only the edit tokens did: the cheaper success's reads gained nothing.
    assert edits.tokens[0].tolist()[1:] == pytest.approx([win, win], abs=1e-5)
    # Failures still get no efficiency advantage, so the success gate holds.
    assert actions.tokens[3].tolist() == edits.tokens[3].tolist() == pytest.approx([lose] * 3, abs=1e-5)


def test_config_is_checked() -> None:
    with pytest.raises(ConfigError):
        AdvantageConfig(w_eff=-1)
    with pytest.raises(ConfigError, match="efficiency_tokens"):
        AdvantageConfig(efficiency_tokens="all")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        AdvantageConfig(drop_zero_variance="all")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        token_advantages([1.0], [0.0, 0.0], [[1]], w_eff=0.25)


# -- properties ----------------------------------------------------------------------------------------

groups = st.integers(min_value=1, max_value=8).flatmap(
    lambda n: st.tuples(
        st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n),
        st.lists(st.floats(min_value=1.0, max_value=1e6), min_size=n, max_size=n),
        st.lists(st.lists(st.integers(0, 1), min_size=1, max_size=6), min_size=n, max_size=n),
        st.lists(st.booleans(), min_size=n, max_size=n),
    )
)
configs = st.builds(
    AdvantageConfig,
    scale_by_std=st.booleans(),
    efficiency=st.sampled_from(["relative", "rank"]),
)


@settings(max_examples=200, deadline=None)
@given(groups, configs)
def test_no_efficiency_weight_or_no_edits_is_plain_grpo(group: tuple, cfg: AdvantageConfig) -> None:
    rewards, costs, masks, clean = group
    success = [r > 0 for r in rewards]
    expected = plain_grpo(rewards, cfg.scale_by_std)
    zero_w = AdvantageConfig(w_eff=0.0, scale_by_std=cfg.scale_by_std, efficiency=cfg.efficiency)
    no_edits = [[0] * len(m) for m in masks]
    for config, m in ((zero_w, masks), (cfg, no_edits)):
        g = group_advantages(rewards, costs, success, m, clean=clean, config=config)
        for i, tokens in enumerate(g.tokens):
            assert tokens == pytest.approx([expected[i]] * len(masks[i]), abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(groups, configs, st.integers(0, 7), st.floats(min_value=0.0, max_value=1.0))
def test_cheaper_success_never_lowers_its_efficiency_advantage(
    group: tuple, cfg: AdvantageConfig, who: int, factor: float
) -> None:
    rewards, costs, _, clean = group
    i = who % len(rewards)
    success = [r > 0 for r in rewards]
    success[i] = True
    cheaper = list(costs)
    cheaper[i] = costs[i] * factor
    before = efficiency_advantages(costs, success, clean, method=cfg.efficiency)[i]
    after = efficiency_advantages(cheaper, success, clean, method=cfg.efficiency)[i]
    assert after >= before - 1e-12


@settings(max_examples=200, deadline=None)
@given(groups, configs, st.integers(0, 7), st.integers(1, 10))
def test_more_editing_at_the_same_cost_earns_no_more(
    group: tuple, cfg: AdvantageConfig, who: int, extra: int
) -> None:
    rewards, costs, masks, clean = group
    i = who % len(rewards)
    success = [r > 0 for r in rewards]
    more = [list(m) for m in masks]
    more[i] = [1] * (len(masks[i]) + extra)  # more edit tokens (more edits, more removed), same cost
    base = group_advantages(rewards, costs, success, masks, clean=clean, config=cfg)
    busy = group_advantages(rewards, costs, success, more, clean=clean, config=cfg)
    # The episode's rewards do not move, nobody else's advantages move ...
    assert busy.task[i] == base.task[i] and busy.efficiency[i] == base.efficiency[i]
    for j in range(len(rewards)):
        if j != i:
            assert np.array_equal(busy.tokens[j], base.tokens[j])
    # ... and every one of its tokens still gets one of the same two values.
    allowed = {base.task[i], base.task[i] + cfg.w_eff * base.efficiency[i]}
    assert set(busy.tokens[i].tolist()) <= allowed
