"""Measure the evolution gate's false-accept rate and power by simulation; prints a markdown table.

    PYTHONPATH=src python scripts/gate_simulation.py            # the table in docs/evolve_gate.md
    PYTHONPATH=src python scripts/gate_simulation.py --quick    # fewer nights, for a look in a minute

Every row is :func:`ctxrl.evolve.gate.simulate_gate` with the settings it names (seeded, deterministic).
"""

from __future__ import annotations

import argparse

from ctxrl.evolve.gate import CtxrlGate, simulate_gate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the nights")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    rules: dict[str, str | CtxrlGate] = {
        "reference (d > SE, or abs(d) ≤ SE and cheaper)": "reference",
        "ctxrl, basel spending": CtxrlGate(),
        "ctxrl, uniform spending K=100": CtxrlGate(spending="uniform", planned_proposals=100),
    }
    settings = [
        ("null", dict(effect=0.0, tasks=40, repeats=1, proposals=100, nights=1000)),
        ("null", dict(effect=0.0, tasks=40, repeats=1, proposals=1000, nights=200)),
        ("+15 points", dict(effect=0.15, tasks=40, repeats=1, proposals=100, nights=200)),
        ("+15 points", dict(effect=0.15, tasks=40, repeats=4, proposals=100, nights=200)),
        ("+15 points", dict(effect=0.15, tasks=100, repeats=1, proposals=100, nights=200)),
    ]
    print(
        "| truth | tasks × repeats | proposals/night | nights | rule | nights with an accept | "
        "proposals accepted | k=1 accepted | dev tasks run/proposal | episodes saved |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for truth, setting in settings:
        for label, rule in rules.items():
            if isinstance(rule, CtxrlGate) and rule.spending == "uniform" and setting["proposals"] > 100:
                continue  # uniform spending is planned for K=100 proposals
            kw = dict(setting)
            kw["nights"] = max(1, int(kw["nights"]) // scale)
            r = simulate_gate(rule, seed=args.seed, **kw)  # type: ignore[arg-type]
            print(
                f"| {truth} | {kw['tasks']} × {kw['repeats']} | {kw['proposals']} | {kw['nights']} | {label} | "
                f"{r.night_accept_rate:.3f} | {r.proposal_accept_rate:.4f} | {r.first_accept_rate:.3f} | "
                f"{r.mean_tasks:.1f} | {r.saved_fraction:.0%} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
