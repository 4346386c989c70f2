"""scripts/probe_layouts.py, the update probe the throughput notes cite, runs on recorded episodes (it had
rotted once: a renamed config accessor broke it with nothing in the suite to notice)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_script(name: str, *args: str, timeout: int = 300, env: dict[str, str] | None = None) -> str:
    """``scripts/NAME ARGS`` in a fresh interpreter (``env``: its environment, default this one's): its
    stdout, after checking that it succeeded."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *args],
        capture_output=True, text=True, timeout=timeout, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
def test_probe_counts_and_profiles_the_layouts_of_recorded_episodes(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    roll = tmp_path / "roll"
    recorded = subprocess.run(
        [sys.executable, "-m", "ctxrl.cli", "rollout", "--model", str(tiny_model_dir), "--out", str(roll),
         "engine.name=scripted", "engine.policy=file-manager", "rollout.group_size=2", "tasks.count=1",
         "tasks.families=[retention]", "tasks.difficulty=short", "rollout.max_steps=4"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert recorded.returncode == 0, recorded.stderr[-2000:]
    trajectories = roll / "trajectories.jsonl"

    def probe(*args: str) -> list[str]:
        return run_script("probe_layouts.py", *args).splitlines()

    counts = probe("--tokens", str(trajectories))
    assert counts[0].startswith("2 episodes in 1 groups")
    assert "trie" in counts[1]

    flops = probe("--flops", str(trajectories), str(tiny_model_dir))
    parts = re.fullmatch(
        r"forward: matmuls ([\d.]+) GFLOP \(body ([\d.]+), LM head ([\d.]+)\), attention ([\d.]+) with the mask, "
        r"([\d.]+) in two parts",
        flops[1],
    )
    update = re.fullmatch(
        r"update: ([\d.]+) GFLOP counted as computed \(two parts\), ([\d.]+) with the mask; "
        r"2 x forward with the mask ([\d.]+); ratio ([\d.]+)",
        flops[2],
    )
    assert parts and update, flops
    dense, body, head, masked, two_part = (float(x) for x in parts.groups())
    assert body > 0 and head > 0 and body + head == pytest.approx(dense, abs=0.2)
    now, now_masked, before, ratio = (float(x) for x in update.groups())
    assert 0 < two_part < masked and dense > 0  # two parts skip each suffix's upper triangle
    assert now == pytest.approx(
        2 * dense + 3 * two_part, abs=0.3
    )  # the backward: matmuls once, attention twice
    assert now_masked == pytest.approx(2 * dense + 3 * masked, abs=0.3)
    assert before == pytest.approx(2 * (dense + masked), abs=0.3)
    assert ratio == pytest.approx(now / before, abs=2e-3)

    profiled = probe("--profile", str(trajectories), str(tiny_model_dir), "shared,padded,masked")
    timed = [line.split() for line in profiled if line.startswith(("shared ", "padded ", "masked "))]
    assert [t[0] for t in timed] == ["shared", "padded", "masked"]
    assert timed[0][3] == timed[2][3]  # the masked layout is the shared one: the same tokens
    assert all(float(t[1]) > 0 and int(t[3]) > 0 for t in timed)
    assert any("Self CPU" in line for line in profiled)  # the profiler's table follows each layout

    paired = probe("--pairs", "2", str(trajectories), str(tiny_model_dir), "1")
    sizes = re.fullmatch(r"(\d+) rows, (\d+) row tokens, (\d+) laid out", paired[0])  # the first episode's
    assert sizes and int(sizes[1]) >= 1 and 0 < int(sizes[3]) <= int(sizes[2])
    assert [line.split()[:2] for line in paired[1:3]] == [["pair", "1:"], ["pair", "2:"]]
    assert paired[3].startswith("median: mask") and paired[3].endswith("of 2 pairs")


def test_attention_probe_times_the_mask_against_the_two_kinds_without_one() -> None:
    out = run_script("probe_attention.py", "24", "8", "2", "1", timeout=120)
    rows = [line.split() for line in out.splitlines()[1:4]]
    assert [r[0] for r in rows] == ["mask", "nomask", "twopart"]
    assert rows[0][3] == "x1.00" and all(float(r[1]) > 0 for r in rows)


@pytest.mark.parametrize(("flags", "dtype"), [((), "bfloat16"), (("--fp32",), "float32")])
def test_attention_probe_checks_its_block_attention_and_times_it_beside_the_flash_kernel(
    flags: tuple[str, ...], dtype: str
) -> None:
    out = run_script("probe_attention.py", "--kernels", *flags, "32", "96", timeout=120).splitlines()
    error = float(out[0].rsplit(" ", 1)[1])
    # The same attention and gradients: float32's summation order moves them by ~1e-5 of their largest value
    # (4e-5 on one CI machine), a mistake in the backward (its delta term, its scale) by more than 1e-2.
    assert out[0].startswith("blocks against SDPA") and error < 1e-3
    assert f"forward + backward, {dtype}," in out[1]
    timed = [line.split() for line in out[2:]]
    assert [(t[0], t[1]) for t in timed] == [
        (n, kernel) for n in ("32", "96") for kernel in ("flash", "blocks")
    ]
    assert all(float(t[2]) > 0 for t in timed)


def test_sft_step_probe_times_and_profiles_both_precisions() -> None:
    out = run_script("probe_sft_step.py", "48", "8", "--profile", "--casts")
    timed = [line for line in out.splitlines() if line.startswith("mixed_precision=")]
    assert [line.split(":")[0] for line in timed] == ["mixed_precision=no", "mixed_precision=bf16"]
    assert sum(line.startswith("Self CPU time total") for line in out.splitlines()) == 2  # a table each
    casts = {
        line.split(":")[0]: [int(n) for n in re.findall(r"(\d+) calls", line)]
        for line in out.splitlines()
        if line.startswith("casts ")
    }
    # float32 casts no weight; bf16 autocast rounds each of SmolLM2's 30 x 7 frozen projections, the LM head and
    # the 30 x 7 x 2 LoRA factors once in the step's forward pass: 631, and none again in the backward
    assert casts["casts mixed_precision=no"][0] == 0
    assert casts["casts mixed_precision=bf16"][0] == 30 * 7 + 1 + 30 * 7 * 2


def test_sft_step_probe_times_recorded_demonstrations_with_and_without_the_padding_limit() -> None:
    flags = (
        "--profile",
        "--fp32",
        "--two-part",
    )  # (--compile: ~130 s more on the tiny model's three layouts)
    lines = run_script("probe_sft_step.py", "--demos", "1", "4096", "tiny", *flags).splitlines()
    assert lines[0].startswith("1 episodes,") and lines[1].startswith("packing: auto picks ")
    # --fp32: the configs' precision, not bf16 autocast; two-part attention as asked
    assert lines[1].endswith("; mixed_precision=no two-part")
    timed = {line.split()[0]: line.split() for line in lines[2:5]}
    assert list(timed) == ["padded", "shared", "shared-unlimited"]
    assert all(float(t[1]) > 0 for t in timed.values())
    # the limit only ever splits a batch: never more tokens through the model than without it
    assert int(timed["shared"][3]) <= int(timed["shared-unlimited"][3])
    assert any(line.startswith("Self CPU time total") for line in lines[5:])  # the shared step's profile
    share = float(lines[-1].split()[1].rstrip("%"))
    assert lines[-1].startswith("attention ") and 0 < share < 100


def test_sft_step_probe_alternates_the_masked_and_two_part_steps_in_pairs() -> None:
    lines = run_script(
        "probe_sft_step.py", "--demos", "1", "4096", "tiny", "--fp32", "--pairs", "2"
    ).splitlines()
    assert lines[1].endswith("; mixed_precision=no")
    pairs = [re.fullmatch(r"pair (\d): mask ([\d.]+) s two-part ([\d.]+) s", line) for line in lines[2:4]]
    assert all(pairs) and [m.group(1) for m in pairs if m] == ["1", "2"]
    assert re.fullmatch(r"median: mask [\d.]+ s two-part [\d.]+ s; two-part / mask [\d.]+; "
                        r"two-part faster in [012] of 2 pairs", lines[4])  # fmt: skip
    assert len(lines) == 5  # the pairs replace the three layouts' timings


@pytest.mark.slow
def test_sft_step_probe_compares_the_trainers_under_the_preload_it_is_given() -> None:
    env = {**os.environ, "LD_PRELOAD": ""}
    argv = ("--trainers", "fp32", "tiny", "--ladder")
    lines = run_script("probe_sft_step.py", *argv, timeout=600, env=env).splitlines()
    assert lines[0] == "LD_PRELOAD="
    figures = {line.split()[0]: float(line.split()[1]) for line in lines[1:] if line.startswith("sft_")}
    names = ["sft_tokens_per_s", "sft_trl_tokens_per_s", "sft_speedup", "sft_steady_speedup"]
    assert list(figures) == names + [f"{name}_ladder" for name in names]
    for suffix in ("", "_ladder"):
        assert figures[f"sft_tokens_per_s{suffix}"] > 0 and figures[f"sft_trl_tokens_per_s{suffix}"] > 0
        ratio = figures[f"sft_tokens_per_s{suffix}"] / figures[f"sft_trl_tokens_per_s{suffix}"]
        assert figures[f"sft_speedup{suffix}"] == pytest.approx(ratio, rel=1e-3)
    # the ladder's SFT path is measured against the one TRL run at configs/sft_smollm2.yaml's sizes
    assert figures["sft_trl_tokens_per_s_ladder"] == figures["sft_trl_tokens_per_s"]


@pytest.mark.parametrize("name", ["probe_layouts.py", "probe_attention.py", "probe_sft_step.py"])
def test_each_probe_answers_help_with_its_usage_and_runs_nothing(name: str) -> None:
    # These probes read their arguments by position; `--help` once reached int() and ended in a traceback.
    doc = ast.get_docstring(ast.parse((ROOT / "scripts" / name).read_text()), clean=False)
    assert doc and f"python scripts/{name}" in doc
    assert run_script(name, "--help", timeout=120) == doc + "\n"  # the usage, and nothing timed after it
