"""A checkpoint write killed at its renames (SIGKILL, a real process) leaves the last good checkpoint:
``latest`` names it and a resume restores its weights, whatever the killed write left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ctxrl.train.checkpoint import load_checkpoint
from ctxrl.train.config import TrainConfig
from ctxrl.train.policy import load_policy

ROOT = Path(__file__).parents[2]

SAVE_TWICE = """
import os, signal, sys
from pathlib import Path
from types import SimpleNamespace

import torch

from ctxrl.train import checkpoint
from ctxrl.train.config import TrainConfig
from ctxrl.train.policy import load_policy

out, model_dir, kill_at = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
config = TrainConfig()
policy = load_policy(model_dir, config)
optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
acc = SimpleNamespace(is_main_process=True, process_index=0, wait_for_everyone=lambda: None)
checkpoint.save_checkpoint(out, 1, policy, optimizer, acc, config)
with torch.no_grad():
    for p in policy.parameters():
        p.add_(1.0)
renames, rename = [0], os.replace


def killing_rename(src, dst):
    renames[0] += 1
    if renames[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)  # no handler, no cleanup: as a kill -9 from outside
    rename(src, dst)


checkpoint.os.replace = killing_rename
checkpoint.save_checkpoint(out, 2, policy, optimizer, acc, config)
"""


def _first_weight(model: torch.nn.Module) -> torch.Tensor:
    return next(model.parameters()).detach().clone()


@pytest.mark.parametrize(
    ("kill_at", "left"),
    [
        (1, [".step-000002.tmp", "latest", "step-000001"]),  # killed at the folder's rename
        (
            2,
            [".latest.tmp", "latest", "step-000001", "step-000002"],
        ),  # at the pointer's: step 2 whole, unnamed
        (0, ["latest", "step-000001", "step-000002"]),  # not killed: step 2 is the latest
    ],
)
def test_a_kill_between_write_and_rename_leaves_the_last_good_checkpoint(
    kill_at: int, left: list[str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", SAVE_TWICE, str(out), str(tiny_model_dir), str(kill_at)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == (-signal.SIGKILL if kill_at else 0), done.stderr[-3000:]
    root = out / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == left
    good = "step-000002" if kill_at == 0 else "step-000001"
    assert (root / "latest").read_text() == good

    config = TrainConfig()
    initial = _first_weight(load_policy(tiny_model_dir, config))
    policy = load_policy(tiny_model_dir, config)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    state = load_checkpoint(out, policy, optimizer, rank=0)
    assert state["step"] == int(good[-1])
    # step 1 holds the initial weights; step 2 the weights after the +1 (a resume never sees half of it)
    expected = initial + (1.0 if kill_at == 0 else 0.0)
    torch.testing.assert_close(_first_weight(policy), expected, rtol=0, atol=0)


def test_a_resumed_runs_metrics_drop_a_line_cut_short_by_the_kill(tmp_path: Path) -> None:
    from ctxrl.errors import UsageError
    from ctxrl.train.run_folder import truncate_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n{"step": 3, "lo')
    truncate_metrics(path, 2)
    assert path.read_text() == '{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n'
    truncate_metrics(path, 1)  # steps past the checkpoint go too
    assert path.read_text() == '{"step": 1, "loss": 0.5}\n'
    # damage anywhere but the last line is not a kill's: it is named, and nothing is rewritten
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(UsageError, match=r"metrics.jsonl: record 2 of 3 is not JSON"):
        truncate_metrics(path, 2)
    path.write_text('{"step": 1}\n[2]\n')
    with pytest.raises(UsageError, match="record 2 has no step number"):
        truncate_metrics(path, 2)
    assert path.read_text() == '{"step": 1}\n[2]\n'


def test_a_damaged_or_foreign_checkpoint_is_one_usage_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    from accelerate import Accelerator

    from ctxrl.errors import UsageError
    from ctxrl.train.checkpoint import save_checkpoint
    from ctxrl.train.config import LoraSettings

    config = TrainConfig(lora=LoraSettings(enabled=True, r=4, dropout=0.0))
    policy = load_policy(tiny_model_dir, config)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
    ckpt = save_checkpoint(tmp_path, 1, policy, optimizer, Accelerator(cpu=True), config)
    # another rank of LoRA: the same parameter names, other shapes
    other = load_policy(tiny_model_dir, TrainConfig(lora=LoraSettings(enabled=True, r=8, dropout=0.0)))
    with pytest.raises(UsageError, match=r"lora_A.*is \(4, \d+\) there, \(8, \d+\) here"):
        load_checkpoint(tmp_path, other, torch.optim.AdamW(other.parameters()), rank=0)
    state = (ckpt / "state.json").read_text()
    (ckpt / "state.json").write_text(state[:-5])
    with pytest.raises(UsageError, match=r"state.json cannot be read .*checkpoints/latest"):
        load_checkpoint(tmp_path, policy, optimizer, rank=0)
    (ckpt / "state.json").write_text(state)
    data = (ckpt / "trainable.pt").read_bytes()
    (ckpt / "trainable.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(UsageError, match=r"trainable.pt cannot be read"):
        load_checkpoint(tmp_path, policy, optimizer, rank=0)
    (tmp_path / "checkpoints" / "latest").write_text("step-000009")
    with pytest.raises(UsageError, match="names step-000009, which does not exist"):
        load_checkpoint(tmp_path, policy, optimizer, rank=0)
