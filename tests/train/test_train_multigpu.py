"""The multi-GPU launcher: it reads the accelerate configs in configs/accelerate/, and on CUDA machines it
trains one step on every GPU (marked ``gpu``: skipped without CUDA)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "scripts" / "train_multigpu.sh"


@pytest.mark.parametrize(("name", "kind"), [("ddp", "MULTI_GPU"), ("deepspeed_zero2", "DEEPSPEED")])
def test_accelerate_configs_exist_and_say_what_they_launch(name: str, kind: str) -> None:
    path = ROOT / "configs" / "accelerate" / f"{name}.yaml"
    assert path.read_text().startswith("# accelerate launch --config_file configs/accelerate/")
    assert yaml.safe_load(path.read_text())["distributed_type"] == kind


def test_the_launcher_refuses_an_unknown_accelerate_config() -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT), "--accelerate", "fsdp9", "--", "--out", "x"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "no accelerate config" in done.stderr and "ddp.yaml" in done.stderr


@pytest.mark.gpu
def test_one_step_on_every_gpu(tmp_path: Path) -> None:
    import torch

    out = tmp_path / "run"
    env = {**os.environ, "PYTHON": sys.executable}
    args = ["--config", str(ROOT / "configs" / "train_tiny.yaml"), "train.steps=1", "tasks.count=1"]
    subprocess.run(
        ["bash", str(SCRIPT), "--accelerate", "ddp", "--", *args, "--out", str(out)],
        check=True,
        env=env,
        timeout=900,
    )
    [line] = (out / "metrics.jsonl").read_text().splitlines()
    # every rank rolled out its own task: G episodes each
    assert json.loads(line)["rollout/episodes"] == 4.0 * torch.cuda.device_count()
