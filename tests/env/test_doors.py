"""The toy family of the golden learning tests: a toy by name only, and a teacher whose two ``detour``
strategies both succeed at different prefix-reuse cost."""

from __future__ import annotations

from typing import Any

import pytest

from ctxrl.commands.config import TasksConfig
from ctxrl.env.tasks.doors import DOORS, OPEN_DOOR, demonstrator, generate
from ctxrl.env.tasks.registry import FAMILIES, KNOWN_FAMILIES, BuiltinTaskSource, make_task
from ctxrl.env.tasks.splits import split_seeds
from ctxrl.errors import ConfigError, TaskError
from ctxrl.train.engines.scripted import ScriptedEngine, text_policy
from ctxrl.train.rollout import RolloutConfig, rollout


def test_doors_is_made_by_name_but_is_not_one_of_all_families() -> None:
    assert "doors" in KNOWN_FAMILIES and "doors" not in FAMILIES
    assert "doors" not in BuiltinTaskSource().families
    assert make_task("doors", 3, "bandit").task_id == "doors:bandit:3"
    assert TasksConfig(families=("doors",), difficulty="detour").families == ("doors",)
    with pytest.raises(ConfigError, match="exists only for doors"):
        TasksConfig(families=("retention",), difficulty="detour")
    with pytest.raises(TaskError, match="known: bandit, detour"):
        generate(0, "easy")


def test_the_answer_is_in_the_verifier_never_in_the_bandit_prompt() -> None:
    for seed in range(20):
        task = generate(seed, "bandit")
        assert task.verifier.expected == OPEN_DOOR and task.verifier.verify(OPEN_DOOR).success
        listed = task.prompt.splitlines()[1].removeprefix("Doors: ").split(", ")
        assert sorted(listed) == sorted(DOORS)  # all eight, so the prompt does not single the open one out
    orders = {generate(seed, "bandit").prompt.splitlines()[1] for seed in range(20)}
    assert len(orders) > 10


def _teacher_run(tokenizer: Any, level: str, n: int) -> list[Any]:
    teacher = ScriptedEngine(text_policy(demonstrator, tokenizer), tokenizer)
    tasks = [make_task("doors", s, level) for s in split_seeds("train", n)]
    return rollout(teacher, tokenizer, tasks, RolloutConfig(group_size=1, mode="file")).episodes


def test_the_bandit_teacher_picks_at_random(tiny_tokenizer: Any) -> None:
    episodes = _teacher_run(tiny_tokenizer, "bandit", 64)
    answers = {ep.answer for ep in episodes}
    assert answers <= set(DOORS) and len(answers) >= 6
    assert 0.02 <= sum(ep.success for ep in episodes) / len(episodes) <= 0.3  # ~1/8


def test_detour_strategies_both_succeed_and_the_edit_costs_more(tiny_tokenizer: Any) -> None:
    episodes = _teacher_run(tiny_tokenizer, "detour", 32)
    assert all(ep.success and len(ep.steps) == 2 for ep in episodes)
    edited = [ep for ep in episodes if ep.steps[0].edited]
    plain = [ep for ep in episodes if not ep.steps[0].edited]
    assert edited and plain  # both strategies, by the teacher's hash
    for ep in edited:  # the note is an edit: applied, its call on the edit mask, the next prompt rebuilt
        assert ep.steps[0].receipt_kinds and sum(ep.steps[0].edit_mask) > 0
        assert ep.steps[1].prompt_source == "rebuild"
    for ep in plain:
        assert sum(ep.steps[0].edit_mask) == 0 and ep.steps[1].prompt_source == "extend"
    assert min(ep.cost_tokens for ep in edited) > max(ep.cost_tokens for ep in plain)
