"""Scripted reference policies: the baselines of every comparison and the teachers of a supervised warm start.

    policy = make_policy("file-manager")          # its mode: POLICY_MODES["file-manager"] == "file"
    text = policy(info["messages"], info["tools"])  # generated text, tool calls in the chat-template format
    env.step(text)

A policy is a stateless function of the prompt a model would see (:mod:`.view`): what it knows is what its
context holds. It is a **solver** of the task family in view (:mod:`.solvers`: the next task action and the
facts worth keeping) under the **manager** of its mode (:mod:`.managers`: when and how to compact).
Policies never read a task's metadata or verifier.

| policy | mode |
|---|---|
| ``append`` | ``append`` |
| ``harness`` | ``harness`` |
| ``tools-manager`` | ``tools`` |
| ``usage-manager`` | ``usage`` |
| ``file-manager`` | ``file`` |
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ctxrl.env.policies import managers
from ctxrl.env.policies.solvers import SOLVERS, solver_for
from ctxrl.env.policies.view import Call, Plan, View, read_view, render_action
from ctxrl.errors import UsageError

Messages = Sequence[Mapping[str, Any]]
Tools = Sequence[Mapping[str, Any]]


class Policy(Protocol):
    """``policy(messages, tools) -> generated text``: one action for the prompt made of these."""

    def __call__(self, messages: Messages, tools: Tools) -> str: ...


POLICY_MODES: dict[str, str] = {
    "append": "append",
    "harness": "harness",
    "tools-manager": "tools",
    "usage-manager": "usage",
    "file-manager": "file",
}
"""Policy name -> the mode it acts in."""

_MANAGERS: dict[str, managers.Manager] = {
    "append": managers.append,
    "harness": managers.harness,
    "tools-manager": managers.tools_manager,
    "usage-manager": managers.usage_manager,
    "file-manager": managers.file_manager,
}


@dataclass(frozen=True)
class ScriptedPolicy:
    """A family solver under a mode's manager (see the module docstring)."""

    name: str
    mode: str
    manager: managers.Manager

    def __call__(self, messages: Messages, tools: Tools) -> str:
        view = read_view(messages, tools)
        solver = solver_for(view)
        if solver is None:
            raise UsageError(
                f"scripted policy {self.name!r} knows only the built-in families ({', '.join(SOLVERS)}); "
                f"the task in view offers the tools {', '.join(sorted(view.tools))}"
            )
        return self.manager(view, solver(view))


def make_policy(name: str) -> ScriptedPolicy:
    """The scripted policy called ``name`` (one of :data:`POLICY_MODES`)."""
    if name not in POLICY_MODES:
        raise UsageError(f"unknown scripted policy {name!r}; policies: {', '.join(POLICY_MODES)}")
    return ScriptedPolicy(name, POLICY_MODES[name], _MANAGERS[name])


__all__ = [
    "POLICY_MODES",
    "Call",
    "Plan",
    "Policy",
    "ScriptedPolicy",
    "View",
    "make_policy",
    "read_view",
    "render_action",
]
