"""The task suite: determinism, splits, tools in a real sandbox, oracle answers, sizes, export and loading."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ctxrl.env.sandbox import Sandbox, SandboxConfig
from ctxrl.env.tasks import (
    FAMILIES,
    SPLIT_RANGES,
    BuiltinTaskSource,
    FileTaskSource,
    Task,
    TaskSource,
    ToolSpec,
    from_dataset_row,
    load_tasks,
    make_task,
    split_of,
    split_seeds,
    to_dataset,
)
from ctxrl.errors import SandboxError, TaskError

# Fingerprints of the default generation at the first train and first test seed. A change here means every
# dataset built from these families changes: bump the family (e.g. a new name) instead of editing silently.
PINNED = {
    # Changed on purpose (issue 11, items 12 and 13): harness tools and private files (every family), and the
    # repo family's specification. And on 2026-12-07 the repo family's verifier command alone: its grader
    # leaves by os._exit after its own report, so an exit hook cannot forge one (what the model sees, the
    # prompt, the files and the tests, is unchanged).
    "retention": ("7db4c3c8da01981b", "4071a00ae8dc00dc"),
    "board": ("31f5badc11935dc9", "1d25a12a4470f81f"),
    "offload": ("5ef07e37d96cd6f0", "ae8b355239f5ea85"),
    "repo": ("fc2b4fa4847896fe", "53f952436002619f"),
    "research": ("abd77378169fed1d", "2777e07916573934"),
}

SEP = "=====ctxrl-test-separator====="


def _sandbox(workspace: Path) -> Sandbox:
    try:
        return Sandbox(workspace, SandboxConfig(max_output_bytes=2_000_000))
    except SandboxError:  # no namespaces on this machine: the only case where running unisolated is allowed
        return Sandbox(workspace, SandboxConfig(backend="none", max_output_bytes=2_000_000))


def _materialize(task: Task, folder: Path) -> None:
    """The workspace and the private folder in one place, so one sandbox runs every tool (the harness keeps
    them apart; these tests are about the tools)."""
    task.materialize(folder)
    task.materialize_private(folder)


def _observe(task: Task, workspace: Path) -> list[str]:
    """Materialise ``task`` and run its observation calls in one sandboxed command; one output per call."""
    _materialize(task, workspace)
    command = " ; ".join(f"{call}; echo {SEP}" for call in task.metadata["observation_calls"])
    result = _sandbox(workspace).run(command)
    assert result.exit_code == 0 and result.truncated_bytes == 0, result.output[-500:]
    outputs = result.output.split(SEP + "\n")
    assert outputs[-1] == ""
    return outputs[:-1]


# -- determinism and splits ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_same_task_other_seed_other_task(family: str) -> None:
    a, b = make_task(family, 7), make_task(family, 7)
    assert a.to_dict() == b.to_dict()
    assert make_task(family, 8).to_dict() != a.to_dict()
    assert make_task(family, 7, "easy").to_dict() != a.to_dict()


def test_generation_is_pinned() -> None:
    for family, (train0, test0) in PINNED.items():
        assert make_task(family, 0).fingerprint() == train0, family
        assert make_task(family, 110_000).fingerprint() == test0, family
    assert make_task("board", 110_000).task_id == "board:default:110000"


def test_generation_is_identical_in_another_process() -> None:
    code = (
        "from ctxrl.env.tasks import FAMILIES, make_task\n"
        "print(' '.join(make_task(f, 12345).fingerprint() for f in FAMILIES))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "987"}  # a different str hash than this process
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert out.split() == [make_task(f, 12345).fingerprint() for f in FAMILIES]


def test_splits_are_disjoint_and_stable() -> None:
    assert {
        "train": range(0, 100_000),
        "dev": range(100_000, 110_000),
        "test": range(110_000, 120_000),
    } == SPLIT_RANGES
    assert list(split_seeds("dev", 3)) == [100_000, 100_001, 100_002]
    # a later block of a split: from its offset-th seed on, never past its end
    assert list(split_seeds("test", 3, offset=128)) == [110_128, 110_129, 110_130]
    assert list(split_seeds("test", offset=9_998)) == [119_998, 119_999]
    with pytest.raises(TaskError, match="cannot take n=3 from offset 9998"):
        split_seeds("test", 3, offset=9_998)
    with pytest.raises(TaskError, match="cannot start at offset -1"):
        split_seeds("test", 3, offset=-1)
    ranges = list(SPLIT_RANGES.values())
    assert all(set(a).isdisjoint(b) for i, a in enumerate(ranges) for b in ranges[i + 1 :])
    assert [split_of(s) for s in (0, 99_999, 100_000, 110_000, 119_999, 120_000)] == [
        "train", "train", "dev", "test", "test", "extra"
    ]  # fmt: skip
    assert make_task("retention", 110_003, split="test").split == "test"


def test_bad_family_seed_split_and_difficulty_errors() -> None:
    with pytest.raises(TaskError, match=r"unknown task family 'chess'; known families: retention, board"):
        make_task("chess", 1)
    with pytest.raises(TaskError, match=r"seed 5 is not in split 'test', whose seeds are 110000-119999"):
        make_task("board", 5, split="test")
    with pytest.raises(TaskError, match=r"unknown split 'validation'; known splits: train, dev, test"):
        make_task("board", 5, split="validation")
    with pytest.raises(TaskError, match=r"no difficulty 'extreme'; known: easy, default, hard"):
        make_task("repo", 5, "extreme")
    with pytest.raises(TaskError, match=r"seed must be an integer >= 0"):
        make_task("repo", -1)


def test_the_short_curriculum_level_is_retention_only_and_small(tmp_path: Path) -> None:
    from ctxrl.commands.config import load_run_config
    from ctxrl.errors import ConfigError

    task = make_task("retention", 7, "short")
    outputs = _observe(task, tmp_path)
    assert len(outputs) == 4 and outputs[0].startswith("=== registry log, part 1/4 ===")
    assert len(task.verifier.expected) == 2 and sum(len(o) for o in outputs) < 4000  # ~1k tokens of log
    assert task.verifier.verify(task.metadata["oracle_answer"]).success
    assert (
        load_run_config(None, ["tasks.families=[retention]", "tasks.difficulty=short"]).tasks.difficulty
        == "short"
    )
    with pytest.raises(
        ConfigError, match=r"difficulty 'short' exists only for retention; board, offload, repo, res"
    ):
        load_run_config(None, ["tasks.difficulty=short"])  # every family
    with pytest.raises(TaskError, match=r"family 'board' has no difficulty 'short'"):
        make_task("board", 1, "short")


def test_the_retention_ladder_lowers_targets_parts_and_confusers_under_one_verifier(tmp_path: Path) -> None:
    """``mini`` < ``small`` < ``short``: fewer values to keep, fewer parts, fewer look-alike near misses (each
    a forbidden value); the same verifier kind; the rungs' prompts state nothing that is false there."""
    sizes = {}
    for level in ("mini", "small", "short"):
        tasks = [make_task("retention", seed, level) for seed in range(8)]
        for task in tasks:
            assert task.verifier.kind == "all_values"
            assert task.verifier.verify(task.metadata["oracle_answer"]).success
            assert not task.verifier.verify("\n".join(task.verifier.forbidden)).success
        near_misses = max(len(t.verifier.forbidden) for t in tasks)
        sizes[level] = (
            len(tasks[0].verifier.expected),
            len(tasks[0].metadata["observation_calls"]),
            near_misses,
        )
    # (values, parts, near misses per task): one look-alike per target at mini, two at small, three at short
    assert sizes == {"mini": (1, 2, 1), "small": (1, 3, 2), "short": (2, 4, 6)}
    mini = make_task("retention", 3, "mini")
    assert len(_observe(mini, tmp_path)) == 2
    assert "rotated" not in mini.prompt and "several times larger" not in mini.prompt
    assert "rotated" in make_task("retention", 3, "short").prompt  # the existing levels keep their prompt


def test_builtin_source_is_a_task_source_balanced_over_families() -> None:
    source = BuiltinTaskSource(["retention", "board"])
    assert isinstance(source, TaskSource)
    ids = [t.task_id for t in source.tasks("dev", n=3)]
    assert ids == ["retention:default:100000", "board:default:100000", "retention:default:100001"]
    with pytest.raises(TaskError, match="unknown task family"):
        BuiltinTaskSource(["nope"])


# -- every family, end to end ------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_family_tools_run_and_the_oracle_passes(family: str, tmp_path: Path, tiny_tokenizer: Any) -> None:
    task = make_task(family, 3)
    outputs = _observe(task, tmp_path)
    for tool in task.tools:
        path = tmp_path / tool.command
        assert path.read_text().startswith("#!/usr/bin/env python3") and os.access(path, os.X_OK)

    # Sizes: everything observed is several times the budget; any one observation fits well inside it.
    def count(text: str) -> int:
        return len(tiny_tokenizer(text)["input_ids"])

    budget = task.budget_for(count)
    assert count("".join(outputs)) >= 2.5 * budget
    assert max(count(o) for o in outputs) <= 0.6 * budget

    verdict = task.verifier.verify(task.metadata["oracle_answer"], tmp_path, _sandbox)
    if family == "repo":
        assert not verdict.success, "the unfixed repository must fail its test"
    else:
        assert verdict.success, verdict.detail
    assert not task.verifier.verify("I do not know.", tmp_path, _sandbox).success
    # The task survives JSON unchanged.
    assert Task.from_dict(json.loads(json.dumps(task.to_dict()))) == task


def test_retention_stream_holds_the_values_and_is_consumed(tmp_path: Path) -> None:
    task = make_task("retention", 4)
    outputs = _observe(task, tmp_path)
    text = "".join(outputs)
    assert len(outputs) == 24 and outputs[0].startswith("=== registry log, part 1/24 ===")
    for target in task.metadata["targets"]:
        assert re.search(rf"registry {target['entity']} {target['field']}={target['value']}\b", text)
    for value in task.verifier.forbidden:  # every wrong value is a real distractor of the stream
        assert value in text
    again = _sandbox(tmp_path).run("tools/next_chunk")
    assert again.output.startswith("(end of stream: all 24 parts were delivered)")
    answer = task.metadata["oracle_answer"]
    # Near misses: one value one character off (the look-alike entity's value), and pasting the whole log.
    near = answer.replace(
        task.verifier.expected[0],
        next(v for v in task.verifier.forbidden if len(v) == len(task.verifier.expected[0])),
    )
    assert not task.verifier.verify(near).success
    assert not task.verifier.verify(text).success


def _replay(initial: str, log: str) -> str:
    """An independent interpreter of the board's EVENT lines (the prompt's rules), for checking the generator."""
    grid = [row.split() for row in initial.splitlines()]
    where = {c: (r, k) for r, row in enumerate(grid) for k, c in enumerate(row) if c != "."}
    steps = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
    for line in log.splitlines():
        if " EVENT " not in line:
            continue
        words = line.split(" EVENT ")[1].split()
        cell = lambda s: (int(s[1 : s.index("c")]) - 1, int(s[s.index("c") + 1 :]) - 1)  # noqa: E731
        if words[0] == "move":
            where[words[1]] = cell(words[3])
        elif words[0] == "shift":
            (r, k), (dr, dk) = where[words[1]], steps[words[2]]
            where[words[1]] = (r + dr * int(words[3]), k + dk * int(words[3]))
        elif words[0] == "swap":
            where[words[1]], where[words[2]] = where[words[2]], where[words[1]]
        elif words[0] == "remove":
            del where[words[1]]
        elif words[0] == "add":
            where[words[1]] = cell(words[3])
    out = [["."] * len(grid[0]) for _ in grid]
    for piece, (r, k) in where.items():
        assert out[r][k] == ".", "two pieces on one cell"
        out[r][k] = piece
    return "\n".join(" ".join(row) for row in out)


def test_board_log_replays_to_the_expected_state_and_stale_states_fail(tmp_path: Path) -> None:
    task = make_task("board", 5)
    outputs = _observe(task, tmp_path)
    initial = task.metadata["initial"]
    assert initial in task.prompt
    assert _replay(initial, "".join(outputs)) == task.verifier.expected
    stale = _replay(initial, "".join(outputs[:-1]))  # everything but the last batch
    assert stale != task.verifier.expected
    assert not task.verifier.verify(stale).success
    assert task.verifier.verify(f"Final board after batch 24:\n{task.verifier.expected}\n").success
    assert task.metadata["state_chars"] == len(task.verifier.expected)


def test_offload_questions_need_every_report_and_details_can_be_reread(tmp_path: Path) -> None:
    task = make_task("offload", 6)
    _materialize(task, tmp_path)
    box = _sandbox(tmp_path)
    early = box.run("tools/questions")
    assert early.exit_code == 1 and "not yet opened" in early.output
    outputs = _observe(task, tmp_path)
    assert outputs[-1].startswith("Questions (answer each with the exact value):")
    for question in task.metadata["questions"]:
        assert question in outputs[-1]
    target = task.metadata["targets"][0]
    name = Path(target["report"]).stem
    reread = box.run(f"tools/open_report --name {name} --pattern 'unit {target['unit']} '")
    assert reread.exit_code == 0 and f"{target['field']} {target['value']} " in reread.output
    assert reread.output.startswith("1 line(s)")
    # The same unit in another report has another value: a near miss that fails.
    other = box.run(f"grep -h 'unit {target['unit']} ' reports/*.txt | grep -v ' {target['value']} '")
    assert other.output.strip()
    wrong = next(v for v in task.verifier.forbidden if f" {v} " in other.output)
    answer = task.metadata["oracle_answer"].replace(target["value"], wrong)
    assert not task.verifier.verify(answer).success


@pytest.mark.parametrize(("seed", "difficulty"), [(2, "default"), (771499, "easy")])
def test_repo_fails_until_fixed_and_test_edits_do_not_count(
    seed: int, difficulty: str, tmp_path: Path
) -> None:
    """Seed 771499 at easy is one whose first draw of functions leaves no function able to carry a unique bug
    (the generator raised on it until the whole-step fuzzer found it); its second draw makes a task like any."""
    task = make_task("repo", seed, difficulty)
    task.materialize(tmp_path)
    box = _sandbox(tmp_path)
    report = box.run("tools/run_tests")
    assert report.exit_code == 1 and f"FAIL: {task.metadata['failing_test']}" in report.output
    assert re.search(r"Ran \d+ tests", report.output) and (
        difficulty != "default" or "Ran 14 tests" in report.output
    )
    found = box.run(f"grep -rn 'def {task.metadata['bug_function']}(' repo/")
    assert found.output.startswith(task.metadata["bug_file"] + ":")
    # Cheating by rewriting the failing test is undone before grading.
    test_file = next(
        p for p in task.verifier.restore if task.metadata["failing_test"] in task.verifier.restore[p]
    )
    box.run(f"printf 'import unittest\\n' > {test_file}")
    assert box.run("tools/run_tests").exit_code == 0
    assert not task.verifier.verify("done", tmp_path, _sandbox).success
    # A plain unittest run leaves .pyc files in the tree; a same-second, same-size fix must still count.
    box.run("cd repo && python3 -m unittest discover -s tests -t . > /dev/null 2>&1")
    fixed = box.run(task.metadata["oracle_fix"])
    assert fixed.exit_code == 0, fixed.output
    assert task.metadata["fixed_line"] + "\n" in (tmp_path / task.metadata["bug_file"]).read_text()
    verdict = task.verifier.verify("done", tmp_path, _sandbox)
    assert verdict.success, verdict.detail


def test_research_search_finds_each_hop_and_read_rejects_bad_ids(tmp_path: Path) -> None:
    task = make_task("research", 8)
    outputs = _observe(task, tmp_path)
    calls = task.metadata["observation_calls"]
    for call, output in zip(calls, outputs):
        if call.startswith("tools/read"):
            doc_id = call.split()[-1]
            assert output.startswith(doc_id + "  ")
            # The search just before must have listed the document it reads.
            assert doc_id in outputs[calls.index(call) - 1]
    bad = _sandbox(tmp_path).run("tools/read --doc_id D999")
    assert bad.exit_code == 1 and "no document" in bad.output
    # Following the chief executive instead of the founder (or a look-alike product) gives a forbidden answer.
    assert task.verifier.forbidden and not set(task.verifier.forbidden) & set(task.verifier.expected)


# -- tool argument convention --------------------------------------------------------------------------------------


def test_tool_arguments_in_every_form(tmp_path: Path) -> None:
    task = make_task("research", 1)
    _materialize(task, tmp_path)
    search = task.tool("search")
    query = 'it\'s a "quoted" $(rm -rf /) `x`; Calder'
    line = search.to_shell({"query": query, "k": 2})
    assert line.startswith("tools/search --query ")
    box = _sandbox(tmp_path)
    result = box.run(line)
    assert result.exit_code == 0 and result.output.startswith(f"search {json.dumps(query)}: ")
    assert len(result.output.strip().splitlines()) <= 3
    same = [
        box.run(c).output
        for c in ("tools/search --query=Calder --k=2", """tools/search '{"query": "Calder", "k": 2}'""")
    ]
    assert same[0] == same[1]
    assert box.run("tools/read D001").output == box.run(task.tool("read").to_shell({"doc_id": "D001"})).output
    wrong = box.run("tools/search --qeury x")
    assert (
        wrong.exit_code == 2
        and "unknown argument qeury" in wrong.output
        and "usage: tools/search --query STRING" in wrong.output
    )
    assert box.run("tools/search --query x --k two").exit_code == 2
    assert box.run("tools/search").exit_code == 2
    assert "Search the corpus" in box.run("tools/search --help").output
    # Harness tools are no shell commands: the shell help lists only the workspace tools.
    assert "tools/search" not in task.tool_help()
    repo_help = make_task("repo", 1).tool_help()
    assert (
        "- tools/run_tests    # Run the repository's unit tests" in repo_help and "read_spec" not in repo_help
    )


def test_tool_spec_checks_and_openai_form() -> None:
    spec = ToolSpec(
        "echo", "Echo.", {"type": "object", "properties": {"x": {"type": "string"}}}, "tools/echo"
    )
    assert spec.to_openai()["function"]["name"] == "echo"
    assert spec.to_shell({}) == "tools/echo"
    with pytest.raises(TaskError, match="parameters"):
        ToolSpec("echo", "", {"type": "array"}, "tools/echo")
    with pytest.raises(TaskError, match="relative path"):
        ToolSpec("echo", "", {"type": "object"}, "/usr/bin/echo", script="print(1)")


# -- datasets export -----------------------------------------------------------------------------------------------


def test_dataset_round_trip() -> None:
    ds = to_dataset("board", "dev", 3)
    assert len(ds) == 3 and ds[0]["task_id"] == "board:default:100000" and ds[2]["split"] == "dev"
    for i, seed in enumerate(split_seeds("dev", 3)):
        assert from_dataset_row(ds[i]) == make_task("board", seed)
    with pytest.raises(TaskError, match="unknown task family"):
        to_dataset("chess", "dev", 1)
    with pytest.raises(TaskError, match="no 'task_json' column"):
        from_dataset_row({"prompt": "x"})


# -- user tasks ----------------------------------------------------------------------------------------------------

_USER_TASK = {
    "task_id": "capital-1",
    "family": "quiz",
    "split": "dev",
    "prompt": "Read notes.txt and give the code.",
    "files": {"notes.txt": "the code is 4417\n"},
    "verifier": {"kind": "all_values", "expected": ["4417"]},
}


def test_jsonl_loader_happy_path(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    second = {**_USER_TASK, "task_id": "capital-2", "split": "test"}
    path.write_text(json.dumps(_USER_TASK) + "\n\n" + json.dumps(second) + "\n")
    source = FileTaskSource(path)
    assert isinstance(source, TaskSource) and source.families == ("quiz",)
    (task,) = source.tasks("dev")
    assert task.budget_tokens == 8000 and task.max_steps == 40 and task.tools == []
    assert task.verifier.verify("code: 4417").success
    task.materialize(tmp_path / "ws")
    assert (tmp_path / "ws" / "notes.txt").read_text() == "the code is 4417\n"
    with pytest.raises(TaskError, match="no tasks in split 'train'; its splits: dev, test"):
        list(source.tasks("train"))


def test_task_folder_loader_happy_path(tmp_path: Path) -> None:
    folder = tmp_path / "tasks" / "t1"
    (folder / "files" / "src").mkdir(parents=True)
    (folder / "files" / "src" / "a.py").write_text("x = 1\n")
    spec = {k: v for k, v in _USER_TASK.items() if k != "files"}
    spec["verifier"] = {"kind": "command", "command": "python3 -c 'import src.a'"}
    (folder / "task.json").write_text(json.dumps(spec))
    (task,) = load_tasks(tmp_path / "tasks")
    assert task.files == {"src/a.py": "x = 1\n"}
    assert load_tasks(folder) == [task]  # one task folder on its own works too


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"task_id": "a", ', r"tasks.jsonl:2: not valid JSON"),
        (json.dumps({k: v for k, v in _USER_TASK.items() if k != "prompt"}), r"tasks.jsonl:2: missing field 'prompt'"),
        (json.dumps({**_USER_TASK, "verifier": {"kind": "regex", "expected": "x"}}),
         r"tasks.jsonl:2: verifier: unknown verifier kind 'regex'; known kinds: exact, all_values, board"),
        (json.dumps({**_USER_TASK, "max_steps": "ten"}), r"tasks.jsonl:2: field 'max_steps' must be int, not str"),
        (json.dumps({**_USER_TASK, "budget": 100}), r"tasks.jsonl:2: unknown field\(s\) \['budget'\]"),
        (json.dumps({**_USER_TASK, "files": {"../escape.txt": "x"}}), r"tasks.jsonl:2: field 'files': .* not a relative path"),
        (json.dumps({**_USER_TASK, "tools": [{"name": "t", "command": ""}]}), r"tasks.jsonl:2: tools\[0\]: field 'command'"),
        (json.dumps(_USER_TASK), r"task_id 'capital-1' appears twice"),
        ("[1, 2]", r"tasks.jsonl:2: expected a JSON object, got list"),
    ],
)  # fmt: skip
def test_jsonl_loader_errors_name_file_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(_USER_TASK) + "\n" + line + "\n")
    with pytest.raises(TaskError, match=message):
        load_tasks(path)


def test_task_folder_loader_errors(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="no such task file or folder"):
        load_tasks(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskError, match="no task folders"):
        load_tasks(tmp_path / "empty")
    bad = tmp_path / "set" / "t1"
    bad.mkdir(parents=True)
    (bad / "task.json").write_text("{not json")
    with pytest.raises(TaskError, match=r"t1/task.json: not valid JSON"):
        load_tasks(tmp_path / "set")
    (bad / "task.json").write_text(json.dumps({**_USER_TASK, "verifier": {"kind": "board", "expected": ""}}))
    with pytest.raises(TaskError, match=r"t1/task.json: verifier: kind 'board' needs field 'expected'"):
        load_tasks(tmp_path / "set")
    (bad / "task.json").write_text(json.dumps(_USER_TASK))
    (bad / "files").mkdir()
    (bad / "files" / "notes.txt").write_text("dup")
    with pytest.raises(TaskError, match=r"notes.txt: also given in task.json field 'files'"):
        load_tasks(tmp_path / "set")
