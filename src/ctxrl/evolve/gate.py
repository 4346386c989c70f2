r"""The paired held-out gate: does a candidate skill replace the incumbent?

Input: the candidate's and the incumbent's episode scores (in [0, 1]) and costs on the same dev tasks and
seeds. Repeats of a task are averaged first: **the task is the unit** (:func:`pair`). Let ``D_i`` be the
candidate's mean score minus the incumbent's on task ``i`` and ``r_i`` the relative cost saving
``(c_inc - c_cand) / max(c_inc, c_cand)`` of the per-task mean costs (both in [-1, 1]).

**The reference rule** (:func:`reference_rule`, kept for comparison): ``d = mean(D)``, ``SE = sd(D)/sqrt(n)``;
accept if ``d > SE``, or ``|d| <= SE`` and the candidate's mean cost is lower. One such test on pure noise
accepts about half the time (``d > SE`` alone about 16 %), so a night of proposals accepts noise almost
surely (:func:`simulate_gate` measures it).

**ctxrl's rule** (:class:`CtxrlGate`). Proposals are numbered ``k = 1, 2, ...`` in the order they reach the gate
over the whole night (dropped candidates never reach it). Proposal ``k`` may spend

    alpha_k = alpha * 6 / (pi^2 k^2)      (spending "basel": sums to alpha over infinitely many proposals)
    alpha_k = alpha / K  for k <= K, else 0   (spending "uniform", K = planned proposals of the night)

split into ``w * alpha_k`` for branch A and ``(1 - w) * alpha_k`` for branch B (``w`` = ``superiority_share``).
The candidate is evaluated on the planned ``N`` dev tasks in a fixed order, in looks of ``look_every`` tasks.
It is **accepted** when

- **A, superior**: after all ``N`` tasks, the exact one-sided paired sign-flip (randomisation) test of
  ``sum D_i`` gives ``p <= w * alpha_k`` (:func:`sign_flip_pvalue`; for binary scores and one repeat this is the
  exact McNemar test on discordant tasks, :func:`mcnemar_exact`). Null: for every task, the paired difference
  is symmetric about 0 or leans negative (``P(D_i = a) <= P(D_i = -a)`` for ``a > 0``), which holds when the
  candidate is no better than the incumbent on that task;
- **B, non-inferior and cheaper**, at any look: the betting e-value for ``E[D] > -margin`` and the betting
  e-value for ``E[r] > min_saving`` both reach ``1 / ((1 - w) * alpha_k)`` (:func:`betting_evalue`: a mixture
  over bet sizes of ``prod(1 + lambda x_i)``, a nonnegative supermartingale under its null, so by Ville's
  inequality it is valid at every look). Requiring both is an intersection-union test, so B's level is
  ``(1 - w) * alpha_k`` with no further split.

It is **stopped for futility** at a look after at least ``min_tasks`` tasks when both branches are out of
reach: A's conditional power (normal approximation of the sign-flip statistic, the remaining tasks assumed to
have effect ``design_effect`` and the observed spread) is below ``futility_power``, and B's running estimates
are not both on the right side (mean ``D`` above ``-margin``, mean saving above ``min_saving``). Stopping for
futility only removes accepts, so it never raises the false-accept rate; the candidate's unrun dev episodes
are reported as saved.

Guarantee: by the union bound over proposals and branches, the probability that a night accepts any
candidate for which both branch nulls hold is at most ``alpha``, whatever the number of proposals (for
"uniform", up to ``K`` proposals), however the proposals depend on each other, and whichever incumbent each
was compared with. The test split is never read by any gate.

Among several candidates accepted in one round, :func:`choose` takes the one with the largest mean difference;
ties (within ``tie_tolerance``) go to the cheaper.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist, fmean
from typing import Any

from ctxrl.errors import CtxrlError

_NORMAL = NormalDist()


class GateError(CtxrlError):
    """The gate's input is unusable (tasks missing on one side, an episode not graded, bad settings)."""


@dataclass(frozen=True)
class Paired:
    """Per-task means of one candidate and the incumbent on the same dev tasks, in evaluation order."""

    tasks: tuple[str, ...]
    candidate: tuple[float, ...]
    incumbent: tuple[float, ...]
    candidate_cost: tuple[float, ...]
    incumbent_cost: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.tasks)

    @property
    def diffs(self) -> list[float]:
        return [c - i for c, i in zip(self.candidate, self.incumbent)]

    @property
    def savings(self) -> list[float]:
        """Relative cost saving per task, in [-1, 1]: (incumbent − candidate) / the larger of the two."""
        out = []
        for c, i in zip(self.candidate_cost, self.incumbent_cost):
            top = max(c, i)
            out.append((i - c) / top if top > 0 else 0.0)
        return out

    def head(self, n: int) -> Paired:
        """The first ``n`` tasks (a look of a sequential evaluation)."""
        return Paired(
            self.tasks[:n],
            self.candidate[:n],
            self.incumbent[:n],
            self.candidate_cost[:n],
            self.incumbent_cost[:n],
        )


def pair(
    candidate: Mapping[str, Sequence[float]],
    incumbent: Mapping[str, Sequence[float]],
    candidate_cost: Mapping[str, Sequence[float]],
    incumbent_cost: Mapping[str, Sequence[float]],
    order: Sequence[str] | None = None,
) -> Paired:
    """Average each task's repeats and pair the two skills task by task (in ``order``, default sorted ids).

    Every task must have at least one score and one cost on both sides, with scores in [0, 1]: an ungraded
    episode is an error, not a zero.
    """
    tasks = list(order) if order is not None else sorted(candidate)
    if set(tasks) != set(candidate) or set(tasks) != set(incumbent):
        missing = sorted(set(candidate) ^ set(incumbent) | set(tasks) ^ set(candidate))
        raise GateError(f"candidate and incumbent were not run on the same tasks (differ on {missing[:5]})")
    for name, table in (
        ("candidate score", candidate),
        ("incumbent score", incumbent),
        ("candidate cost", candidate_cost),
        ("incumbent cost", incumbent_cost),
    ):
        for task in tasks:
            values = table.get(task)
            if not values:
                raise GateError(f"task {task!r} has no {name}: every dev episode must be graded")
            if name.endswith("score") and any(not 0.0 <= v <= 1.0 for v in values):
                raise GateError(f"task {task!r}: a {name} outside [0, 1]")
    return Paired(
        tuple(tasks),
        tuple(fmean(candidate[t]) for t in tasks),
        tuple(fmean(incumbent[t]) for t in tasks),
        tuple(fmean(candidate_cost[t]) for t in tasks),
        tuple(fmean(incumbent_cost[t]) for t in tasks),
    )


@dataclass(frozen=True)
class GateDecision:
    """The gate's verdict on one candidate, with the statistics behind it."""

    rule: str
    """``reference`` or ``ctxrl``."""
    accept: bool
    branch: str
    """``superior``, ``noninferior_cheaper``, ``rejected`` (all tasks run, no branch passed) or ``futile``."""
    n_tasks: int
    """Tasks evaluated before the decision."""
    n_planned: int
    d: float
    """Mean paired difference of success (candidate − incumbent)."""
    se: float
    cost_candidate: float
    cost_incumbent: float
    k: int = 0
    """The proposal's index in the night (ctxrl rule)."""
    alpha_k: float = 0.0
    p_superior: float | None = None
    e_noninferior: float | None = None
    e_cheaper: float | None = None
    episodes_saved: int = 0
    """Candidate dev episodes not run because the evaluation stopped early."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean_se(diffs: Sequence[float]) -> tuple[float, float]:
    if not diffs:
        raise GateError("no paired tasks")
    n = len(diffs)
    d = math.fsum(diffs) / n
    if n < 2:
        return d, math.inf
    var = math.fsum((x - d) ** 2 for x in diffs) / (n - 1)
    return d, math.sqrt(var / n)


def reference_rule(paired: Paired) -> GateDecision:
    """The reference gate: accept if ``d > SE``, or ``|d| <= SE`` and the candidate's mean cost is lower."""
    d, se = _mean_se(paired.diffs)
    cc, ci = fmean(paired.candidate_cost), fmean(paired.incumbent_cost)
    if d > se:
        branch = "superior"
    elif abs(d) <= se and cc < ci:
        branch = "noninferior_cheaper"
    else:
        branch = "rejected"
    return GateDecision(
        rule="reference",
        accept=branch != "rejected",
        branch=branch,
        n_tasks=paired.n,
        n_planned=paired.n,
        d=d,
        se=se,
        cost_candidate=cc,
        cost_incumbent=ci,
    )


# ---------------------------------------------------------------------------------------------- exact tests


def _binom_tail(n: int, b: int) -> float:
    """P(Binomial(n, 1/2) >= b)."""
    if b <= 0:
        return 1.0
    if b > n:
        return 0.0
    return sum(math.comb(n, j) for j in range(b, n + 1)) / 2**n


def mcnemar_exact(b: int, c: int, *, alternative: str = "greater") -> float:
    """Exact McNemar p-value from the discordant pairs: ``b`` tasks only the candidate solved, ``c`` only the
    incumbent solved. ``greater``: one-sided for the candidate being better, P(Bin(b+c, 1/2) >= b);
    ``two-sided``: twice the smaller tail, capped at 1.

    >>> mcnemar_exact(8, 1)  # 1 + 9 + 36 of 512 sign patterns are at least this lopsided
    0.01953125
    """
    if b < 0 or c < 0:
        raise GateError("discordant counts must be non-negative")
    if alternative == "greater":
        return _binom_tail(b + c, b)
    if alternative == "two-sided":
        return min(1.0, 2 * min(_binom_tail(b + c, b), _binom_tail(b + c, c)))
    raise GateError(f"alternative must be 'greater' or 'two-sided', not {alternative!r}")


def _grid(mags: Sequence[float], max_grid: int) -> int:
    """The smallest G <= max_grid that puts every magnitude on the integer lattice (1/G steps), else max_grid."""
    for g in range(1, max_grid + 1):
        if all(abs(m * g - round(m * g)) < 1e-9 for m in mags):
            return g
    return max_grid


def sign_flip_pvalue(diffs: Sequence[float], *, max_grid: int = 64) -> float:
    """Exact one-sided p-value of the paired sign-flip test: P(sum s_i |D_i| >= sum D_i) over independent fair
    signs ``s_i``, computed by convolution on the lattice of the magnitudes.

    Means of ``r`` binary repeats lie on the lattice 1/r and are exact. Other values are rounded to 1/``max_grid``
    steps, and the statistic uses the rounded values, so the test stays exact for the rounded data (rounding is
    applied to magnitudes, which keeps the sign symmetry it relies on).

    >>> sign_flip_pvalue([1, 1, 1, 0, -1])  # 4 discordant tasks, 3 for the candidate: (4 + 1) / 16
    0.3125
    """
    mags = [abs(d) for d in diffs if d != 0]
    if not mags:
        return 1.0
    g = _grid(mags, max_grid)
    values = [round(abs(d) * g) * (1 if d > 0 else -1) for d in diffs if d != 0]
    observed = sum(values)
    counts: dict[int, int] = {}
    for v in values:
        if v:
            counts[abs(v)] = counts.get(abs(v), 0) + 1
    if len(counts) == 1:  # one magnitude: a binomial tail (McNemar for binary scores)
        ((v, c),) = counts.items()
        # sum = v * (2B - c) >= observed  <=>  B >= (observed / v + c) / 2
        return _binom_tail(c, math.ceil((observed / v + c) / 2 - 1e-12))
    # distribution of the signed sum, as a dict from total to probability
    dist: dict[int, float] = {0: 1.0}
    for v, c in counts.items():
        pmf = [math.comb(c, j) / 2**c for j in range(c + 1)]
        new: dict[int, float] = {}
        for total, p in dist.items():
            for j, q in enumerate(pmf):
                key = total + v * (2 * j - c)
                new[key] = new.get(key, 0.0) + p * q
        dist = new
    return min(1.0, sum(p for total, p in dist.items() if total >= observed))


BET_GRID = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.85)
"""Bet sizes of the e-value mixture (uniform weights); all keep 1 + lambda x > 0 for x > -1/0.85 = -1.176."""


def betting_evalue(xs: Sequence[float], *, grid: Sequence[float] = BET_GRID) -> float:
    """E-value against ``H0: E[x_i | past] <= 0`` for ``x_i > -1 / max(grid)``: the mean over bet sizes
    ``lambda`` in ``grid`` of ``prod(1 + lambda x_i)``.

    Each product is a nonnegative supermartingale under H0, and so is their mean, so P(it ever reaches 1/a) <= a
    (Ville): it may be read after every task.

    >>> round(betting_evalue([1.0, 1.0], grid=(0.5,)), 6)
    2.25
    """
    if any(x * max(grid) <= -1 for x in xs):
        raise GateError(f"betting e-value needs x > {-1 / max(grid):.3f}")
    total = 0.0
    for lam in grid:
        log_wealth = sum(
            map(math.log1p, map(float(lam).__mul__, xs))
        )  # C-level loop: the simulation calls this a lot
        total += math.exp(min(log_wealth, 700.0))
    return total / len(grid)


# ---------------------------------------------------------------------------------------------- ctxrl's rule


@dataclass(frozen=True)
class CtxrlGate:
    """ctxrl's gate (see the module docstring for the rule and its guarantee)."""

    alpha: float = 0.05
    """Family-wise false-accept rate allowed over the whole night."""
    spending: str = "basel"
    """``basel`` (alpha_k = alpha·6/(π²k²), any number of proposals) or ``uniform`` (alpha/K for k <= K)."""
    planned_proposals: int = 100
    """K for ``uniform`` spending; proposals beyond it get no alpha and cannot be accepted."""
    superiority_share: float = 0.8
    """Share w of alpha_k for branch A (superior); the rest goes to branch B (non-inferior and cheaper)."""
    margin: float = 0.10
    """Non-inferiority margin on the mean success difference (B: candidate at most this much worse). Even a
    candidate tied on every task needs about log(1/((1-w) alpha_k)) / log(1 + 0.85 margin) + 25 tasks to pass B
    (about 100 tasks at k=1 with the defaults): B is for large dev sets."""
    min_saving: float = 0.0
    """B needs the mean relative cost saving above this (0: cheaper at all)."""
    design_effect: float = 0.10
    """The smallest improvement worth finding; futility assumes it for the unrun tasks."""
    futility_power: float = 0.10
    """Stop when A's conditional power under ``design_effect`` is below this (and B is out of reach)."""
    look_every: int = 10
    """Tasks per look of the sequential evaluation."""
    min_tasks: int = 10
    """No futility stop before this many tasks."""

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise GateError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.spending not in ("basel", "uniform"):
            raise GateError(f"spending must be 'basel' or 'uniform', got {self.spending!r}")
        if not 0 < self.superiority_share <= 1:
            raise GateError("superiority_share must be in (0, 1]")
        if not 0 <= self.margin < 0.15 or not 0 <= self.min_saving < 0.15:
            raise GateError("margin and min_saving must be in [0, 0.15) (the bets need x > -1/0.85)")
        if self.look_every < 1 or self.min_tasks < 1 or self.planned_proposals < 1:
            raise GateError("look_every, min_tasks and planned_proposals must be at least 1")

    def alpha_for(self, k: int) -> float:
        """The alpha proposal ``k`` (1-based) may spend."""
        if k < 1:
            raise GateError(f"proposal index must be >= 1, got {k}")
        if self.spending == "basel":
            return self.alpha * 6.0 / (math.pi**2 * k * k)
        return self.alpha / self.planned_proposals if k <= self.planned_proposals else 0.0

    def looks(self, n_planned: int) -> list[int]:
        """Task counts at which :meth:`decide` is called: every ``look_every`` tasks, and the last."""
        out = list(range(self.look_every, n_planned, self.look_every))
        return [*out, n_planned]

    def _conditional_power(self, diffs: Sequence[float], n_planned: int, alpha_a: float) -> float:
        n = len(diffs)
        rest = n_planned - n
        if rest <= 0 or alpha_a <= 0:
            return 0.0
        # the sign-flip statistic S = sum D_i has randomisation variance sum D_i^2; the spread of the unrun tasks
        # is taken from the observed ones, floored so that a run of ties does not make it look certain
        q_seen = sum(d * d for d in diffs)
        v = max(q_seen / n, 0.05)
        q_final = q_seen + rest * (v + self.design_effect**2)
        needed = _NORMAL.inv_cdf(1 - alpha_a) * math.sqrt(q_final) - sum(diffs) - rest * self.design_effect
        return 1 - _NORMAL.cdf(needed / math.sqrt(rest * v))

    def decide(self, paired: Paired, *, k: int, n_planned: int, repeats: int = 1) -> GateDecision | None:
        """The decision after the tasks in ``paired`` (a prefix of the planned ``n_planned``), or None to go on.

        Call it at :meth:`looks`; at ``paired.n == n_planned`` it always decides. ``repeats`` (episodes per
        task) only scales the reported ``episodes_saved``.
        """
        n = paired.n
        if n > n_planned:
            raise GateError(f"{n} tasks evaluated but only {n_planned} planned")
        alpha_k = self.alpha_for(k)
        alpha_a = self.superiority_share * alpha_k
        alpha_b = (1 - self.superiority_share) * alpha_k
        diffs, savings = paired.diffs, paired.savings
        d, se = _mean_se(diffs)
        e_ni = betting_evalue([x + self.margin for x in diffs])
        e_cheap = betting_evalue([s - self.min_saving for s in savings])
        final = n == n_planned
        p = sign_flip_pvalue(diffs) if final else None

        def verdict(accept: bool, branch: str) -> GateDecision:
            return GateDecision(
                rule="ctxrl",
                accept=accept,
                branch=branch,
                n_tasks=n,
                n_planned=n_planned,
                d=d,
                se=se,
                cost_candidate=sum(paired.candidate_cost) / n,
                cost_incumbent=sum(paired.incumbent_cost) / n,
                k=k,
                alpha_k=alpha_k,
                p_superior=p,
                e_noninferior=e_ni,
                e_cheaper=e_cheap,
                episodes_saved=(n_planned - n) * repeats,
            )

        if p is not None and alpha_a > 0 and p <= alpha_a:
            return verdict(True, "superior")
        if alpha_b > 0 and min(e_ni, e_cheap) >= 1 / alpha_b:
            return verdict(True, "noninferior_cheaper")
        if final:
            return verdict(False, "rejected")
        if n >= self.min_tasks:
            a_alive = self._conditional_power(diffs, n_planned, alpha_a) >= self.futility_power
            b_alive = alpha_b > 0 and d > -self.margin and sum(savings) / n > self.min_saving
            if not a_alive and not b_alive:
                return verdict(False, "futile")
        return None

    def run(self, paired: Paired, *, k: int, repeats: int = 1) -> GateDecision:
        """The sequential evaluation replayed over a fully known ``paired`` (all planned tasks): the decision
        at the first look that decides. Used by the simulation; the loop calls :meth:`decide` as results come."""
        for n in self.looks(paired.n):
            decision = self.decide(paired.head(n), k=k, n_planned=paired.n, repeats=repeats)
            if decision is not None:
                return decision
        raise AssertionError("the last look always decides")


def choose(accepted: Sequence[GateDecision], *, tie_tolerance: float = 0.0) -> int:
    """Index of the winner among a round's accepted decisions: the largest ``d``; among those within
    ``tie_tolerance`` of it, the lowest candidate cost (then the earliest)."""
    if not accepted:
        raise GateError("no accepted candidate to choose from")
    best = max(a.d for a in accepted)
    tied = [i for i, a in enumerate(accepted) if a.d >= best - tie_tolerance]
    return min(tied, key=lambda i: (accepted[i].cost_candidate, i))


# ---------------------------------------------------------------------------------------------- simulation


@dataclass(frozen=True)
class SimResult:
    """What :func:`simulate_gate` measured for one rule."""

    rule: str
    nights: int
    proposals: int
    night_accept_rate: float
    """Fraction of nights with at least one accept (under the null: the family-wise false-accept rate)."""
    proposal_accept_rate: float
    """Fraction of all proposals accepted."""
    first_accept_rate: float
    """Fraction of proposal k=1 accepted (the per-proposal power of the first proposal of a night)."""
    mean_tasks: float
    """Mean dev tasks evaluated per proposal."""
    saved_fraction: float
    """Fraction of the planned candidate dev episodes not run (futility stops)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def simulate_gate(
    rule: str | CtxrlGate,
    *,
    nights: int,
    proposals: int,
    tasks: int = 40,
    repeats: int = 1,
    effect: float = 0.0,
    cost_effect: float = 0.0,
    base_low: float = 0.2,
    base_high: float = 0.8,
    seed: int = 0,
) -> SimResult:
    """Simulate ``nights`` nights of ``proposals`` proposals each through ``rule`` (``"reference"`` or a
    :class:`CtxrlGate`), deterministically from ``seed``.

    Model: each night draws ``tasks`` dev tasks with incumbent success probability ``p_i`` uniform in
    [``base_low``, ``base_high``]; every proposal's candidate succeeds with ``min(1, p_i + effect)``. Each of
    ``repeats`` episodes per task and skill is an independent binary outcome (no shared seeds, the hardest case
    for a paired test); episode cost is ``base cost_i × lognormal(0, 0.3)``, the candidate's times
    ``1 − cost_effect``, with base cost_i uniform in [1000, 5000]. ``effect = cost_effect = 0`` is the null:
    every accept is a false accept. The incumbent stays fixed over the night (under the null nothing better
    exists to switch to).
    """
    import numpy as np  # the simulation only; the gate itself needs nothing but the standard library

    if isinstance(rule, str) and rule != "reference":
        raise GateError(f"rule must be 'reference' or a CtxrlGate, not {rule!r}")
    name = "reference" if rule == "reference" else "ctxrl"
    rng = np.random.default_rng(seed)
    ids = tuple(map(str, range(tasks)))
    nights_with_accept = accepts = first_accepts = 0
    tasks_run = 0
    for _ in range(nights):
        p = rng.uniform(base_low, base_high, size=tasks)
        q = np.minimum(1.0, p + effect)
        base_cost = rng.uniform(1000, 5000, size=tasks)
        shape = (proposals, tasks, repeats)
        inc = (rng.random(shape) < p[None, :, None]).mean(axis=2)
        cand = (rng.random(shape) < q[None, :, None]).mean(axis=2)
        inc_cost = base_cost * np.exp(rng.normal(0.0, 0.3, shape)).mean(axis=2)
        cand_cost = base_cost * (1 - cost_effect) * np.exp(rng.normal(0.0, 0.3, shape)).mean(axis=2)
        any_accept = False
        for k in range(1, proposals + 1):
            row = k - 1
            paired = Paired(
                ids,
                tuple(cand[row].tolist()),
                tuple(inc[row].tolist()),
                tuple(cand_cost[row].tolist()),
                tuple(inc_cost[row].tolist()),
            )
            decision = (
                reference_rule(paired) if isinstance(rule, str) else rule.run(paired, k=k, repeats=repeats)
            )
            tasks_run += decision.n_tasks
            if decision.accept:
                accepts += 1
                any_accept = True
                first_accepts += k == 1
        nights_with_accept += any_accept
    total = nights * proposals
    return SimResult(
        rule=name,
        nights=nights,
        proposals=proposals,
        night_accept_rate=nights_with_accept / nights,
        proposal_accept_rate=accepts / total,
        first_accept_rate=first_accepts / nights,
        mean_tasks=tasks_run / total,
        saved_fraction=1 - tasks_run / (total * tasks),
    )
