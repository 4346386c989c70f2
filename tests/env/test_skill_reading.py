"""The scripted managers take their compaction threshold from the skill text in the system prompt they see."""

from __future__ import annotations

from typing import Any

import pytest

from ctxrl.env import skills
from ctxrl.env.modes import MODES
from ctxrl.env.policies import make_policy, managers
from ctxrl.env.policies.view import Call, Plan, View, read_view
from ctxrl.env.skills import FILE_SKILL, system_prompt

SHELL = [{"type": "function", "function": {"name": "shell", "description": "run a command"}}]
PLAN = Plan((Call("run_tests"),), ("fact one",))


def _view(skill: str, used: int, task: str = "Find the value.") -> View:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt(skill)},
        {"role": "user", "content": task},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"name": "shell", "arguments": {}}}]},
        {"role": "tool", "content": f"ok\n[context: {used}/1000 tokens ({used // 10}% of the limit)]", "tool_call_id": "c1"},
    ]  # fmt: skip
    return read_view(messages, SHELL)


def _compacts(action: str) -> bool:
    return "cat > context.md <<'EOF'" in action


def test_the_threshold_sentence_moves_when_the_file_manager_compacts() -> None:
    def with_n(n: int) -> str:
        return FILE_SKILL + f"\nCompact when the context reaches {n}% of the limit."

    # no sentence (the default skill): 60 %
    assert managers.threshold(_view(FILE_SKILL, 700)) == 0.6
    assert _compacts(managers.file(_view(FILE_SKILL, 700), PLAN))
    assert not _compacts(managers.file(_view(FILE_SKILL, 590), PLAN))
    # 80 %: 70 % full is not yet due, 80 % is
    assert managers.threshold(_view(with_n(80), 700)) == 0.8
    assert not _compacts(managers.file(_view(with_n(80), 700), PLAN))
    assert _compacts(managers.file(_view(with_n(80), 800), PLAN))
    # 45 %: due already at half full
    assert _compacts(managers.file(_view(with_n(45), 500), PLAN))
    assert not _compacts(managers.file(_view(with_n(45), 440), PLAN))


def test_the_default_skills_keep_the_default_threshold() -> None:
    for spec in MODES.values():
        assert managers.threshold(_view(spec.skill, 100)) == managers.THRESHOLD == 0.6


def test_jitter_is_per_episode_and_the_same_for_every_skill() -> None:
    skill80 = FILE_SKILL + "\nCompact when the context reaches 80% of the limit."
    tasks = [f"Task number {i}." for i in range(20)]
    a, b = make_policy("file-manager", jitter=0.05, seed=0), make_policy("file-manager", jitter=0.05, seed=1)
    shifts = [a.threshold(_view(skill80, 100, t)) - 0.8 for t in tasks]
    assert all(-0.05 <= s <= 0.05 for s in shifts) and len(set(shifts)) == 20
    # common random numbers: another skill on the same task and seed gets the same shift
    assert [a.threshold(_view(FILE_SKILL, 100, t)) - 0.6 for t in tasks] == pytest.approx(shifts, abs=1e-12)
    assert [b.threshold(_view(skill80, 100, t)) - 0.8 for t in tasks] != shifts
    assert make_policy("file-manager").threshold(_view(skill80, 100)) == 0.8  # no jitter: the skill's


def test_a_skill_with_a_later_threshold_compacts_later_in_a_real_episode() -> None:
    from ctxrl.env.tasks.registry import make_task
    from ctxrl.env.tokenizer import load_tokenizer
    from ctxrl.train.engines.base import SamplingConfig
    from ctxrl.train.engines.scripted import ScriptedEngine, text_policy
    from ctxrl.train.rollout import RolloutConfig, rollout

    tokenizer = load_tokenizer(None)
    engine = ScriptedEngine(text_policy(make_policy("file-manager"), tokenizer), tokenizer)
    task = make_task("retention", 0, "easy")
    late = FILE_SKILL + "\nCompact when the context reaches 85% of the limit."
    result = rollout(
        engine, tokenizer, [task, task], RolloutConfig(group_size=1, mode="file", workers=2),
        sampling=SamplingConfig(max_new_tokens=8192), skills=[FILE_SKILL, late],
    )  # fmt: skip
    default, later = result.episodes
    first_edit = [next(i for i, s in enumerate(ep.steps) if s.edit_calls) for ep in (default, later)]
    peak = [max(s.context_tokens for s in ep.steps[: first_edit[j]]) for j, ep in enumerate((default, later))]
    assert first_edit[0] < first_edit[1]
    assert peak[0] < peak[1]  # the later skill let the context grow further before compacting


@pytest.mark.parametrize(
    ("skill", "means"),
    [(skills.FILE_SKILL, "edit"), (skills.TOOLS_SKILL, "context_note"), (skills.USAGE_SKILL, "archiv")],
)
def test_every_managing_skill_states_the_three_cost_rules(skill: str, means: str) -> None:
    rules = [line for line in skill.splitlines() if line.startswith("- ")]
    assert rules[0].startswith("- Batch")
    assert any(r.startswith("- Mind the tail") for r in rules)
    assert any(r.startswith("- Be generous") for r in rules)
    assert all("re-read" in r or "read" in r for r in rules) and means in skill
