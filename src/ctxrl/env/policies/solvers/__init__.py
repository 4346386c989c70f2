"""One solver per task family: ``solve(view) -> Plan`` (the next task action and the facts worth keeping).

A solver knows only what is in view, and it is mode-agnostic: managing the context is the manager's job
(:mod:`ctxrl.env.policies.managers`). :func:`solver_for` picks the solver from the task tools on offer, which
is what a model would go by too.
"""

from __future__ import annotations

from collections.abc import Callable

from ctxrl.env.policies.solvers import board, offload, repo, research, retention
from ctxrl.env.policies.view import Plan, View

Solver = Callable[[View], Plan]

SOLVERS: dict[str, Solver] = {
    "retention": retention.solve,
    "board": board.solve,
    "offload": offload.solve,
    "repo": repo.solve,
    "research": research.solve,
}
"""Family name -> solver."""

_SIGNATURE_TOOLS = {
    "next_chunk": "retention",
    "next_events": "board",
    "open_report": "offload",
    "run_tests": "repo",
    "search": "research",
}


def family_of(view: View) -> str | None:
    """The built-in family whose task tools are on offer, or None."""
    return next((family for tool, family in _SIGNATURE_TOOLS.items() if tool in view.tools), None)


def solver_for(view: View) -> Solver | None:
    """The solver of the task in view, or None for a task no solver knows."""
    family = family_of(view)
    return SOLVERS[family] if family is not None else None
