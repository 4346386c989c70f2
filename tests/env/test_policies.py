"""Scripted reference policies: they solve the tasks by managing their context, append-only fails, they act
only on the prompt text, and the rollout loop gives the same results whatever its pool size."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ctxrl.commands.common import scripted_policy
from ctxrl.env.gym_env import ContextEnv
from ctxrl.env.policies import POLICY_MODES, Call, Plan, make_policy, managers, read_prompt, read_view
from ctxrl.env.policies.managers import THRESHOLD
from ctxrl.env.policies.solvers import board, repo, retention
from ctxrl.env.tasks.registry import FAMILIES, make_task
from ctxrl.env.tasks.splits import split_seeds
from ctxrl.env.tokenizer import load_tokenizer
from ctxrl.errors import UsageError
from ctxrl.train.engines import EngineConfig, SamplingConfig, make_engine
from ctxrl.train.eval_table import episode_row
from ctxrl.train.rollout import RolloutConfig, rollout

SEEDS = list(split_seeds("test", 3))
CONTEXT_BOUND = ("retention", "board", "offload", "repo", "research")
"""Families whose observations do not fit the budget together: every family (repo since its paged spec)."""


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(None)


def _records(policy: str, tasks: list[Any], tokenizer: Any, tmp_path: Path, workers: int = 2) -> list[Any]:
    """The episodes of ``policy`` on ``tasks``, through the rollout loop on the scripted engine."""
    engine = make_engine(
        EngineConfig(name="scripted"), tokenizer=tokenizer, policy=scripted_policy(policy, tokenizer)
    )
    config = RolloutConfig(group_size=1, mode=POLICY_MODES[policy], workers=workers)
    result = rollout(
        engine, tokenizer, tasks, config, workdir=tmp_path, sampling=SamplingConfig(max_new_tokens=8192)
    )
    return result.episodes


def _run(policy: str, families: list[str], tokenizer: Any, tmp_path: Path) -> list[Any]:
    tasks = [make_task(f, seed, split="test") for f in families for seed in SEEDS]
    return [SimpleNamespace(**episode_row(ep)) for ep in _records(policy, tasks, tokenizer, tmp_path)]


def _play(policy: str, task: Any, tokenizer: Any, tmp_path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """One episode on ``task``: the actions and the step infos."""
    pol = make_policy(policy)
    env = ContextEnv(task.family, pol.mode, split="test", tokenizer=tokenizer, workdir=tmp_path)
    actions, infos = [], []
    obs, _ = env.reset(options={"task": task})
    while True:
        actions.append(pol(obs))
        obs, _, terminated, truncated, info = env.step(actions[-1])
        infos.append(info)
        if terminated or truncated:
            env.close()
            return actions, infos


# Under seed 001's defaults the usage manager sees no budget until the usage block appears at 75 % of the
# limit, and a research document is ~36 % of it: a read from under 75 % can fill the window, and the
# compaction backstop's fold then takes its restated facts (docs/eval_test_split.md). So research is not
# among the families it must always solve.
SOLVES = {"file-manager": list(FAMILIES), "usage-manager": [f for f in FAMILIES if f != "research"]}


@pytest.mark.parametrize("policy", ["file-manager", "usage-manager"])
def test_good_managers_solve_every_family(policy: str, tokenizer: Any, tmp_path: Path) -> None:
    results = _run(policy, SOLVES[policy], tokenizer, tmp_path)
    failed = [(r.task_id, r.reason, r.verdict) for r in results if not r.success]
    assert not failed
    for r in results:
        assert r.rollbacks == 0
        if r.family in CONTEXT_BOUND:
            # It managed, and every edit applied (a usage compaction may evict and archive in one step).
            assert r.edits > 0 and r.receipts["applied"] >= r.edits
            assert sum(n for kind, n in r.receipts.items() if kind != "applied") == 0


def test_append_only_fails_where_context_binds(tokenizer: Any, tmp_path: Path) -> None:
    results = _run("append", list(FAMILIES), tokenizer, tmp_path)
    assert {r.family for r in results} == set(CONTEXT_BOUND)
    for r in results:
        assert not r.success and r.reason == "overflow", r.task_id
    assert all(r.edits == 0 for r in results)


def test_tools_manager_drops_results_and_keeps_facts(tokenizer: Any, tmp_path: Path) -> None:
    """On top of the pressure pass (seed 000's default), the tools manager's drops keep a stream in budget.
    Research included: its ``context_status`` call carries the facts, because the pressure pass may spill
    the document just read before the next step (it used to re-read the document until ``max_steps``)."""
    results = _run("tools-manager", ["retention", "offload", "repo", "research"], tokenizer, tmp_path)
    assert all(r.success for r in results)
    retention = [r for r in results if r.family == "retention"]
    assert all(r.edits > 0 for r in retention)


def test_harness_policy_restates_its_facts(tokenizer: Any, tmp_path: Path) -> None:
    # Offload only: since repo binds the context (issue 11, item 12), the harness-scheduled baseline fails it
    # like the other bound families at the current pressure sizing (a spec page is under spill_chars).
    results = _run("harness", ["offload"], tokenizer, tmp_path)
    assert all(r.success for r in results)
    actions, _ = _play("harness", make_task("offload", SEEDS[0]), tokenizer, tmp_path)
    assert all(a.startswith("[kept facts]\nreports opened:") for a in actions)


def test_file_manager_compacts_with_a_silent_free_edit(tokenizer: Any, tmp_path: Path) -> None:
    actions, infos = _play("file-manager", make_task("retention", SEEDS[0]), tokenizer, tmp_path)
    edits = [(a, i) for a, i in zip(actions, infos) if i["receipts"]]
    assert edits
    for action, info in edits:
        command = json.loads(action.removeprefix("<tool_call>").removesuffix("</tool_call>"))["arguments"][
            "command"
        ]
        assert command.startswith("cat > context.md <<'EOF'\n[[CTX_TURN 1 role=user]]\n[kept facts]\n")
        assert info["receipt_kinds"] == ["applied"] and info["free_turn"]
    # Compactions wait for the threshold and come one at a time.
    before = [infos[k - 1]["tokens"] / infos[k - 1]["limit"] for k, i in enumerate(infos) if i["receipts"]]
    assert min(before) >= THRESHOLD
    assert infos[-1]["success"]


@pytest.mark.parametrize(
    ("family", "policy"),
    [
        ("retention", "file-manager"),
        ("board", "usage-manager"),
        ("offload", "tools-manager"),
        ("repo", "file-manager"),
        ("research", "usage-manager"),
    ],
)
def test_policies_never_read_metadata(family: str, policy: str, tokenizer: Any, tmp_path: Path) -> None:
    task = make_task(family, SEEDS[1])
    seen, infos = _play(policy, task, tokenizer, tmp_path / "a")
    blind, _ = _play(policy, replace(task, metadata={}), tokenizer, tmp_path / "b")
    assert seen == blind and infos[-1]["success"]


def test_policies_see_only_the_prompt_text(tokenizer: Any, tmp_path: Path) -> None:
    """A policy's input is the prompt text: its view of it equals the view of the structured messages in
    everything but the call ids, which the chat template does not render (so no policy can use them)."""
    env = ContextEnv("offload", "tools", split="test", tokenizer=tokenizer, workdir=tmp_path)
    obs, info = env.reset(options={"task_seed": SEEDS[0]})
    pol = make_policy("tools-manager")
    for _ in range(6):
        obs, _, _, _, info = env.step(pol(obs))
    from_text, from_messages = read_prompt(obs), read_view(info["messages"], info["tools"])
    assert [(i.role, i.text, i.name) for i in from_text.items] == [
        (i.role, i.text, i.name) for i in from_messages.items
    ]
    assert (from_text.task, from_text.tools, from_text.tokens) == (
        from_messages.task,
        from_messages.tools,
        from_messages.tokens,
    )
    ids = {cid for item in from_text.items for cid, _ in item.calls}
    assert ids and all(cid.startswith("c") for cid in ids)  # positional, not the harness's call_<step>_<i>
    harness_ids = {i.call_id for i in from_messages.items if i.call_id}
    assert harness_ids and not ids & harness_ids  # the template renders no call ids; none reach a policy
    env.close()


def test_rollout_is_deterministic_across_pool_sizes(tokenizer: Any, tmp_path: Path) -> None:
    tasks = [make_task(f, seed, split="test") for f in ("board", "repo", "research") for seed in SEEDS[:2]]
    one = _records("file-manager", tasks, tokenizer, tmp_path / "1", workers=1)
    many = _records("file-manager", tasks, tokenizer, tmp_path / "3", workers=3)

    def same(ep: Any) -> dict[str, Any]:
        # The repo verifier's detail quotes unittest's wall time ("Ran 14 tests in 0.004s"); not an observation.
        return {k: v for k, v in ep.to_dict().items() if k != "verdict"}

    assert [same(r) for r in one] == [same(r) for r in many]
    assert [r.task_id for r in one] == [t.task_id for t in tasks]


def test_unknown_policy_and_unknown_task_are_clear_errors() -> None:
    with pytest.raises(UsageError, match="unknown scripted policy 'greedy'"):
        make_policy("greedy")
    tools = '{"type": "function", "function": {"name": "shell"}}'
    prompt = (
        f"<|im_start|>system\ns\n\n# Tools\n<tools>\n{tools}\n</tools>\nCall a tool<|im_end|>\n"
        "<|im_start|>user\ndo it<|im_end|>\n<|im_start|>assistant\n"
    )
    with pytest.raises(UsageError, match="knows only the built-in families"):
        make_policy("append")(prompt)


def test_view_reads_readout_signal_and_calls() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "task"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "run_tests", "arguments": {}}}
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "name": "run_tests",
            "content": "OK\n[context: 300/1000 tokens (30% of the limit)]",
        },
        {"role": "user", "content": "Context Usage:\n- Overall: 80.0%"},
    ]
    view = read_view(messages, [{"type": "function", "function": {"name": "run_tests"}}])
    assert (view.tokens, view.limit, view.fill) == (300, 1000, 0.3)
    assert view.signal is not None and view.signal.startswith("Context Usage:")
    assert [(cid, call.name) for _, cid, call in view.calls()] == [("c1", "run_tests")]
    assert view.result_of("c1") is not None and view.tools == frozenset({"run_tests"})


def test_board_events() -> None:
    grid = [list(row) for row in ("A.", "..")]
    for event in (
        "shift A down 1",
        "add B at r1c2",
        "swap A B",
        "move A -> r2c2",
        "remove B",
        "shift A right 5",
    ):
        board.apply_event(grid, event)
    assert board.render(grid) == ". .\n. A"  # the off-board shift changed nothing


def test_repo_fix_comes_from_the_docstring() -> None:
    source = (
        "def count_above_orders(values):\n"
        '    """How many values are strictly above 17.\n    """\n'
        "    count = 0\n    for value in values:\n        if value >= 17:\n            count += 1\n    return count\n"
        "def other(x):\n    return x\n"
    )
    assert repo.find_fix("count_above_orders", source) == (
        "        if value >= 17:",
        "        if value > 17:",
    )
    fixed = source.replace("value >= 17", "value > 17")
    assert repo.find_fix("count_above_orders", fixed) is None


def _turn(n: int, name: str, body: str, **arguments: Any) -> list[dict[str, Any]]:
    """Round ``n`` of a usage-mode prompt: one call and its result under the turn header."""
    call = {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": arguments}}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {
            "role": "tool",
            "tool_call_id": f"c{n}",
            "name": name,
            "content": f"Turn #{n}\n40 tokens\n----\n{body}",
        },
    ]


def test_usage_manager_evicts_the_views_it_sees_and_archives_what_its_last_reclaim_left() -> None:
    head = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    turns = [
        *_turn(1, "evict_file_view", "[evict_file_view] evicted 1 view(s) of b.txt; 900 tokens reclaimed."),
        *_turn(2, "read_file", "File: a.txt:1-3 of 3 lines\nx\ny\nz", path="a.txt"),
        *_turn(3, "read_spec", "File view: SPEC.md\n=== SPEC.md, page 1 of 3 ===", page=1),
        *_turn(4, "run_tests", "OK"),
    ]
    block = {"role": "user", "content": "Context Usage:\n- Overall: 80.0%"}
    tools = [{"type": "function", "function": {"name": n}} for n in ("evict_file_view", "archive_thread")]
    plan = Plan((Call("run_tests"),), ("fact one",))
    # The handles are read off the results' heads (a read_file page, a task tool's document view).
    action = managers.usage(read_view([*head, *turns, block], tools), plan)
    assert action == "\n".join(
        [
            "[kept facts]\nfact one",
            '<tool_call>{"name": "evict_file_view", "arguments": {"path": "a.txt"}}</tool_call>',
            '<tool_call>{"name": "evict_file_view", "arguments": {"path": "SPEC.md"}}</tool_call>',
            '<tool_call>{"name": "archive_thread", "arguments": {"ranges": [[1, 1]]}}</tool_call>',
        ]
    )
    # With Top File Views in the block, the block's list is what is evicted.
    listed = {
        "role": "user",
        "content": block["content"] + "\n- File Views: 30.0%\n- Top File Views:\n  - `SPEC.md`: 25.0%",
    }
    action = managers.usage(read_view([*head, *turns, listed], tools), plan)
    assert '{"path": "SPEC.md"}' in action and '{"path": "a.txt"}' not in action
    # No view open: archive every finished turn.
    plain = [*head, *_turn(1, "run_tests", "FAILED"), *_turn(2, "run_tests", "OK"), block]
    assert managers.usage(read_view(plain, tools), plan) == "\n".join(
        [
            "[kept facts]\nfact one",
            '<tool_call>{"name": "archive_thread", "arguments": {"ranges": [[1, 2]]}}</tool_call>',
        ]
    )
    # Below the threshold and without the usage block, the task action goes through unchanged.
    quiet = read_view([*head, *turns], tools)
    assert managers.usage(quiet, Plan((Call("run_tests"),))) == Call("run_tests").render()


def test_retention_keeps_the_first_value_unless_a_line_says_rotated() -> None:
    task = "A service registry streams its log in 3 parts.\n1. `port` of `vega-3`\n2. `build` of `lyra-4`\n"
    parts = [
        "=== registry log, part 1/3 ===\nregistry vega-3 port=1111\nregistry lyra-4 build=b-aaaaaa",
        # a look-alike's record that happens to name an asked pair, and a real rotation
        "=== registry log, part 2/3 ===\nregistry vega-3 port=2222\nregistry vega-33 port=1112",
        "=== registry log, part 3/3 ===\nregistry lyra-4 build=b-bbbbbb (rotated; replaces the previous value)",
    ]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "s"}, {"role": "user", "content": task}]
    messages += [
        {"role": "tool", "tool_call_id": f"c{i}", "name": "next_chunk", "content": p}
        for i, p in enumerate(parts)
    ]
    tools = [{"type": "function", "function": {"name": "next_chunk"}}]
    plan = retention.solve(read_view(messages, tools))
    assert plan.calls == (Call("submit", {"answer": "vega-3 port = 1111\nlyra-4 build = b-bbbbbb"}),)
    assert plan.facts == (
        "registry vega-3 port=1111",
        "registry lyra-4 build=b-bbbbbb (rotated; replaces the previous value)",
        "[progress] registry log: read part 3/3",
    )
    # The facts alone (a compacted context) give the same answer.
    note = [messages[0], messages[1], {"role": "user", "content": "\n".join(plan.facts)}]
    assert retention.solve(read_view(note, tools)).calls == plan.calls
