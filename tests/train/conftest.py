"""Hand-built episode records for the trainer's unit tests (no environment, no engine).

Tests get the builders through the ``records`` fixture (test modules cannot import each other here).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import pytest

from ctxrl.train.trajectory import EpisodeRecord, StepCost, StepRecord


def step(
    prompt: Sequence[int],
    generated: Sequence[int],
    *,
    source: str = "extend",
    logprobs: Sequence[float] | None = None,
    edit: Sequence[int] | None = None,
    calls: Sequence[str] = ("bash",),
) -> StepRecord:
    n = len(generated)
    return StepRecord(
        prompt_ids=list(prompt),
        token_ids=list(generated),
        logprobs=list(logprobs) if logprobs is not None else [-0.5] * n,
        edit_mask=list(edit) if edit is not None else [0] * n,
        finish_reason="stop",
        num_cached_tokens=0,
        prompt_source=source,
        rebuild_reason="edit" if source == "rebuild" else None,
        text="",
        tool_calls=list(calls),
        edit_calls=[],
        receipts=[],
        receipt_kinds=[],
        readout="",
        nudges=[],
        context_tokens=len(prompt) + n,
        edited=False,
        free_turn=False,
        cost=StepCost(prompt_tokens=len(prompt), cached_tokens=0, generated_tokens=n, flops=None),
    )


def episode(
    steps: Sequence[StepRecord],
    *,
    group: int = 0,
    index: int = 0,
    success: bool = True,
    score: float | None = None,
    cost: float = 100.0,
    end_reason: str = "submit",
) -> EpisodeRecord:
    return EpisodeRecord(
        task_id=f"t{group}",
        family="retention",
        split="train",
        seed=group,
        difficulty="easy",
        mode="file",
        skill_id="0" * 16,
        group=group,
        index=index,
        engine="scripted",
        success=success,
        score=(1.0 if success else 0.0) if score is None else score,
        reward=1.0 if success else 0.0,
        end_reason=end_reason,
        answer=None,
        verdict="",
        cost_tokens=cost,
        cost_flops=None,
        steps=list(steps),
    )


def append_only(n_steps: int, first_prompt: int = 10, gen: int = 3, obs: int = 4) -> EpisodeRecord:
    """An episode of ``n_steps`` steps, each prompt = previous prompt + generated + ``obs`` new ids."""
    steps = []
    prompt = list(range(first_prompt))
    next_id = 1000
    for k in range(n_steps):
        generated = list(range(next_id, next_id + gen))
        next_id += gen
        steps.append(step(prompt, generated, source="reset" if k == 0 else "extend"))
        prompt = [*prompt, *generated, *range(5000 + k * obs, 5000 + (k + 1) * obs)]
    return episode(steps)


@pytest.fixture
def records() -> SimpleNamespace:
    """The builders: ``records.step``, ``records.episode``, ``records.append_only``."""
    return SimpleNamespace(step=step, episode=episode, append_only=append_only)
