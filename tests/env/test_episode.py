"""The episode factory: edit credit only for calls that changed the context, events kept per step, and the
prompt ids of an append-only stretch extending each other exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctxrl.env.episode import PromptBuilder, TaskEpisode
from ctxrl.env.tasks.registry import make_task


def _shell(command: str) -> str:
    return "<tool_call>" + json.dumps({"name": "shell", "arguments": {"command": command}}) + "</tool_call>"


def test_only_applied_edits_are_edit_calls(tiny_tokenizer: Any, tmp_path: Path) -> None:
    builder = PromptBuilder(tiny_tokenizer)
    episode = TaskEpisode(make_task("retention", 3, "easy"), "file", builder, workspace=tmp_path / "ep")
    episode.reset()

    def act(text: str) -> Any:
        return episode.step(builder.action_ids(text))

    read = act(_shell("cat context.md > /dev/null"))  # names the file, changes nothing
    assert [r.kind for r in read.result.receipts] == ["matched_nothing"] and read.edit_calls == []
    huge = act(_shell("python3 -c \"print('word ' * 60000)\" >> context.md"))  # over the limit: rejected
    assert [r.kind for r in huge.result.receipts] == ["rejected"] and huge.edit_calls == []
    malformed = act("<tool_call>{not json</tool_call>")  # a format receipt is not an edit
    assert malformed.edit_calls == []
    note = "[[CTX_TURN 1 role=user]]\nkept: nothing yet"
    both = act(_shell(f"cat > context.md <<'EOF'\n{note}\nEOF") + _shell("ls"))
    assert [r.kind for r in both.result.receipts] == ["applied"] and both.edit_calls == [0]
    assert both.result.edited and episode.prompt_source == "rebuild" and episode.rebuild_reason == "edit"
    episode.teardown()
    assert not (tmp_path / "ep").exists()


def test_append_only_steps_extend_the_prompt_ids_exactly(tiny_tokenizer: Any, tmp_path: Path) -> None:
    builder = PromptBuilder(tiny_tokenizer)
    episode = TaskEpisode(make_task("retention", 3, "easy"), "file", builder, workspace=tmp_path / "ep")
    episode.reset()
    before = list(episode.prompt_ids)
    generated = builder.action_ids(_shell("ls"))
    episode.step(generated)
    assert episode.prompt_source == "extend"
    assert episode.prompt_ids[: len(before) + len(generated)] == before + generated
    # and the extended ids are what rendering the messages whole gives
    assert episode.prompt_ids == builder.full(episode.messages, episode.tools)
    episode.teardown()
