"""The rollout loop: token in / token out with real engines, incremental prompts, edits, records, ends.

vLLM tests share the session's one in-process engine (``vllm_llm``); the server test starts one
OpenAI-compatible server for this module. The tiny model is random, so generation is capped short and
episodes are a few steps long.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ctxrl.env.config import HarnessConfig
from ctxrl.env.episode import PromptBuilder
from ctxrl.env.sandbox import SandboxConfig
from ctxrl.env.tasks.registry import make_task
from ctxrl.train.engines.base import Generation, SamplingConfig
from ctxrl.train.engines.scripted import ScriptedEngine
from ctxrl.train.rollout import RolloutConfig, RolloutResult, rollout
from ctxrl.train.trajectory import EpisodeRecord, load_trajectories, save_trajectories

SAMPLED = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=32)


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class Recorder:
    """Wraps an engine and keeps every batch it was asked for and every result it gave."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.name = engine.name
        self.max_model_len = engine.max_model_len
        self.calls: list[tuple[list[list[int]], list[Generation]]] = []

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[Generation]:
        gens = self.engine.generate(prompts, sampling)
        self.calls.append(([list(p) for p in prompts], gens))
        return list(gens)


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def assert_token_in_token_out(result: RolloutResult, recorder: Recorder) -> None:
    """Every step's ids are exactly what the engine consumed and produced, in call order; append-only
    stretches are exact prefixes of the next prompt."""
    episodes = result.episodes
    assert len(recorder.calls) == max(len(ep.steps) for ep in episodes)
    for c, (prompts, gens) in enumerate(recorder.calls):
        steps = [ep.steps[c] for ep in episodes if len(ep.steps) > c]  # the live episodes, in order
        assert [s.prompt_ids for s in steps] == prompts
        assert [s.token_ids for s in steps] == [g.token_ids for g in gens]
        assert [s.logprobs for s in steps] == [g.logprobs for g in gens]
        assert [s.num_cached_tokens for s in steps] == [g.num_cached_tokens for g in gens]
        assert [s.finish_reason for s in steps] == [g.finish_reason for g in gens]
    extended = 0
    for ep in episodes:
        assert ep.steps[0].prompt_source == "reset"
        for a, b in zip(ep.steps, ep.steps[1:]):
            if b.prompt_source == "extend":
                head = a.prompt_ids + a.token_ids
                assert b.prompt_ids[: len(head)] == head and len(b.prompt_ids) > len(head)
                extended += 1
            else:
                assert b.prompt_source == "rebuild" and b.rebuild_reason in ("edit", "history", "template")
    assert extended > 0


def assert_logprobs_match_forward(model: Any, result: RolloutResult) -> None:
    import torch

    for ep in result.episodes:
        for s in ep.steps:
            with torch.no_grad():
                logits = model(torch.tensor([s.prompt_ids + s.token_ids])).logits[0].float()
            ref = torch.log_softmax(logits[len(s.prompt_ids) - 1 : -1], dim=-1)
            chosen = ref.gather(-1, torch.tensor(s.token_ids).unsqueeze(-1)).squeeze(-1)
            assert (chosen - torch.tensor(s.logprobs)).abs().max().item() < 1e-3


def short_rollout(engine: Any, tokenizer: Any, tmp_path: Path, **config: Any) -> RolloutResult:
    config.setdefault("group_size", 2)
    config.setdefault("max_steps", 4)
    sampling = config.pop("sampling", SAMPLED)
    harness = HarnessConfig(sandbox=config.pop("sandbox")) if "sandbox" in config else None
    tasks = [make_task("retention", 3, "easy"), make_task("board", 4, "easy")][: config.pop("n_tasks", 2)]
    return rollout(
        engine,
        tokenizer,
        tasks,
        RolloutConfig(**config),
        workdir=tmp_path / "ws",
        sampling=sampling,
        harness=harness,
    )


# --------------------------------------------------------------------------------------- prompt builder


def test_incremental_prompt_equals_full_render_when_the_model_writes_the_template(
    tiny_tokenizer: Any,
) -> None:
    builder = PromptBuilder(tiny_tokenizer)
    assert builder.turn_close == "<|im_end|>\n"
    tools = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
    before = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    assistant = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": {"command": "ls"}}}
        ],
    }
    after = [
        *before,
        assistant,
        {"role": "tool", "tool_call_id": "c1", "name": "shell", "content": "a.txt\nb.txt"},
    ]
    prompt = builder.full(before, tools)
    canonical = [*builder.encode(call("shell", command="ls")), tiny_tokenizer.eos_token_id]
    ids, reason = builder.extend(prompt, canonical, True, before, after, tools)
    assert reason is None and ids == builder.full(after, tools)

    # what the model sampled stays as sampled, even where the template would write it differently
    sloppy = builder.encode(' <tool_call>{"name":"shell","arguments":{"command":"ls"}}</tool_call>')
    ids, _ = builder.extend(prompt, sloppy, False, before, after, tools)
    assert ids is not None and ids[: len(prompt) + len(sloppy)] == prompt + sloppy
    assert builder.decode(ids[len(prompt) + len(sloppy) :]).startswith("<|im_end|>\n<|im_start|>tool\n")
    assert builder.decode(ids).endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")

    # earlier history changed: no extension
    merged = [before[0], {"role": "user", "content": "task\nnote"}, assistant]
    assert builder.extend(prompt, canonical, True, before, merged, tools) == (
        None,
        "history",
    )


# ------------------------------------------------------------------------------ scripted: edits and records


def scripted_file_policy(tokenizer: Any) -> Any:
    """Read a chunk, list files, edit the context file with sed, then submit."""
    script = [
        call("next_chunk"),
        "checking " + call("shell", command="ls"),
        "tidy up " + call("shell", command="sed -i 's/registry/REG/g' context.md"),
        "done " + call("submit", answer="nothing kept"),
    ]

    def policy(prompt_ids: list[int]) -> str:
        turn = tokenizer.decode(prompt_ids).count("<|im_start|>assistant") - 1
        return script[min(turn, len(script) - 1)]

    return policy


@pytest.fixture(scope="module")
def scripted_result(tiny_tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> RolloutResult:
    engine = ScriptedEngine(scripted_file_policy(tiny_tokenizer), tiny_tokenizer, max_model_len=8192)
    tasks = [make_task("retention", 1, "easy")]
    config = RolloutConfig(group_size=2)
    return rollout(
        engine,
        tiny_tokenizer,
        tasks,
        config,
        workdir=tmp_path_factory.mktemp("scripted"),
        sampling=SamplingConfig(max_new_tokens=128),
    )


def test_scripted_edit_rebuilds_the_prompt_and_masks_the_edit_call(
    scripted_result: RolloutResult, tiny_tokenizer: Any
) -> None:
    for ep in scripted_result.episodes:
        assert ep.end_reason == "submit" and not ep.success and ep.answer == "nothing kept"
        assert [s.prompt_source for s in ep.steps] == ["reset", "extend", "extend", "rebuild"]
        read, ls, sed, submit = ep.steps
        assert read.tool_calls == ["next_chunk"] and ls.receipts == [] and sum(ls.edit_mask) == 0
        assert sed.edit_calls == [0] and sed.receipt_kinds == ["applied"] and sed.edited
        marked = [t for t, m in zip(sed.token_ids, sed.edit_mask) if m]
        assert tiny_tokenizer.decode(marked) == call("shell", command="sed -i 's/registry/REG/g' context.md")
        assert sed.edit_mask[0] == 0 and sed.edit_mask[-1] == 0  # prose and the EOS are not edit tokens
        # the edit rewrote earlier turns, so the next prompt is rebuilt, not extended
        assert submit.rebuild_reason == "edit"
        head = sed.prompt_ids + sed.token_ids
        assert submit.prompt_ids[: len(head)] != head
        assert "REG" in tiny_tokenizer.decode(submit.prompt_ids) and "REG" not in tiny_tokenizer.decode(
            sed.prompt_ids
        )
        # cost replay: the rebuilt prompt still reuses the cached pinned prefix
        assert 0 < submit.cost.cached_tokens < len(submit.prompt_ids)
        assert ep.cost_tokens == sum(
            s.cost.prompt_tokens - s.cost.cached_tokens + s.cost.generated_tokens for s in ep.steps
        )
    assert scripted_result.stats.env_steps == 8 and scripted_result.stats.generate_calls == 4


def test_trajectory_jsonl_round_trip_and_datasets_load(
    scripted_result: RolloutResult, tmp_path: Path
) -> None:
    import datasets

    path = save_trajectories(scripted_result.episodes, tmp_path / "traj.jsonl")
    assert load_trajectories(path) == scripted_result.episodes
    ds = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))
    assert len(ds) == len(scripted_result.episodes)
    assert [EpisodeRecord.from_dict(row) for row in ds] == scripted_result.episodes


def test_context_past_max_model_len_ends_the_episode(tiny_tokenizer: Any, tmp_path: Path) -> None:
    engine = ScriptedEngine(lambda ids: "x " * 40, tiny_tokenizer, max_model_len=1700)
    result = short_rollout(engine, tiny_tokenizer, tmp_path, n_tasks=1, max_steps=20)
    for ep in result.episodes:
        assert ep.end_reason == "max_model_len" and not ep.success and ep.reward == 0.0
        assert len(ep.steps) >= 1 and len(ep.steps[-1].prompt_ids) < 1700
    assert not any((tmp_path / "ws").iterdir())  # workspaces removed


def test_an_exception_in_one_episode_aborts_only_that_episode(
    tiny_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A step that raises (episode 0/1, second step) and a grading that raises (episode 1/0): both end
    ``aborted`` with the cause logged and kept in the verdict; the other episodes run to their submit."""
    from ctxrl.env.episode import TaskEpisode

    real_step, real_finish = TaskEpisode.step, TaskEpisode.finish
    steps_seen: dict[str, int] = {}

    def step(self: TaskEpisode, generated: Any, *, stopped: bool = True) -> Any:
        n = steps_seen[self.workspace.name] = steps_seen.get(self.workspace.name, 0) + 1
        if self.workspace.name == "task0000-ep01" and n == 2:
            raise RuntimeError("boom in a step")
        return real_step(self, generated, stopped=stopped)

    def finish(self: TaskEpisode) -> Any:
        if self.workspace.name == "task0001-ep00":
            raise ValueError("boom in grading")
        return real_finish(self)

    monkeypatch.setattr(TaskEpisode, "step", step)
    monkeypatch.setattr(TaskEpisode, "finish", finish)
    engine = ScriptedEngine(scripted_file_policy(tiny_tokenizer), tiny_tokenizer, max_model_len=8192)
    tasks = [make_task("retention", 1, "easy"), make_task("retention", 2, "easy")]
    with caplog.at_level("WARNING", logger="ctxrl.train.rollout"):
        result = rollout(
            engine,
            tiny_tokenizer,
            tasks,
            RolloutConfig(group_size=2),
            workdir=tmp_path / "ws",
            sampling=SamplingConfig(max_new_tokens=128),
        )
    by = {(ep.group, ep.index): ep for ep in result.episodes}
    assert len(by) == 4
    stepped = by[(0, 1)]
    assert stepped.end_reason == "aborted" and not stepped.success and stepped.reward == 0.0
    assert stepped.verdict == "aborted: step raised RuntimeError: boom in a step"
    assert len(stepped.steps) == 2 and stepped.steps[1].receipts == [] and stepped.steps[1].token_ids
    graded = by[(1, 0)]
    assert graded.end_reason == "aborted" and graded.answer == "nothing kept" and not graded.success
    assert graded.verdict == "aborted: grading raised ValueError: boom in grading"
    for key in [(0, 0), (1, 1)]:
        assert by[key].end_reason == "submit" and len(by[key].steps) == 4
    assert result.stats.env_steps == 4 + 1 + 4 + 4
    logged = [r.getMessage() for r in caplog.records]
    assert any(tasks[0].task_id in m and "RuntimeError: boom in a step" in m for m in logged)
    assert any(tasks[1].task_id in m and "ValueError: boom in grading" in m for m in logged)
    assert not any((tmp_path / "ws").iterdir())  # every workspace removed, the aborted ones too


def test_an_episode_that_fails_to_reset_is_aborted_and_the_rest_run(
    tiny_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ctxrl.env.episode import TaskEpisode

    real_reset = TaskEpisode.reset

    def reset(self: TaskEpisode) -> Any:
        if self.workspace.name == "task0000-ep00":
            raise OSError("no space left on device")
        return real_reset(self)

    monkeypatch.setattr(TaskEpisode, "reset", reset)
    engine = ScriptedEngine(scripted_file_policy(tiny_tokenizer), tiny_tokenizer, max_model_len=8192)
    result = rollout(
        engine,
        tiny_tokenizer,
        [make_task("retention", 1, "easy")],
        RolloutConfig(group_size=2),
        workdir=tmp_path / "ws",
        sampling=SamplingConfig(max_new_tokens=128),
    )
    first, second = result.episodes
    assert (first.end_reason, first.steps, first.success) == ("aborted", [], False)
    assert first.verdict == "aborted: reset raised OSError: no space left on device"
    assert second.end_reason == "submit" and len(second.steps) == 4


# -------------------------------------------------------------------------------------- in-process vLLM


@pytest.fixture(scope="module")
def vllm_engine(vllm_llm: Any) -> Any:
    from ctxrl.train.engines.vllm_engine import VLLMEngine

    return VLLMEngine.from_llm(vllm_llm)


@pytest.mark.vllm
def test_vllm_rollout_is_token_in_token_out(
    vllm_engine: Any, tiny_tokenizer: Any, hf_model: Any, tmp_path: Path
) -> None:
    recorder = Recorder(vllm_engine)
    result = short_rollout(recorder, tiny_tokenizer, tmp_path)
    assert len(result.episodes) == 4 and all(ep.engine == "vllm" for ep in result.episodes)
    assert_token_in_token_out(result, recorder)
    assert_logprobs_match_forward(hf_model, result)
    later = [s for ep in result.episodes for s in ep.steps if s.prompt_source == "extend"]
    assert all(s.num_cached_tokens > 0 for s in later)  # the previous prompt is in vLLM's prefix cache
    assert result.stats.cached_share > 0.5


@pytest.mark.vllm
def test_vllm_prompt_at_max_model_len_ends_cleanly(
    vllm_engine: Any, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    """A prompt a few tokens under the engine's maximum: the engine clips the generation to the room left, and
    the next prompt, which no longer fits, ends the episode instead of reaching the engine."""
    max_len = vllm_engine.max_model_len
    task = make_task("retention", 3, "easy")
    harness = HarnessConfig(
        budget=4 * max_len, reserve=64, max_steps=8, task_budget=False
    )  # never overflows first

    def config(words: int, **fields: Any) -> RolloutConfig:
        return RolloutConfig(group_size=1, skill="alpha " * words, **fields)

    def first_prompt_len(words: int) -> int:
        probe = Recorder(ScriptedEngine(lambda ids: "", tiny_tokenizer, max_model_len=4 * max_len))
        rollout(
            probe,
            tiny_tokenizer,
            [task],
            config(words, max_steps=1),
            workdir=tmp_path / "probe",
            harness=harness,
        )
        return len(probe.calls[0][0][0])

    base = first_prompt_len(0)
    words = int((max_len - 12 - base) / ((first_prompt_len(1000) - base) / 1000))
    assert max_len - 40 < first_prompt_len(words) < max_len

    recorder = Recorder(vllm_engine)
    result = rollout(
        recorder,
        tiny_tokenizer,
        [task],
        config(words),
        workdir=tmp_path / "ws",
        harness=harness,
        sampling=replace(SAMPLED, ignore_eos=True, max_new_tokens=64),
    )
    [ep] = result.episodes
    assert ep.end_reason == "max_model_len" and not ep.success
    [step] = ep.steps
    assert step.finish_reason == "length" and len(step.prompt_ids) + len(step.token_ids) == max_len
    assert len(recorder.calls) == 1  # the too-long prompt never reached the engine


# ---------------------------------------------------------------------------------- OpenAI-compatible server


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[Any]:
    from ctxrl.train.engines.server import VLLMServer

    with VLLMServer(tiny_model_dir, max_model_len=4096, startup_timeout=240.0) as srv:
        yield srv


@pytest.mark.vllm
@pytest.mark.slow
def test_server_rollout_is_token_in_token_out(
    server: Any, tiny_tokenizer: Any, hf_model: Any, tmp_path: Path
) -> None:
    from ctxrl.train.engines import EngineConfig, make_engine

    recorder = Recorder(make_engine(EngineConfig(name="vllm-server", server_url=server.url)))
    result = short_rollout(recorder, tiny_tokenizer, tmp_path, max_steps=3, sandbox=SandboxConfig())
    assert all(ep.engine == "vllm-server" for ep in result.episodes)
    assert_token_in_token_out(result, recorder)
    assert_logprobs_match_forward(hf_model, result)
    later = [s for ep in result.episodes for s in ep.steps if s.prompt_source == "extend"]
    assert all(s.num_cached_tokens > 0 for s in later)


# ------------------------------------------------------------------------------------------- ctxrl rollout


def test_cli_rollout_writes_trajectories_and_a_summary(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ctxrl.cli import main

    out = tmp_path / "run"
    argv = ["rollout", "engine.name=scripted", "--model", str(tiny_model_dir), "--out", str(out)]
    assert main([*argv, "tasks.families=[retention,repo]", "tasks.count=2", "rollout.group_size=2"]) == 0
    episodes = load_trajectories(out / "trajectories.jsonl")
    assert [(ep.family, ep.group, ep.index) for ep in episodes] == [
        ("retention", 0, 0),
        ("retention", 0, 1),
        ("repo", 1, 0),
        ("repo", 1, 1),
    ]
    assert all(ep.end_reason == "submit" and ep.cost_flops and ep.cost_flops > 0 for ep in episodes)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 4 and summary["env_steps"] == sum(len(ep.steps) for ep in episodes)
    printed = capsys.readouterr().out
    assert "episodes          4" in printed and "cached-token share" in printed and "tokens/s" in printed
    assert not (out / "workspaces").exists()


def test_cli_rollout_bad_input_is_one_line_exit_1(
    tiny_tokenizer: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ctxrl.cli import main
    from ctxrl.train.engines.server import free_port

    tokenizer_only = tmp_path / "tok"
    tiny_tokenizer.save_pretrained(tokenizer_only)
    out = tmp_path / "run"
    assert main(["rollout", "engine.name=hf", "--model", str(tokenizer_only), "--out", str(out / "a")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a model folder" in err[0]
    url = f"http://127.0.0.1:{free_port()}"
    server = ["engine.name=vllm-server", f"engine.server_url={url}", "engine.retries=0"]
    assert main(["rollout", *server, "--model", str(tokenizer_only), "--out", str(out / "b")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot be reached" in err[0]
    assert main(["rollout", "engine.name=scripted", "tasks.families=[nope]", "--out", str(out / "c")]) == 1
    assert "unknown family 'nope'" in capsys.readouterr().err
