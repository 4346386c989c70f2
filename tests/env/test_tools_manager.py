"""The scripted tools-manager on a real task: it acts on the prompt text alone, every handle it passes is shown
in that text, the mid-episode offer never rebuilds the prompt, and the task is solved.

``board`` rather than ``research``: under seed 000's defaults (no readout, no rollback; the pressure pass
underneath) the manager solves board but not research (docs/eval_test_split.md says why)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctxrl.env.actions import parse_tool_calls
from ctxrl.env.episode import PromptBuilder, TaskEpisode
from ctxrl.env.modes.tools import OFFER_HEADER
from ctxrl.env.policies import make_policy
from ctxrl.env.tasks.registry import make_task

SEED = 110_000


def test_the_tools_manager_solves_a_task_with_handles_it_can_see(tiny_tokenizer: Any, tmp_path: Path) -> None:
    builder = PromptBuilder(tiny_tokenizer)
    episode = TaskEpisode(make_task("board", SEED, split="test"), "tools", builder, workspace=tmp_path / "ws")
    episode.reset()
    policy = make_policy("tools-manager")
    drops, reasons = 0, []
    try:
        while not episode.done:
            prompt = builder.decode(episode.prompt_ids)  # exactly what a model is given, nothing else
            text = policy(prompt)
            for call in parse_tool_calls(text)[1]:
                if call.name in ("context_drop", "context_note", "context_pin"):
                    drops += 1
                    assert OFFER_HEADER in prompt  # offered by the note the prompt shows
                    for handle in json.loads(call.arguments)["handles"]:
                        assert f"[{handle}]\n" in prompt, handle  # the result's own first line
            episode.step(builder.action_ids(text))
            reasons.append(episode.rebuild_reason)  # why the next prompt was rebuilt, if it was
        verdict = episode.finish()
    finally:
        episode.teardown()
    assert drops >= 3 and verdict.success
    assert "history" not in reasons  # the offer appended a note; it did not rewrite the prompt's history
    assert "context_drop" not in [t["function"]["name"] for t in episode.tools]  # nor the tool list


def test_the_tools_manager_restates_its_facts_after_a_compaction(tiny_tokenizer: Any, tmp_path: Path) -> None:
    """Once it has facts, every later action carries them: the pressure pass may fold the message that held
    them (retention `short` tasks lost their kept values that way: 7 of 32 solved, 14 with the restatement)."""
    from ctxrl.env.policies.view import FACTS_HEADER

    builder = PromptBuilder(tiny_tokenizer)
    task = make_task("retention", 100_001, "small", split="dev")
    episode = TaskEpisode(task, "tools", builder, workspace=tmp_path / "ws")
    episode.reset()
    policy = make_policy("tools-manager")
    texts = []
    try:
        while not episode.done:
            texts.append(policy(builder.decode(episode.prompt_ids)))
            episode.step(builder.action_ids(texts[-1]))
        verdict = episode.finish()
    finally:
        episode.teardown()
    first = next(i for i, t in enumerate(texts) if FACTS_HEADER in t)
    later = [t for t in texts[first + 1 :] if '"submit"' not in t]
    assert later and all(FACTS_HEADER in t for t in later)
    assert verdict.success
