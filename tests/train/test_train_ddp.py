"""Two real training processes on the CPU: ``scripts/train_multigpu.sh`` starts ``ctxrl train`` on two gloo
ranks (``accelerate launch`` with no GPU present), plain DDP and DeepSpeed ZeRO-2.

Each rank appends a line per step to ``<out>/ranks/rank-<r>.jsonl`` (its pid, the task ids it rolled out, and
at the checkpoint the SHA-256 of its trainable weights); the tests read those to see that two processes ran,
that they rolled out different tasks, and that their weights are bit-for-bit equal after the steps; a
negative control runs the same launch with the gradient all-reduce switched off and sees the ranks diverge.

Why weight decay and a KL term: the random tiny model never writes a well-formed tool call, so every episode
gets the same reward and the policy-gradient term is zero. Step 1's decoupled weight decay moves the policy
off the reference, so step 2's KL term gives each rank a non-zero gradient computed from *its own* rollouts;
Adam turns even a tiny gradient into a step of about ``lr`` per weight, so without the gradient all-reduce
the two ranks' weights would differ after step 2.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "scripts" / "train_multigpu.sh"
ARGS = [
    "--config",
    str(ROOT / "configs" / "train_tiny.yaml"),
    "engine.name=hf",
    "tasks.count=1",
    "rollout.group_size=2",
    "rollout.max_steps=1",
    "sampling.max_new_tokens=8",
    "train.steps=2",
    "train.lr=1e-3",
    "train.weight_decay=0.1",
    "train.loss.kl_coef=0.1",
]


def launch(name: str, out: Path) -> subprocess.CompletedProcess[str]:
    """``train_multigpu.sh --accelerate NAME --procs 2 -- ARGS --out OUT``, one thread per rank (2 cores)."""
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p),
    }
    done = subprocess.run(
        ["bash", str(SCRIPT), "--accelerate", name, "--procs", "2", "--", *ARGS, "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done


def rank_lines(out: Path) -> dict[int, list[dict[str, Any]]]:
    return {
        r: [json.loads(line) for line in (out / "ranks" / f"rank-{r}.jsonl").read_text().splitlines()]
        for r in (0, 1)
    }


def saved_trainable(out: Path) -> dict[str, torch.Tensor]:
    """The trainable tensors of the last checkpoint (the main rank's), in parameter order."""
    tensors: dict[str, torch.Tensor] = torch.load(
        out / "checkpoints" / "step-000002" / "trainable.pt", weights_only=True
    )
    return tensors


def sha256_of(tensors: dict[str, torch.Tensor]) -> str:
    """The rank files' hash contract, written out again: name, dtype and shape, then the raw bytes."""
    digest = hashlib.sha256()
    for name, t in tensors.items():
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        digest.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def check_two_ranks(out: Path) -> None:
    """What both launchers must give: two processes, different tasks, equal weights that moved."""
    ranks = rank_lines(out)
    assert sorted(p.name for p in (out / "ranks").iterdir()) == ["rank-0.jsonl", "rank-1.jsonl"]
    for r in (0, 1):
        assert [(m["step"], m["rank"], m["world"]) for m in ranks[r]] == [(1, r, 2), (2, r, 2)]
    assert ranks[0][0]["pid"] != ranks[1][0]["pid"]  # two processes, not one process told it is two
    # rank r of 2 at step s rolls out batch 2s + r: train seeds 0 and 2 on rank 0, 1 and 3 on rank 1
    assert [m["tasks"] for m in ranks[0]] == [["retention:easy:0"], ["retention:easy:2"]]
    assert [m["tasks"] for m in ranks[1]] == [["retention:easy:1"], ["retention:easy:3"]]

    # only the main rank writes metrics (two ranks writing would give four lines); episodes are summed
    # over the ranks: 2 ranks x 1 task x G = 2
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1.0, 2.0]
    assert all(m["rollout/episodes"] == 4.0 for m in metrics)
    # no reward signal: step 1 has a zero gradient; step 2's KL gradient is not zero, so the equal weights
    # below are the all-reduce's doing, not an update that changed nothing
    assert metrics[0]["loss/grad_norm"] == 0.0 and metrics[1]["loss/grad_norm"] > 0.0

    final = [ranks[r][-1]["params_sha256"] for r in (0, 1)]
    assert "params_sha256" not in ranks[0][0]  # hashed at the checkpoint only (the last step here)
    assert final[0] == final[1], "the ranks' weights differ after the steps"
    assert (out / "checkpoints" / "latest").read_text() == "step-000002"
    saved = saved_trainable(out)
    assert sha256_of(saved) == final[0]  # the checkpoint holds the weights both ranks have
    initial = load_file(out / "model" / "model.safetensors")
    moved = [name for name, t in saved.items() if not torch.equal(t, initial[name])]
    assert len(moved) == len(saved), "some weights did not move off the initial ones"


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp") / "run"
    launch("ddp", out)
    return out


@pytest.mark.slow
def test_two_gloo_ranks_train_on_different_tasks_and_end_with_equal_weights(ddp_run: Path) -> None:
    check_two_ranks(ddp_run)


NO_ALLREDUCE = """
import sys

import ctxrl.train.distributed as distributed
from ctxrl.cli import main


def never_sync(acc, model, last):
    acc.sync_gradients = last
    return acc.no_sync(model)  # DDP's all-reduce skipped on every backward, the last one too


distributed.sync_context = never_sync
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_without_the_gradient_all_reduce_the_ranks_diverge(ddp_run: Path, tmp_path: Path) -> None:
    """The negative control of the test above: the same launch with DDP's all-reduce switched off (every
    backward under ``no_sync``) ends with weights that differ between the ranks, so the equal hashes there are
    the all-reduce's doing, not an update too small to tell the ranks apart."""
    script = tmp_path / "no_allreduce.py"
    script.write_text(NO_ALLREDUCE)
    out = tmp_path / "run"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p),
    }
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--config_file"]
    done = subprocess.run(
        [
            *launcher,
            str(ROOT / "configs/accelerate/ddp.yaml"),
            str(script),
            "train",
            *ARGS,
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    ranks = rank_lines(out)
    assert ranks[0][0]["pid"] != ranks[1][0]["pid"]
    assert [m["tasks"] for m in ranks[1]] == [["retention:easy:1"], ["retention:easy:3"]]  # the same work
    final = [ranks[r][-1]["params_sha256"] for r in (0, 1)]
    assert final[0] != final[1], (
        "the ranks ended equal without the all-reduce: the check above proves nothing"
    )
    assert final[0] != rank_lines(ddp_run)[0][-1]["params_sha256"]  # and not the all-reduced weights


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="deepspeed is not installed (pip install 'ctxrl[deepspeed]')",
)
def test_deepspeed_zero2_on_two_cpu_ranks_matches_ddp(ddp_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    launch("deepspeed_zero2", out)
    check_two_ranks(out)
    # ZeRO-2 shards the optimiser state and the gradients, not the arithmetic: from the same rollouts it
    # makes the same update as DDP
    ds, ddp = saved_trainable(out), saved_trainable(ddp_run)
    assert ds.keys() == ddp.keys()
    for name, p in ds.items():
        torch.testing.assert_close(p, ddp[name], rtol=0, atol=1e-6, msg=name)


def test_resume_under_deepspeed_is_a_one_line_error(tmp_path: Path) -> None:
    """A ZeRO checkpoint holds one rank's optimiser shard, so resuming from it would restore a wrong state."""
    from types import SimpleNamespace

    from ctxrl.errors import UsageError
    from ctxrl.rewards.advantages import AdvantageConfig
    from ctxrl.train.config import TrainConfig
    from ctxrl.train.grpo import TaskBatches, train
    from ctxrl.train.rollout import RolloutConfig

    deepspeed_acc = SimpleNamespace(
        process_index=0,
        num_processes=2,
        is_main_process=True,
        state=SimpleNamespace(deepspeed_plugin=object()),
    )
    with pytest.raises(UsageError, match="--resume is not supported under DeepSpeed"):
        train(
            TrainConfig(steps=1),
            model_dir=tmp_path / "no-model",  # never reached: the check comes first
            engine=None,  # type: ignore[arg-type]
            tokenizer=None,
            tasks=TaskBatches(("retention",), "train", "easy", count=1),
            rollout_config=RolloutConfig(group_size=2),
            advantages=AdvantageConfig(),
            out=tmp_path / "run",
            resume=True,
            accelerator=deepspeed_acc,
        )
    assert not (tmp_path / "run").exists()
