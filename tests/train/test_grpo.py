"""The GRPO loop on the tiny model with a deterministic engine: an update changes the weights, the engine
receives them, metrics and checkpoints are written, and a resumed run repeats the uninterrupted one."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from ctxrl.commands.config import load_run_config
from ctxrl.config import load_config
from ctxrl.errors import ConfigError, UsageError
from ctxrl.rewards.advantages import AdvantageConfig
from ctxrl.train.config import TrainConfig
from ctxrl.train.engines.base import Generation, SamplingConfig
from ctxrl.train.grpo import TaskBatches, TrainResult, train
from ctxrl.train.rollout import RolloutConfig


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class TwoStyleEngine:
    """Even batch positions follow a script (read, ls, edit the context file, submit); odd ones only talk.

    Both styles fail the task; with the no-tool-call penalty the talkers score lower, so every group has
    reward variance. Deterministic, so a resumed run sees the same rollouts. Logprobs are a constant -1.
    """

    name = "two-style"
    max_model_len = 8192
    supports_sleep = False

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.synced: list[dict[str, torch.Tensor]] = []
        self.script = [
            call("next_chunk"),
            "checking " + call("shell", command="ls"),
            "tidy " + call("shell", command="sed -i 's/registry/REG/g' context.md"),
            "done " + call("submit", answer="nothing kept"),
        ]

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[Generation]:
        out = []
        for b, prompt in enumerate(prompts):
            turn = self.tokenizer.decode(list(prompt)).count("<|im_start|>assistant") - 1
            text = self.script[min(turn, 3)] if b % 2 == 0 else "let me think about it"
            ids = [*self.tokenizer.encode(text, add_special_tokens=False), int(self.tokenizer.eos_token_id)]
            out.append(Generation(ids, [-1.0] * len(ids), "stop", 0))
        return out

    def update_weights(self, weights: Any) -> None:
        self.synced.append({k: v.detach().clone() for k, v in weights.state_dict().items()})

    def sleep(self) -> None: ...

    def wake(self) -> None: ...

    def close(self) -> None: ...


def run(
    model_dir: Path,
    out: Path,
    engine: Any,
    tokenizer: Any,
    *,
    max_steps: int = 4,
    resume: bool = False,
    **fields: Any,
) -> TrainResult:
    """``train`` on one easy retention task, G = 2, with the two-style engine (``fields``: the train section)."""
    config = load_config(
        TrainConfig, {"steps": 1, "reward": {"penalties": {"no_tool_call": 0.3}}, "lr": 1e-3, **fields}
    )
    return train(
        config,
        model_dir=model_dir,
        engine=engine,
        tokenizer=tokenizer,
        tasks=TaskBatches(("retention",), "train", "easy", count=1),
        rollout_config=RolloutConfig(group_size=2, max_steps=max_steps),
        advantages=AdvantageConfig(drop_zero_variance="signal"),
        sampling=SamplingConfig(max_new_tokens=64),
        out=out,
        resume=resume,
    )


def params(model_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return dict(AutoModelForCausalLM.from_pretrained(model_dir).state_dict())


def test_one_step_updates_the_weights_and_syncs_the_engine(
    tiny_model_dir: Path, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    engine = TwoStyleEngine(tiny_tokenizer)
    result = run(tiny_model_dir, tmp_path / "run", engine, tiny_tokenizer)
    m = result.metrics[0]
    assert m["step"] == 1.0 and m["rollout/episodes"] == 2.0
    assert m["reward/mean"] == pytest.approx(-0.15)  # one episode 0, the talker -0.3
    assert m["loss/tokens"] > 0 and torch.isfinite(torch.tensor(m["loss/loss"]))
    # packing: auto prices both layouts (rows.cheaper_layout): these three rows of a few hundred tokens each
    # pad into one batch cheaper than one packed line, whose attention spans all three
    assert m["cost/packed"] == 0.0
    # the scripted episode edited once: its 4 steps make 2 rows; the talker's 4 steps 1 row
    assert m["cost/rows_per_episode"] == 1.5
    assert 0 < m["cost/packed_vs_naive_tokens"] < 0.5
    before = params(tiny_model_dir)
    assert len(engine.synced) == 1
    changed = [k for k, v in engine.synced[0].items() if not torch.equal(v, before[k])]
    assert changed, "the update changed no parameter"
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["loss/tokens"] == m["loss/tokens"]
    spaces = {key.split("/")[0] for key in json.loads(lines[0]) if "/" in key}
    assert spaces >= {"rollout", "reward", "loss", "cost", "time"}
    assert m["rollout/generate_calls"] == 4.0  # 4 steps of 2 episodes, batched
    ckpt = tmp_path / "run" / "checkpoints"
    assert (ckpt / "latest").read_text() == "step-000001"
    assert {p.name for p in (ckpt / "step-000001").iterdir()} >= {
        "model",
        "trainable.pt",
        "optimizer.pt",
        "state.json",
        "rng-0.pt",
    }
    with pytest.raises(UsageError, match="already holds checkpoints"):
        run(tiny_model_dir, tmp_path / "run", engine, tiny_tokenizer)


def test_packing_packed_and_padded_give_the_same_update(
    tiny_model_dir: Path, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    packed = run(
        tiny_model_dir, tmp_path / "a", TwoStyleEngine(tiny_tokenizer), tiny_tokenizer, packing="packed"
    )
    padded = run(
        tiny_model_dir, tmp_path / "b", TwoStyleEngine(tiny_tokenizer), tiny_tokenizer, packing="padded"
    )
    (a,), (b,) = packed.metrics, padded.metrics
    assert (a["cost/packed"], b["cost/packed"]) == (1.0, 0.0)
    assert a["loss/loss"] == pytest.approx(b["loss/loss"], abs=1e-5)
    assert a["loss/grad_norm"] == pytest.approx(b["loss/grad_norm"], rel=1e-4)


def test_resumed_run_repeats_the_uninterrupted_one(
    tiny_model_dir: Path, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    whole_engine = TwoStyleEngine(tiny_tokenizer)
    # two-step episodes (no edit yet) keep this test's four updates short; a linear decay over 4 rounds, which
    # the resumed part must take up at its second rate (the optimiser state it loads holds the first)
    decay = {"lr_schedule": "linear", "lr_schedule_steps": 4}
    whole = run(tiny_model_dir, tmp_path / "a", whole_engine, tiny_tokenizer, max_steps=2, steps=2, **decay)
    assert [m["train/lr"] for m in whole.metrics] == [1e-3, 7.5e-4]
    # "killed" after step 1: a run of 1 step, then resumed to 2
    run(
        tiny_model_dir,
        tmp_path / "b",
        TwoStyleEngine(tiny_tokenizer),
        tiny_tokenizer,
        max_steps=2,
        steps=1,
        **decay,
    )
    # a kill in the middle of writing step 2's checkpoint leaves its temporary folder, half written; `latest`
    # still names step 1, and the resume neither reads nor trips over the debris
    debris = tmp_path / "b" / "checkpoints" / ".step-000002.tmp"
    debris.mkdir()
    (debris / "trainable.pt").write_bytes(b"half a tensor")
    resumed_engine = TwoStyleEngine(tiny_tokenizer)
    resumed = run(
        tiny_model_dir,
        tmp_path / "b",
        resumed_engine,
        tiny_tokenizer,
        max_steps=2,
        steps=2,
        resume=True,
        **decay,
    )
    assert (resumed.first_step, len(resumed.metrics)) == (1, 1)
    a, b = whole.metrics[1], resumed.metrics[0]
    for key in (
        "loss/loss",
        "loss/kl",
        "loss/ratio_mean",
        "loss/tis_mean",
        "loss/grad_norm",
        "reward/mean",
        "train/lr",
    ):
        assert a[key] == b[key], key
    # the resumed engine got the checkpoint's weights first, then step 2's, equal to the whole run's
    assert len(resumed_engine.synced) == 2
    for k, v in whole_engine.synced[-1].items():
        assert torch.equal(v, resumed_engine.synced[-1][k]), k
    # and the optimiser state was restored, not restarted: after step 2 both runs hold the same Adam moments
    # and step counts (an on-policy loss would be equal without them; these would not)
    saved = [
        torch.load(tmp_path / r / "checkpoints" / "step-000002" / "optimizer.pt", weights_only=False)
        for r in ("a", "b")
    ]
    assert [group["lr"] for s in saved for group in s["param_groups"]] == [
        7.5e-4,
        7.5e-4,
    ]  # the rate it stepped at
    states = [s["state"] for s in saved]
    assert states[0].keys() == states[1].keys() and states[0]
    for i, st in states[0].items():
        for name, value in st.items():
            assert torch.equal(value, states[1][i][name]), (i, name)
    assert not debris.exists()


TINY = [
    "--config",
    str(Path(__file__).parents[2] / "configs" / "train_tiny.yaml"),
    "engine.name=hf",
    "tasks.count=1",
    "rollout.group_size=2",
    "rollout.max_steps=2",
    "sampling.max_new_tokens=8",
]


def test_ctxrl_train_end_to_end_and_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ctxrl.cli import main

    out = tmp_path / "run"
    assert main(["train", *TINY, "train.steps=1", "--out", str(out)]) == 0
    assert (out / "model" / "config.json").is_file()  # no model given: the tiny model, built into the run
    assert load_run_config(out / "config.yaml").train.steps == 1  # the resolved config, in the run folder
    assert (out / "checkpoints" / "latest").read_text() == "step-000001"
    assert "step 1: success 0.00" in capsys.readouterr().out  # the one human line per step
    assert main(["train", *TINY, "train.steps=2", "--out", str(out), "--resume"]) == 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1.0, 2.0]
    assert lines[1]["rollout/episodes"] == 2.0 and lines[1]["rollout/generate_calls"] <= 2.0
    # the random model makes no well-formed call: reward 0 - 0.3 for both, no signal; the update still runs
    # (drop_zero_variance: none) on at most 2 episodes x 2 steps x 8 tokens, with a zero loss
    assert lines[1]["reward/mean"] == pytest.approx(-0.3) and lines[1]["loss/loss"] == 0.0
    assert 0 < lines[1]["loss/tokens"] <= 32
    assert (out / "checkpoints" / "latest").read_text() == "step-000002"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.learning_rate=0.1", "unknown config key 'train.learning_rate'"),
        ("rollout.group_size=1", "GRPO needs >= 2 episodes per task"),
    ],
)
def test_ctxrl_train_bad_config_is_one_line(
    override: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ctxrl.cli import main

    assert main(["train", *TINY, override, "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("ctxrl train: error: ") and message in err and "\n" not in err
    assert not (tmp_path / "run").exists()  # nothing written before the check


class HalfSolvingEngine(TwoStyleEngine):
    """Every other episode plays the scripted file manager (it solves the `mini` retention rung), the others
    only talk: every group of two holds one success and one failure. Episodes run in worker threads, one
    prompt per call, so the style is picked on an episode's first turn (alternating) and read back from its
    own history after that."""

    def __init__(self, tokenizer: Any) -> None:
        import threading

        from ctxrl.env.policies import make_policy

        super().__init__(tokenizer)
        self.solver = make_policy("file-manager")
        self.lock, self.started = threading.Lock(), 0

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[Generation]:
        out = []
        for prompt in prompts:
            seen = self.tokenizer.decode(list(prompt))
            if seen.count("<|im_start|>assistant") == 1:  # the first turn
                with self.lock:
                    talk, self.started = self.started % 2 == 1, self.started + 1
            else:
                talk = "let me think" in seen
            text = "let me think" if talk else self.solver(seen)
            ids = [*self.tokenizer.encode(text, add_special_tokens=False), int(self.tokenizer.eos_token_id)]
            out.append(Generation(ids, [-1.0] * len(ids), "stop", 0))
        return out


def test_graded_reward_is_a_warm_up_that_ends_when_groups_hold_successes(
    tiny_model_dir: Path, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    """``graded_until``: step 1 is graded; its group held a success, so step 2 and every later one, after
    a resume too, use success 1/0. Without it the run stays graded."""

    def go(out: Path, steps: int, resume: bool = False, **fields: Any) -> TrainResult:
        config = load_config(TrainConfig, {"steps": steps, "lr": 1e-4, "reward": {"graded": True}, **fields})
        return train(
            config,
            model_dir=tiny_model_dir,
            engine=HalfSolvingEngine(tiny_tokenizer),
            tokenizer=tiny_tokenizer,
            tasks=TaskBatches(("retention",), "train", "mini", count=1),
            rollout_config=RolloutConfig(group_size=2, max_steps=8),
            advantages=AdvantageConfig(),
            sampling=SamplingConfig(max_new_tokens=512),
            out=out,
            resume=resume,
        )

    first = go(tmp_path / "a", 2, graded_until=0.5)
    assert first.metrics[0]["reward/success"] == 0.5  # one of the two episodes solved the task
    assert [m["train/graded"] for m in first.metrics] == [1.0, 0.0]
    again = go(tmp_path / "a", 3, resume=True, graded_until=0.5)
    assert [m["train/graded"] for m in again.metrics] == [0.0]  # the switch survives the resume
    plain = go(tmp_path / "b", 2)
    assert [m["train/graded"] for m in plain.metrics] == [1.0, 1.0]
    with pytest.raises(ConfigError, match=r"graded_until=0\.5 needs reward\.graded: true"):
        load_config(TrainConfig, {"graded_until": 0.5})


def test_a_kept_lora_run_resumes_from_its_bf16_adapter_with_fresh_moments(
    tiny_model_dir: Path, tiny_tokenizer: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ctxrl.train.keep``: the committed slim copy of a run (no trainable.pt, no optimizer.pt, the adapter
    in bf16) brought back into a new folder resumes at its step with the bf16 adapter's weights, and says that
    AdamW starts afresh."""
    from safetensors.torch import load_file

    from ctxrl.train.keep import main as keep_main

    lora = {"lora": {"enabled": True, "r": 4}}
    first = TwoStyleEngine(tiny_tokenizer)
    run(tiny_model_dir, tmp_path / "a", first, tiny_tokenizer, max_steps=2, steps=1, **lora)
    assert keep_main([str(tmp_path / "a"), str(tmp_path / "kept")]) == 0
    kept = tmp_path / "kept" / "checkpoints" / "step-000001"
    assert (tmp_path / "kept" / "checkpoints" / "latest").read_text() == "step-000001"
    assert {p.name for p in kept.iterdir()} == {"model", "state.json", "rng-0.pt"}
    adapter = load_file(str(kept / "model" / "adapter_model.safetensors"))
    assert adapter and all(t.dtype == torch.bfloat16 for t in adapter.values())
    assert keep_main(["--restore", str(tmp_path / "kept"), str(tmp_path / "b")]) == 0
    assert keep_main(["--restore", str(tmp_path / "kept"), str(tmp_path / "b")]) == 1  # never over a run
    capsys.readouterr()

    engine = TwoStyleEngine(tiny_tokenizer)
    resumed = run(
        tiny_model_dir, tmp_path / "b", engine, tiny_tokenizer, max_steps=2, steps=2, resume=True, **lora
    )
    assert (resumed.first_step, len(resumed.metrics)) == (1, 1)
    assert "AdamW's moments start at zero" in capsys.readouterr().out
    # the engine first got the checkpoint's weights: step 1's adapter, rounded to bf16
    lora_keys = [k for k in first.synced[0] if "lora_" in k]
    assert lora_keys
    for k in lora_keys:
        assert torch.equal(engine.synced[0][k], first.synced[0][k].to(torch.bfloat16).float()), k
    assert any(not torch.equal(engine.synced[0][k], first.synced[0][k]) for k in lora_keys)
    # fresh moments: the optimiser has taken one step since the resume, not two
    state = torch.load(tmp_path / "b" / "checkpoints" / "step-000002" / "optimizer.pt", weights_only=False)
    assert {int(s["step"]) for s in state["state"].values()} == {1}


def test_the_grpo_module_is_the_loop() -> None:
    """``grpo.py`` reads top to bottom as the step: checkpoints, processes, the policy, the update and the
    metrics live in their own modules (issue: at most 350 lines)."""
    import ctxrl.train.grpo as grpo

    source = Path(grpo.__file__).read_text(encoding="utf-8")
    assert len(source.splitlines()) <= 350
    defined = set(re.findall(r"^(?:def|class) (\w+)", source, re.MULTILINE))
    assert defined == {"TaskBatches", "TrainResult", "check_setup", "train"}
