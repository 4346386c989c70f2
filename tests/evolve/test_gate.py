"""The gate: exact tests against hand counts, both rules on hand-made data, and the night-long simulation."""

from __future__ import annotations

import math

import pytest

from ctxrl.evolve.gate import (
    CtxrlGate,
    GateDecision,
    GateError,
    Paired,
    betting_evalue,
    choose,
    mcnemar_exact,
    pair,
    reference_rule,
    sign_flip_pvalue,
    simulate_gate,
)


def paired(
    cand: list[float], inc: list[float], cc: list[float] | None = None, ic: list[float] | None = None
) -> Paired:
    n = len(cand)
    return Paired(
        tuple(f"t{i}" for i in range(n)),
        tuple(cand),
        tuple(inc),
        tuple(cc or [1.0] * n),
        tuple(ic or [1.0] * n),
    )


def test_pair_averages_repeats_per_task_and_requires_every_episode() -> None:
    p = pair(
        {"a": [1, 0, 1, 1], "b": [0, 0]},
        {"a": [0, 0, 1, 1], "b": [1, 1]},
        {"a": [10, 30], "b": [5]},
        {"a": [20], "b": [5, 15]},
    )
    assert p.tasks == ("a", "b")
    assert p.diffs == [0.75 - 0.5, 0.0 - 1.0]
    assert p.candidate_cost == (20.0, 5.0) and p.incumbent_cost == (20.0, 10.0)
    assert p.savings == [0.0, 0.5]
    with pytest.raises(GateError, match="same tasks"):
        pair({"a": [1]}, {"b": [1]}, {"a": [1]}, {"b": [1]})
    with pytest.raises(GateError, match="task 'a' has no candidate cost: every dev episode must be graded"):
        pair({"a": [1]}, {"a": [1]}, {"a": []}, {"a": [1]})
    with pytest.raises(GateError, match="outside"):
        pair({"a": [2]}, {"a": [1]}, {"a": [1]}, {"a": [1]})


def test_mcnemar_exact_matches_binomial_counts() -> None:
    # b=8, c=1: P(Bin(9, 1/2) >= 8) = (C(9,8) + C(9,9)) / 512 = 10/512
    assert mcnemar_exact(8, 1) == 10 / 512
    assert mcnemar_exact(8, 1, alternative="two-sided") == 20 / 512
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(3, 3) == (20 + 15 + 6 + 1) / 64


def test_sign_flip_equals_mcnemar_on_binary_scores() -> None:
    cand = [1, 1, 1, 1, 1, 0, 0, 1, 0, 1, 1, 1]
    inc = [0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 1]
    b = sum(c > i for c, i in zip(cand, inc))
    c = sum(c < i for c, i in zip(cand, inc))
    assert (b, c) == (6, 1)
    assert sign_flip_pvalue([x - y for x, y in zip(cand, inc)]) == mcnemar_exact(b, c) == 8 / 128


def test_sign_flip_on_repeat_means_counts_sign_patterns() -> None:
    # magnitudes 0.5, 0.5, 1.0 (the lattice 1/2): the 8 sign patterns give sums
    # +2 (1), +1 (2 ways of one 0.5 flipped), 0? no: values are {+-1, +-1, +-2} on the lattice -> sums
    # -4,-2,-2,0,0,2,2,4; observed +1+1+2 = 4 -> only one pattern reaches it
    assert sign_flip_pvalue([0.5, 0.5, 1.0]) == 1 / 8
    # observed +1 -1 +2 = 2 -> sums >= 2: {2, 2, 4} -> 3/8
    assert sign_flip_pvalue([0.5, -0.5, 1.0]) == 3 / 8
    assert sign_flip_pvalue([0.0, 0.0]) == 1.0


def test_betting_evalue_by_hand() -> None:
    # one bet size 0.5: (1 + 0.5)(1 - 0.5) = 0.75; mixture of 0.5 and 0.2 on [1]: (1.5 + 1.2) / 2
    assert betting_evalue([1.0, -1.0], grid=(0.5,)) == pytest.approx(0.75)
    assert betting_evalue([1.0], grid=(0.5, 0.2)) == pytest.approx(1.35)
    assert betting_evalue([]) == 1.0


def test_reference_rule_by_hand() -> None:
    # diffs 1, 0, 0, 1: d = 0.5, sd = sqrt(1/3), SE = sqrt(1/3)/2 = 0.2887 -> d > SE
    r = reference_rule(paired([1, 1, 0, 1], [0, 1, 0, 0]))
    assert r.accept and r.branch == "superior"
    assert r.se == pytest.approx(math.sqrt(1 / 3) / 2)
    # diffs 1, -1, 0, 0: d = 0, cheaper -> accepted as non-inferior and cheaper
    r = reference_rule(paired([1, 0, 0, 1], [0, 1, 0, 1], cc=[1, 1, 1, 1], ic=[2, 2, 2, 2]))
    assert r.accept and r.branch == "noninferior_cheaper"
    r = reference_rule(paired([1, 0, 0, 1], [0, 1, 0, 1], cc=[3, 3, 3, 3], ic=[2, 2, 2, 2]))
    assert not r.accept and r.branch == "rejected"


def test_alpha_spending() -> None:
    g = CtxrlGate(alpha=0.05)
    assert g.alpha_for(1) == pytest.approx(0.05 * 6 / math.pi**2)
    assert g.alpha_for(10) == pytest.approx(0.05 * 6 / (math.pi**2 * 100))
    # the basel series spends alpha over infinitely many proposals
    assert sum(g.alpha_for(k) for k in range(1, 200_000)) == pytest.approx(0.05, rel=1e-4)
    u = CtxrlGate(spending="uniform", planned_proposals=50)
    assert u.alpha_for(50) == pytest.approx(0.001) and u.alpha_for(51) == 0.0
    with pytest.raises(GateError, match="spending"):
        CtxrlGate(spending="greedy")
    assert g.looks(40) == [10, 20, 30, 40] and g.looks(25) == [10, 20, 25]


def test_ctxrl_accepts_a_clear_win_and_stops_a_clear_loser_early() -> None:
    g = CtxrlGate()
    # 40 tasks, the candidate solves 14 the incumbent fails, loses none: exact p = 2^-14 < 0.8*0.0304
    win = paired([1.0] * 14 + [0.0] * 26, [0.0] * 40)
    d = g.run(win, k=1, repeats=2)
    assert d.accept and d.branch == "superior" and d.n_tasks == 40
    assert d.p_superior == 2.0**-14
    # the same win at proposal 100 has alpha_100 = 3.0e-6: 2^-14 = 6.1e-5 is not enough
    assert not g.run(win, k=100).accept
    # the candidate loses 6 of the first 10 tasks: futility at the first look, 30 tasks x 2 repeats saved
    lose = paired([0.0] * 6 + [1.0] * 34, [1.0] * 40)
    d = g.run(lose, k=1, repeats=2)
    assert not d.accept and d.branch == "futile" and d.n_tasks == 10 and d.episodes_saved == 60


def test_ctxrl_noninferior_and_cheaper_branch() -> None:
    g = CtxrlGate(look_every=20)  # margin 0.10
    same = [1.0, 0.0] * 60
    # equal success on 120 tasks, the candidate costs half on every task (saving 0.5 per task). NI e-value at
    # n tasks is the mean over the bet grid of (1 + lam * 0.1)^n; at n = 100 the 0.85 bet alone gives
    # 1.085^100 / 8 = 441 >= 1 / (0.2 * alpha_1) = 164.5, at n = 80 only 87 / 8: B passes at the look n = 100
    d = g.run(paired(same, same, cc=[1.0] * 120, ic=[2.0] * 120), k=1)
    assert d.accept and d.branch == "noninferior_cheaper" and d.n_tasks == 100 and d.episodes_saved == 20
    assert d.e_noninferior == pytest.approx(sum((1 + lam * 0.1) ** 100 for lam in g_grid()) / len(g_grid()))
    # 40 tied tasks are too few for B (e-value 1.085^40 / 8 ~ 3.3 at most)
    d = CtxrlGate(look_every=40).run(paired(same[:40], same[:40], cc=[1.0] * 40, ic=[2.0] * 40), k=1)
    assert not d.accept
    # equal success and equal cost: nothing to accept
    d = g.run(paired(same, same), k=1)
    assert not d.accept and d.branch == "rejected"


def g_grid() -> tuple[float, ...]:
    from ctxrl.evolve.gate import BET_GRID

    return BET_GRID


def test_decide_validates_its_input() -> None:
    with pytest.raises(GateError, match="planned"):
        CtxrlGate().decide(paired([1.0] * 5, [0.0] * 5), k=1, n_planned=4)


def test_choose_takes_the_largest_d_then_the_cheapest() -> None:
    def dec(d: float, cost: float) -> GateDecision:
        return GateDecision("ctxrl", True, "superior", 40, 40, d, 0.1, cost, 1.0)

    assert choose([dec(0.1, 5), dec(0.2, 9), dec(0.15, 1)]) == 1
    assert choose([dec(0.1, 5), dec(0.2, 9), dec(0.15, 1)], tie_tolerance=0.06) == 2


def test_simulation_is_deterministic() -> None:
    a = simulate_gate(CtxrlGate(), nights=3, proposals=5, seed=7)
    b = simulate_gate(CtxrlGate(), nights=3, proposals=5, seed=7)
    assert a == b


@pytest.mark.slow
def test_null_nights_reference_accepts_noise_ctxrl_holds_alpha() -> None:
    """No true effect, binary outcomes, 40 dev tasks, 100 proposals a night, 300 nights (seed 0)."""
    settings = dict(nights=300, proposals=100, tasks=40, repeats=1, effect=0.0, seed=0)
    ref = simulate_gate("reference", **settings)  # type: ignore[arg-type]
    ours = simulate_gate(CtxrlGate(alpha=0.05), **settings)  # type: ignore[arg-type]
    # the reference rule accepts about half of all noise proposals, so every night accepts noise
    assert ref.proposal_accept_rate > 0.4
    assert ref.night_accept_rate == 1.0
    # ctxrl's rule: at most alpha of the nights accept anything (measured 0.017 at these settings, 5 of 300 nights)
    assert ours.night_accept_rate <= 0.05
    # and futility stops save more than half of the candidates' dev episodes under the null
    assert ours.saved_fraction > 0.5


@pytest.mark.slow
def test_null_night_of_1000_proposals_stays_under_alpha() -> None:
    ours = simulate_gate(CtxrlGate(alpha=0.05), nights=40, proposals=1000, tasks=40, effect=0.0, seed=1)
    ref = simulate_gate("reference", nights=40, proposals=1000, tasks=40, effect=0.0, seed=1)
    assert ref.night_accept_rate == 1.0
    assert ours.night_accept_rate <= 0.05


@pytest.mark.slow
def test_power_under_a_15_point_improvement() -> None:
    """+15 points on every task, 40 dev tasks x 4 repeats: the first proposal of a night is accepted most of the
    time, and a night of such proposals almost always accepts one."""
    r = simulate_gate(CtxrlGate(), nights=200, proposals=5, tasks=40, repeats=4, effect=0.15, seed=2)
    # measured: k=1 accepted in 0.805 of nights, a night of 5 accepts one in 0.96
    assert r.first_accept_rate >= 0.7
    assert r.night_accept_rate >= 0.85


def test_docstring_examples() -> None:
    import doctest

    import ctxrl.evolve.gate as gate

    result = doctest.testmod(gate)
    assert result.attempted == 3 and result.failed == 0
