"""``ctxrl export``: a run folder with checkpoints of the tiny model (written by GRPO's own ``save_checkpoint``,
with and without a LoRA adapter) exported, reloaded and compared with the checkpoint; clear errors; and the
exported folder served by vLLM's OpenAI-compatible server, called with the real ``openai`` client and by
``ctxrl rollout`` through multi-turn episodes (one server for the module)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from ctxrl.cli import main
from ctxrl.commands.config import RunConfig, dump_run_config, load_run_config
from ctxrl.env.config import HarnessConfig
from ctxrl.env.modes import default_skill
from ctxrl.errors import ConfigError, UsageError
from ctxrl.publish.export import (
    ExportMismatchError,
    export_run,
    exported_from,
    find_checkpoint,
    load_training_model,
    verify_export,
)
from ctxrl.train.rollout import RolloutConfig

EVOLVED_SKILL = "# Evolved skill\n\nKeep the key-value pairs in a note; drop raw chunks once noted.\n"
EVAL_ROW = "| tools | retention | 2/10 | 0.20 |"


def make_run(run: Path, base: Path, *, lora: bool, steps: tuple[int, ...] = (3,), skill: bool = True) -> Path:
    """A run folder as training leaves it: checkpoints of perturbed weights, config.yaml, eval table, skill."""
    from accelerate import Accelerator

    from ctxrl.config import load_config
    from ctxrl.train.checkpoint import save_checkpoint
    from ctxrl.train.config import TrainConfig
    from ctxrl.train.policy import load_policy

    config = load_config(TrainConfig, {"lora": {"enabled": lora, "r": 4}})
    policy = load_policy(base, config)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
    acc = Accelerator(cpu=True)
    gen = torch.Generator().manual_seed(7)
    for step in steps:
        with torch.no_grad():  # stands in for training: every trainable tensor moves
            for p in policy.parameters():
                if p.requires_grad:
                    p.add_(torch.randn(p.shape, generator=gen) * (0.05 if lora else 0.02))
        save_checkpoint(run, step, policy, optimizer, acc, config)
    run_config = RunConfig(
        model=str(base),
        harness=HarnessConfig(gate="shrink"),
        rollout=RolloutConfig(mode="tools", max_steps=3, group_size=2),
    )
    (run / "config.yaml").write_text(dump_run_config(run_config))
    (run / "eval").mkdir()
    (run / "eval" / "eval.md").write_text(
        "# ctxrl eval\n\n| mode | family | solved | success |\n|---|---|---|---|\n" + EVAL_ROW + "\n"
    )
    if skill:
        (run / "best_skill").mkdir()
        (run / "best_skill" / "SKILL.md").write_text(EVOLVED_SKILL)
    return run


def logits(model: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    return make_run(tmp_path_factory.mktemp("lora") / "run", tiny_model_dir, lora=True)


@pytest.fixture(scope="module")
def lora_export(tmp_path_factory: pytest.TempPathFactory, lora_run: Path) -> Path:
    out = tmp_path_factory.mktemp("exports") / "lora"
    export_run(lora_run, out, verify=False, max_shard_size="4MB")
    return out


PROBE = "<|im_start|>user\nread context.md and keep key_0042<|im_end|>\n<|im_start|>assistant\n"


def test_lora_export_merges_and_matches_the_checkpoint(
    lora_run: Path, lora_export: Path, tiny_model_dir: Path, tiny_tokenizer: Any
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = lora_export
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) >= 2 and (out / "model.safetensors.index.json").is_file()  # 12 MB at 4 MB a shard
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    assert not any("lora" in name for name in exported.state_dict())  # merged, not an adapter
    ckpt = find_checkpoint(lora_run)
    assert ckpt.step == 3 and ckpt.adapter and ckpt.base_model == tiny_model_dir
    trained = load_training_model(ckpt)
    ids = tiny_tokenizer.encode(PROBE, add_special_tokens=False)
    got, want = logits(exported, ids), logits(trained, ids)
    assert (got - want).abs().max().item() < 1e-5
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    assert (logits(base, ids) - want).abs().max().item() > 1e-2  # the adapter mattered

    tok = AutoTokenizer.from_pretrained(out)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    assert tok.chat_template == tiny_tokenizer.chat_template
    assert tok.apply_chat_template(messages, tokenize=False) == tiny_tokenizer.apply_chat_template(
        messages, tokenize=False
    )
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")

    assert (out / "SKILL.md").read_text() == EVOLVED_SKILL
    harness = load_run_config(out / "harness.yaml")  # a run config `ctxrl rollout --config` accepts
    assert harness.harness.gate == "shrink" and harness.rollout.mode == "tools"
    assert harness.rollout.max_steps == 3 and harness.rollout.skill == EVOLVED_SKILL
    card = (out / "README.md").read_text()
    assert EVAL_ROW in card and "--enable-prefix-caching" in card and "# ctxrl eval" not in card
    meta = json.loads((out / "ctxrl_export.json").read_text())
    assert meta["step"] == 3 and meta["kind"] == "merged-lora" and meta["lora"]["r"] == 4
    assert meta["skill_source"] == "best_skill/SKILL.md" and "README.md" in meta["files"]
    assert not list(out.parent.glob(".lora.partial-*"))  # the temporary folder was renamed away
    umask = os.umask(0)
    os.umask(umask)
    assert {p.stat().st_mode & 0o777 for p in out.iterdir()} == {0o666 & ~umask}  # as any file, none private


def test_full_model_export_of_an_earlier_step(
    tmp_path: Path, tiny_model_dir: Path, tiny_tokenizer: Any
) -> None:
    from transformers import AutoModelForCausalLM

    run = make_run(tmp_path / "run", tiny_model_dir, lora=False, steps=(1, 2), skill=False)
    assert find_checkpoint(run).step == 2  # `latest`
    out = tmp_path / "empty-out"
    out.mkdir()  # an empty folder is fine
    result = export_run(run, out, step=1, verify=False)
    assert result.checkpoint.step == 1 and not result.checkpoint.adapter
    ids = tiny_tokenizer.encode(PROBE, add_special_tokens=False)
    step1 = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step-000001" / "model").eval()
    step2 = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step-000002" / "model").eval()
    got = logits(AutoModelForCausalLM.from_pretrained(out).eval(), ids)
    assert (got - logits(step1, ids)).abs().max().item() < 1e-5
    assert (got - logits(step2, ids)).abs().max().item() > 1e-2
    assert (out / "model.safetensors").is_file()  # 12 MB: one shard at the default 2 GB
    # no evolved skill and no rollout.skill: the mode's default skill
    assert (out / "SKILL.md").read_text() == default_skill("tools")
    assert json.loads((out / "ctxrl_export.json").read_text())["kind"] == "full"
    # what `ctxrl eval` records of the model it evaluated: this run's step 1; nothing for a base model
    assert exported_from(out) == {"run": str(run), "step": 1}
    assert exported_from(tiny_model_dir) is None and exported_from(None) is None


def test_adapter_only_writes_the_adapter_and_tokenizer(lora_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "adapter"
    result = export_run(lora_run, out, adapter_only=True)
    names = {p.name for p in out.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= names
    assert not any(n.startswith("model") or n == "config.json" or n == "SKILL.md" for n in names)
    ckpt_adapter = lora_run / "checkpoints" / "step-000003" / "model" / "adapter_model.safetensors"
    assert (out / "adapter_model.safetensors").read_bytes() == ckpt_adapter.read_bytes()
    assert result.verification is not None and result.verification.max_logprob_diff < 1e-5


def test_errors_name_the_missing_run_step_and_refuse_to_overwrite(
    lora_run: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    with pytest.raises(UsageError, match=r"run folder .*nope does not exist"):
        export_run(tmp_path / "nope", tmp_path / "o1")
    empty_run = tmp_path / "untrained"
    empty_run.mkdir()
    with pytest.raises(UsageError, match="has no checkpoints"):
        export_run(empty_run, tmp_path / "o2")
    with pytest.raises(UsageError, match=r"no checkpoint of step 7 \(checkpoints: steps 3\)"):
        export_run(lora_run, tmp_path / "o3", step=7)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="is not empty"):
        export_run(lora_run, busy, verify=False)
    assert [p.name for p in busy.iterdir()] == ["keep.txt"]
    full = make_run(tmp_path / "full", tiny_model_dir, lora=False, skill=False)
    with pytest.raises(UsageError, match="--adapter-only needs a LoRA run"):
        export_run(full, tmp_path / "o4", adapter_only=True)
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o4").exists()


def test_cli_errors_are_one_line(lora_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--run", str(lora_run), "--step", "9", "--out", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("ctxrl export: error:") and "step 9" in err and "\n" not in err
    assert main(["export", "--run", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 1
    assert "missing does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # paths only: no --overwrite
        main(["export", "--run", str(lora_run), "--out", str(tmp_path / "x"), "--overwrite"])


def test_verification_catches_weights_that_are_not_the_trained_ones(
    lora_run: Path, lora_export: Path, tmp_path: Path
) -> None:
    """The transformers engine on the export passes; on a copy with other weights it fails loudly."""
    from safetensors.torch import load_file, save_file

    from ctxrl.train.engines import EngineConfig, make_engine

    ckpt = find_checkpoint(lora_run)
    reference = load_training_model(ckpt)
    good = verify_export(
        lora_export, ckpt, engine=make_engine(EngineConfig(name="hf"), lora_export), model=reference,
        num_prompts=1, max_new_tokens=6,
    )  # fmt: skip
    assert good.engine == "hf" and good.prompts == 1 and good.generated_tokens == 6
    assert good.max_logprob_diff < 1e-4 and min(good.prompt_tokens) > 500  # real first prompts of episodes

    bad = tmp_path / "bad"
    shutil.copytree(lora_export, bad)
    for shard in bad.glob("model-*.safetensors"):
        tensors = load_file(shard)
        save_file({k: v * 1.05 if v.ndim == 2 else v for k, v in tensors.items()}, shard, {"format": "pt"})
    with pytest.raises(ExportMismatchError, match="held-out prompt 0, token 0"):
        verify_export(
            bad, ckpt, engine=make_engine(EngineConfig(name="hf"), bad), model=reference,
            num_prompts=1, max_new_tokens=4,
        )  # fmt: skip


# ---- vLLM: the command's in-process check, then the OpenAI-compatible server ----------------------------------


@pytest.fixture(scope="module")
def verified_export(lora_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """``ctxrl export`` itself: written, verified by the in-process vLLM engine, commands printed. It runs as
    its own process: a second in-process vLLM engine, closed, would tear down the state of the session's."""
    import os
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("cli") / "served"
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src}
    argv = [sys.executable, "-m", "ctxrl.cli", "export", "--run", str(lora_run), "--out", str(out)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    yield out, done.stdout


@pytest.fixture(scope="module")
def server(verified_export: tuple[Path, str]) -> Iterator[Any]:
    from ctxrl.train.engines.server import VLLMServer

    with VLLMServer(verified_export[0], max_model_len=8192, startup_timeout=240.0) as srv:
        yield srv


@pytest.mark.vllm
@pytest.mark.slow
def test_export_command_verifies_in_vllm_and_prints_the_serve_commands(
    verified_export: tuple[Path, str],
) -> None:
    out, printed = verified_export
    meta = json.loads((out / "ctxrl_export.json").read_text())
    v = meta["verification"]
    assert v["engine"] == "vllm" and v["prompts"] == 3 and v["generated_tokens"] == 3 * 24
    assert 0 <= v["max_logprob_diff"] < 1e-4  # fp32 on both sides: measured 2e-6 on the tiny model
    assert "verified with vllm" in printed and "max |logprob diff|" in printed
    assert f"python -m vllm.entrypoints.openai.api_server --model {out}" in printed
    assert "--enable-prefix-caching --enable-prompt-tokens-details" in printed
    assert f"ctxrl rollout --config {out / 'harness.yaml'} engine.name=vllm-server" in printed


@pytest.mark.vllm
@pytest.mark.slow
def test_openai_client_multi_turn_chat_against_the_served_export(
    server: Any, verified_export: tuple[Path, str]
) -> None:
    from openai import OpenAI
    from transformers import AutoTokenizer

    out = verified_export[0]
    tokenizer = AutoTokenizer.from_pretrained(out)
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120.0)
    [model] = [m.id for m in client.models.list().data]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": (out / "SKILL.md").read_text() * 4},  # > one 128-token KV block
        {"role": "user", "content": "Open context.md and tell me what key_0042 is."},
    ]
    for turn in range(3):
        reply = client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=12,
            temperature=0.0,  # type: ignore[arg-type]
        )
        usage = reply.usage
        assert usage is not None and usage.completion_tokens > 0
        # the server renders with the exported chat template: same prompt length as the tokenizer's
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert usage.prompt_tokens == len(tokenizer.encode(text, add_special_tokens=False))
        if turn > 0:  # the skill prefix is served from the prefix cache
            details = usage.prompt_tokens_details
            assert details is not None and (details.cached_tokens or 0) >= 128
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content or ""},
            {"role": "user", "content": f"turn {turn + 1}: and key_{turn:04d}?"},
        ]


@pytest.mark.vllm
@pytest.mark.slow
def test_printed_rollout_command_runs_episodes_against_the_server(
    server: Any, verified_export: tuple[Path, str], tmp_path: Path
) -> None:
    """``ctxrl rollout --config DIR/harness.yaml engine.name=vllm-server ...``: token in / token out over
    several steps, ids and logprobs those of the exported model in transformers."""
    from transformers import AutoModelForCausalLM

    out = verified_export[0]
    runs = tmp_path / "rollout"
    argv = [
        "rollout", "--config", str(out / "harness.yaml"), "engine.name=vllm-server",
        f"engine.server_url={server.url}", "--model", str(out), "--out", str(runs),
        "tasks.count=1", "rollout.group_size=2", "sampling.max_new_tokens=16", "sampling.temperature=1.0",
    ]  # fmt: skip
    assert main(argv) == 0
    [line1, line2] = (runs / "trajectories.jsonl").read_text().splitlines()
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    for line in (line1, line2):
        ep = json.loads(line)
        assert ep["mode"] == "tools" and len(ep["steps"]) >= 2  # harness.yaml: tools mode, 3 steps at most
        for k, st in enumerate(ep["steps"]):
            ids = st["prompt_ids"] + st["token_ids"]
            lp = torch.log_softmax(logits(exported, ids)[len(st["prompt_ids"]) - 1 : -1], dim=-1)
            ref = lp.gather(-1, torch.tensor(st["token_ids"]).unsqueeze(-1)).squeeze(-1)
            assert (ref - torch.tensor(st["logprobs"])).abs().max().item() < 1e-3
            if k > 0 and st["prompt_source"] == "extend":
                assert st["num_cached_tokens"] >= 128
    config = yaml.safe_load((runs / "config.yaml").read_text())
    assert config["rollout"]["skill"] == EVOLVED_SKILL and config["harness"]["gate"] == "shrink"


def test_a_run_config_saved_before_keys_moved_still_loads() -> None:
    """A run folder from before ``rollout.task_budget`` became ``harness.task_budget`` and the train
    section nested ``loss`` and ``reward``: export reads its config.yaml through the upgrade."""
    from ctxrl.commands.config import load_run_config
    from ctxrl.train.run_folder import upgrade_saved_config

    old = {
        "rollout": {"mode": "file", "task_budget": False},
        "harness": {"budget": 9000},
        "train": {"graded": True, "penalties": {"no_tool_call": 0.3}, "tis_cap": 1.5, "lr": 1e-4},
    }
    with pytest.raises(ConfigError, match="task_budget"):
        load_run_config(old)
    run = load_run_config(upgrade_saved_config(old))
    assert run.harness.task_budget is False and run.harness.budget == 9000
    assert run.train.reward.graded and run.train.reward.penalties.no_tool_call == 0.3
    assert run.train.loss.tis_cap == 1.5 and run.train.lr == 1e-4
    assert "task_budget" in old["rollout"]  # the saved data itself is not changed
