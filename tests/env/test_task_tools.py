"""Task tools in an episode: document reads are usage-mode file views (issue 11, item 8), the repo family binds
through a paged specification (item 12), and harness tools reach the context whole while workspace tools may
be filtered (item 13)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ctxrl.env.config import HarnessConfig
from ctxrl.env.episode import HARNESS_TOOL, PromptBuilder, TaskEpisode, episode_config
from ctxrl.env.mode_config import ModesConfig, UsageModeConfig
from ctxrl.env.policies import read_prompt
from ctxrl.env.policies.managers import open_views
from ctxrl.env.policies.solvers import repo as repo_solver
from ctxrl.env.tasks import make_task, private_root


def _call(tool: str, /, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": tool, "arguments": arguments}) + "</tool_call>"


def _episode(family: str, mode: str, builder: PromptBuilder, tmp_path: Path, **usage: Any) -> TaskEpisode:
    task = make_task(family, 5, "easy")
    base = HarnessConfig(modes=ModesConfig(usage=UsageModeConfig(**usage)))
    config = episode_config(task, builder.count, base)
    episode = TaskEpisode(task, mode, builder, workspace=tmp_path / "ep", config=config)
    episode.reset()
    return episode


def _last_tool_text(episode: TaskEpisode) -> str:
    """The latest tool result as shown, less tools mode's ``[r<round>.<i>]`` handle line and the budget readout
    and nudges the harness may append."""
    text = next(m["content"] for m in reversed(episode.live.context.to_messages()) if m["role"] == "tool")
    return re.sub(r"\A\[r\d+\.\d+\]\n", "", text).split("\n[context", 1)[0]


def _act(episode: TaskEpisode, builder: PromptBuilder, text: str) -> Any:
    return episode.step(builder.action_ids(text))


# --- item 8: document reads are file views ---------------------------------------------------------------


def test_a_report_read_is_a_file_view_listed_and_evicted_by_its_path(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    builder = PromptBuilder(tiny_tokenizer)
    episode = _episode("offload", "usage", builder, tmp_path, threshold_pct=0.0)
    site = episode.task.metadata["targets"][0]["report"].split("/")[1].removesuffix(".txt")
    _act(episode, builder, _call("open_report", name=site))
    shown = _last_tool_text(episode)
    header, _, body = shown.partition("----\n")
    assert header.startswith("Turn #1\n")
    assert body.startswith(f"File view: reports/{site}.txt\nMAINTENANCE REPORT - site {site.upper()}\n")
    # A failed read is no view: no head line, nothing listed.
    _act(episode, builder, _call("open_report", name="atlantis"))
    assert _last_tool_text(episode).split("----\n", 1)[1].startswith("error: no report 'atlantis'")
    # The model sees the handle twice in its prompt: on the result and under Top File Views.
    prompt = episode.prompt_text()
    assert f"- Top File Views:\n  - `reports/{site}.txt`: " in prompt
    assert open_views(read_prompt(prompt)) == [f"reports/{site}.txt"]
    step = _act(episode, builder, _call("evict_file_view", path=f"reports/{site}.txt"))
    (receipt,) = step.result.receipts
    assert receipt.kind == "applied" and f"evicted 1 view(s) of reports/{site}.txt" in receipt.text
    assert step.edit_calls == [0]
    tool_texts = [m["content"] for m in episode.live.context.to_messages() if m["role"] == "tool"]
    stubs = [t for t in tool_texts if t.startswith("[file view evicted")]
    assert stubs == [
        f"[file view evicted: reports/{site}.txt; the file is unchanged, read it again with open_report]"
    ]
    assert "Top File Views" not in episode.prompt_text()
    episode.teardown()
    assert not (tmp_path / "ep").exists() and not private_root(tmp_path / "ep").exists()


def test_a_stream_part_is_no_file_view(tiny_tokenizer: Any, tmp_path: Path) -> None:
    """A consumed stream part cannot be read again, so it is Tool Output, never offered for eviction."""
    builder = PromptBuilder(tiny_tokenizer)
    episode = _episode("retention", "usage", builder, tmp_path, threshold_pct=0.0)
    _act(episode, builder, _call("next_chunk"))
    assert _last_tool_text(episode).split("----\n", 1)[1].startswith("=== registry log, part 1/10 ===")
    assert "File Views" not in episode.prompt_text()
    episode.teardown()


# --- item 12: repo needs the whole specification -----------------------------------------------------------


def test_repo_fix_follows_the_latest_statement_of_the_spec() -> None:
    source = (
        "def clamp_scale_tokens(x):\n"
        '    """x scaled by 6 and shifted by 19, clamped to [0, 238].\n    """\n'
        "    return max(0, min(238, x * 6 + 19))\n"
    )
    assert repo_solver.find_fix("clamp_scale_tokens", source) is None  # code and docstring agree
    contract = "x scaled by 6 and shifted by 17, clamped to [0, 238]."
    assert repo_solver.find_fix("clamp_scale_tokens", source, contract) == (
        "    return max(0, min(238, x * 6 + 19))",
        "    return max(0, min(238, x * 6 + 17))",
    )


def test_repo_spec_states_the_outdated_contract_early_and_the_one_in_force_late() -> None:
    task = make_task("repo", 3)
    meta = task.metadata
    pages = json.loads(task.private_files[".task/spec.json"])
    assert len(pages) == 14 and not any(p.startswith(".task") for p in task.files)
    name = meta["bug_function"]
    entry = [i for i, p in enumerate(pages, 1) if f"`{name}` ({meta['bug_file'].split('/')[-1][:-3]}):" in p]
    restated = [i for i, p in enumerate(pages, 1) if f"`{name}` is restated: {meta['contract']}" in p]
    assert len(entry) == 1 and entry[0] <= 9 and f": {meta['outdated_contract']}" in pages[entry[0] - 1]
    assert len(restated) == 1 and restated[0] >= 11  # on one of the last pages: the whole spec must be read
    assert meta["outdated_contract"] != meta["contract"]
    assert pages[-1].endswith("(end of the specification)")


# --- item 13: harness tools reach the context whole; workspace tools may be filtered -----------------------


def test_a_harness_tool_cannot_be_filtered_from_the_shell(tiny_tokenizer: Any, tmp_path: Path) -> None:
    builder = PromptBuilder(tiny_tokenizer)
    episode = _episode("retention", "tools", builder, tmp_path)
    _act(episode, builder, _call("shell", command="tools/next_chunk | grep registry"))
    assert _last_tool_text(episode) == HARNESS_TOOL.format(command="tools/next_chunk", name="next_chunk")
    # Nothing of the stream is in the workspace to grep around the tool.
    look = "test -e tools && echo tools; test -e .task && echo data; grep -rl 'registry log' . | wc -l"
    _act(episode, builder, _call("shell", command=look))
    assert _last_tool_text(episode) == "0"
    # The refused command consumed nothing: the function call gets part 1, whole.
    _act(episode, builder, _call("next_chunk"))
    part = _last_tool_text(episode)
    assert part.startswith("=== registry log, part 1/10 ===\n") and len(part.splitlines()) == 1 + 14
    episode.teardown()


def test_a_workspace_tool_and_workspace_files_may_be_filtered(tiny_tokenizer: Any, tmp_path: Path) -> None:
    builder = PromptBuilder(tiny_tokenizer)
    episode = _episode("repo", "tools", builder, tmp_path)
    _act(episode, builder, _call("shell", command="tools/run_tests 2>&1 | tail -n 1"))
    assert _last_tool_text(episode) == "FAILED (failures=1)"
    episode.teardown()
    offload = _episode("offload", "tools", builder, tmp_path)
    site = offload.task.metadata["targets"][0]["report"]
    _act(offload, builder, _call("shell", command=f"grep -c '^unit ' {site}"))
    assert _last_tool_text(offload) == "50"  # easy: 50 unit lines per report
    offload.teardown()
