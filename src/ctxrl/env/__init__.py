"""The harness around the model's editable context, its action modes, the sandbox and the task suite.

Importing this package registers one Gymnasium id per built-in task family, ``ctxrl/<Family>-v0``, so the
documented usage works as it reads::

    import gymnasium, ctxrl.env
    env = gymnasium.make("ctxrl/Retention-v0", mode="file")

The ids point at :class:`ctxrl.env.gym_env.ContextEnv` by name: nothing of the harness is imported until an
environment is made.
"""

from __future__ import annotations

from collections.abc import Sequence


def register_envs(families: Sequence[str] | None = None) -> list[str]:
    """Register ``ctxrl/<Family>-v0`` for every built-in family (idempotent); return the ids."""
    import gymnasium as gym

    from ctxrl.env.tasks.registry import FAMILIES

    ids = []
    for family in families or FAMILIES:
        env_id = f"ctxrl/{family.capitalize()}-v0"
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point="ctxrl.env.gym_env:ContextEnv", kwargs={"family": family})
        ids.append(env_id)
    return ids


register_envs()
