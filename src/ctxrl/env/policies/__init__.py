"""Scripted reference policies: the baselines of every comparison and the teachers of a supervised warm start.

    policy = make_policy("file-manager")   # its mode: POLICY_MODES["file-manager"] == "file"
    obs, info = env.reset(seed=0)
    text = policy(obs)                     # generated text, tool calls in the chat-template format
    env.step(text)

A policy is a stateless function of the prompt text a model would see (:mod:`.view` parses it): what it
knows is what its context holds, and nothing else reaches it, so what it does can be recorded as token-in /
token-out demonstrations (the ``scripted`` engine runs it behind the engine protocol). It is a **solver** of the task family in view (:mod:`.solvers`: the next task action and the
facts worth keeping) under the **manager** of its mode (:mod:`.managers`: when and how to compact).
Policies never read a task's metadata or verifier. The managers take their compaction threshold from the skill
text in the system prompt (:mod:`.managers`), so a rewritten skill changes what they do.

The policies and their modes are the mode registry's (:data:`ctxrl.env.modes.MODES`, ``ModeSpec.policy``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

from ctxrl.env.modes import MODES
from ctxrl.env.policies import managers
from ctxrl.env.policies.solvers import SOLVERS, solver_for
from ctxrl.env.policies.view import Call, Plan, View, parse_prompt, read_prompt, read_view, render_action
from ctxrl.errors import UsageError


class Policy(Protocol):
    """``policy(prompt_text) -> generated text``: one action for the prompt a model would be given."""

    def __call__(self, prompt: str) -> str: ...


POLICY_MODES: dict[str, str] = {spec.policy: spec.name for spec in MODES.values()}
"""Policy name -> the mode it acts in (from the mode registry)."""


@dataclass(frozen=True)
class ScriptedPolicy:
    """A family solver under a mode's manager (see the module docstring)."""

    name: str
    mode: str
    manager: managers.Manager
    jitter: float = 0.0
    """Half-width of a random shift of the skill's compaction threshold, drawn once per episode (0: none, the
    policy is deterministic). It stands in for a sampled model's variation, so repeats of a task can differ;
    the draw is a hash of ``seed`` and the task text, so it is the same whatever batch the episode runs in."""
    seed: int = 0
    """Seed of the jitter's draws (policies with different seeds draw independently)."""

    def threshold(self, view: View) -> float:
        """The compaction threshold this policy uses for the episode in view: the skill's, plus the jitter."""
        base = managers.threshold(view)
        if not self.jitter:
            return base
        digest = hashlib.sha256(f"{self.seed}\n{view.task}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2**64
        return base + self.jitter * (2 * u - 1)

    def __call__(self, prompt: str) -> str:
        view = read_prompt(prompt)
        solver = solver_for(view)
        if solver is None:
            raise UsageError(
                f"scripted policy {self.name!r} knows only the built-in families ({', '.join(SOLVERS)}); "
                f"the task in view offers the tools {', '.join(sorted(view.tools))}"
            )
        return self.manager(view, solver(view), self.threshold(view))


def make_policy(name: str, *, jitter: float = 0.0, seed: int = 0) -> ScriptedPolicy:
    """The scripted policy called ``name`` (one of :data:`POLICY_MODES`); ``jitter`` and ``seed`` as in
    :class:`ScriptedPolicy`."""
    if name not in POLICY_MODES:
        raise UsageError(f"unknown scripted policy {name!r}; policies: {', '.join(POLICY_MODES)}")
    if not 0.0 <= jitter < 1.0:
        raise UsageError(f"the policy's jitter must be in [0, 1), got {jitter}")
    mode = POLICY_MODES[name]
    manager: managers.Manager = getattr(managers, mode)  # each manager is named after its mode
    return ScriptedPolicy(name, mode, manager, jitter, seed)


__all__ = [
    "POLICY_MODES",
    "Call",
    "Plan",
    "Policy",
    "ScriptedPolicy",
    "View",
    "make_policy",
    "parse_prompt",
    "read_prompt",
    "read_view",
    "render_action",
]
