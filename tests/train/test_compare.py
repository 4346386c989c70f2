"""The paired comparison of evaluated policies: success difference with its interval and exact McNemar
p-value, compute per success with paired bootstrap intervals, pools of replicates with the exact permutation
test, and refusals of unpaired or malformed input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ctxrl.cli import main
from ctxrl.errors import UsageError
from ctxrl.train.compare import Pool, compare, load_outcomes, mcnemar_p, permutation_p


def _eval(
    folder: Path,
    label: str,
    wins: list[bool],
    flops: list[float],
    level: str = "small",
    extra: list[dict[str, object]] | None = None,
) -> Path:
    """An eval folder as ``ctxrl eval --out`` writes it, one row of episodes on tasks t0, t1, ... (``extra``:
    more fields of each episode's record)"""
    folder.mkdir(parents=True)
    episodes = [
        {"task_id": f"retention:{level}:{i}", "success": w, "cost_flops": f}
        for i, (w, f) in enumerate(zip(wins, flops, strict=True))
    ]
    for record, more in zip(episodes, extra or [], strict=False):
        record.update(more)
    record = {"config": {"difficulty": level}, "summary": {}, "episodes": {label: episodes}}
    (folder / "eval.json").write_text(json.dumps(record))
    return folder


def test_mcnemar_is_the_exact_two_sided_binomial() -> None:
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(5, 5) == 1.0
    assert mcnemar_p(6, 0) == pytest.approx(2 / 64)  # all six discordant tasks one way
    assert mcnemar_p(1, 7) == pytest.approx(2 * (1 + 8) / 256)


def test_a_trained_policy_that_solves_more_for_less(tmp_path: Path) -> None:
    n = 40
    start = [i < 12 for i in range(n)]  # 30 %
    trained = [i < 12 or 12 <= i < 24 for i in range(n)]  # 60 %: 12 tasks gained, none lost
    w0 = [i < 20 for i in range(n)]
    s = load_outcomes(_eval(tmp_path / "s", "file", start, [4e11] * n))
    t = load_outcomes(_eval(tmp_path / "t", "file", trained, [2e11] * n))
    a = load_outcomes(_eval(tmp_path / "a", "file", w0, [4e11] * n))
    out = compare(s, t, a)
    assert out["level"] == "small" and out["heldout_tasks"] == n
    assert (out["sft_success"], out["grpo_success"], out["grpo_w0_success"]) == (0.3, 0.6, 0.5)
    # compute per success: 40 x 400 GFLOP / 12, 40 x 200 / 24, 40 x 400 / 20
    assert out["sft_cost_per_success"] == pytest.approx(16000 / 12)
    assert out["grpo_cost_per_success"] == pytest.approx(8000 / 24)
    assert out["grpo_w0_cost_per_success"] == pytest.approx(800.0)
    assert out["grpo_over_sft_cost_per_success"] == pytest.approx(0.25)
    diff_se = math.sqrt(0.3 * 0.7 / n)  # 12 of 40 differences are +1, the rest 0 (sample variance, n - 1)
    assert out["success_diff"] == pytest.approx(0.3)
    assert out["success_diff_ci_low"] == pytest.approx(0.3 - 1.96 * diff_se * math.sqrt(n / (n - 1)))
    assert out["success_diff_p"] == pytest.approx(2 / 2**12)
    low, high = out["grpo_over_sft_cost_per_success_ci"]
    assert low < 0.25 < high < 1.0  # every resample is cheaper per success
    # against the ablation: 4 tasks gained (20-23), none lost; 333 vs 800 GFLOP per success
    assert out["grpo_vs_w0_success_diff"] == pytest.approx(0.1)
    assert out["grpo_vs_w0_success_diff_p"] == pytest.approx(2 / 2**4)
    assert out["grpo_vs_w0_success_diff_ci_low"] < 0.1 < out["grpo_vs_w0_success_diff_ci_high"]
    assert out["grpo_over_w0_cost_per_success"] == pytest.approx((8000 / 24) / 800)
    low, high = out["grpo_over_w0_cost_per_success_ci"]
    assert low < out["grpo_over_w0_cost_per_success"] < high < 1.0
    assert (
        out["cost_per_success_ci"]["sft"][0]
        < out["sft_cost_per_success"]
        < out["cost_per_success_ci"]["sft"][1]
    )


def test_the_summary_names_the_run_behind_each_policy(tmp_path: Path) -> None:
    """An eval of an exported checkpoint records its run and step; the summary carries them per arm (None
    for the start, which no training run wrote, and for an eval that recorded nothing)."""
    wins, flops = [True, False, True, False], [1e11] * 4
    s = _eval(tmp_path / "s", "file", wins, flops)
    t = _eval(tmp_path / "t", "file", wins, flops)
    record = json.loads((t / "eval.json").read_text())
    record["model"] = {"path": "runs/t.model", "exported_from": {"run": "runs/ladder/grpo_wide", "step": 20}}
    (t / "eval.json").write_text(json.dumps(record))
    out = compare(load_outcomes(s), load_outcomes(t), load_outcomes(s))
    assert out["exported_from"] == {
        "sft": None, "grpo": {"run": "runs/ladder/grpo_wide", "step": 20}, "grpo_w0": None,
    }  # fmt: skip


def test_the_episode_shape_counts_what_each_policy_did(tmp_path: Path) -> None:
    # the start edits in every episode; the trained policy stops editing in three of four, two of them solved
    start = [{"steps": 4, "prompt_tokens": 4000, "edits": 1, "reason": "submit"}] * 4
    trained = [
        {"steps": 3, "prompt_tokens": 3000, "edits": 0, "reason": "submit"},
        {"steps": 3, "prompt_tokens": 3000, "edits": 0, "reason": "submit"},
        {"steps": 8, "prompt_tokens": 9000, "edits": 0, "reason": "max_steps"},
        {"steps": 4, "prompt_tokens": 5000, "edits": 2, "reason": "submit"},
    ]
    s = load_outcomes(_eval(tmp_path / "s", "file", [True, False, False, True], [1e11] * 4, extra=start))
    t = load_outcomes(_eval(tmp_path / "t", "file", [True, True, False, False], [1e11] * 4, extra=trained))
    shape = compare(s, t)["shape"]
    assert shape["sft"] == {
        "steps_per_episode": 4.0,
        "prompt_tokens_per_episode": 4000.0,
        "edits_per_episode": 1.0,
        "no_edit_episodes": 0,
        "no_edit_solved": 0,
        "max_steps_episodes": 0,
    }
    assert shape["grpo"] == {
        "steps_per_episode": 4.5,
        "prompt_tokens_per_episode": 5000.0,
        "edits_per_episode": 0.5,
        "no_edit_episodes": 3,
        "no_edit_solved": 2,
        "max_steps_episodes": 1,
    }
    # an eval that did not record the fields: the figures are unknown, not zero
    bare = load_outcomes(_eval(tmp_path / "b", "file", [True] * 4, [1e11] * 4))
    assert set(compare(bare, bare)["shape"]["grpo"].values()) == {None}
    # a hand-edited record with a non-number: that figure is unknown, the others stand
    odd = [{**r, "steps": "four"} for r in start]
    odd_shape = compare(load_outcomes(_eval(tmp_path / "o", "file", [True] * 4, [1e11] * 4, extra=odd)), t)
    assert odd_shape["shape"]["sft"]["steps_per_episode"] is None
    assert odd_shape["shape"]["sft"]["edits_per_episode"] == 1.0


def test_nothing_solved_is_undefined_not_zero(tmp_path: Path) -> None:
    s = load_outcomes(_eval(tmp_path / "s", "file", [False] * 8, [1e11] * 8))
    t = load_outcomes(_eval(tmp_path / "t", "file", [True, False] * 4, [1e11] * 8))
    out = compare(s, t)
    assert out["sft_cost_per_success"] is None and out["grpo_over_sft_cost_per_success"] is None
    assert out["grpo_w0_success"] is None and out["grpo_cost_per_success"] == pytest.approx(200.0)
    assert "grpo_vs_w0_success_diff" not in out  # no ablation, no comparison with it


def test_unpaired_or_malformed_input_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = load_outcomes(_eval(tmp_path / "s", "file", [True] * 4, [1e11] * 4))
    other = load_outcomes(_eval(tmp_path / "o", "file", [True] * 5, [1e11] * 5))
    with pytest.raises(UsageError, match="evaluated on other tasks"):
        compare(s, other)
    two = tmp_path / "two"
    two.mkdir()
    (two / "eval.json").write_text(json.dumps({"episodes": {"file": [], "tools": []}}))
    with pytest.raises(UsageError, match="holds 2 rows"):
        load_outcomes(two)
    assert main(["compare", str(tmp_path / "s"), str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not the eval.json" in err[0]
    out = tmp_path / "summary.json"
    assert main(["compare", str(tmp_path / "s"), str(tmp_path / "s"), "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["success_diff"] == 0.0
    # the summary names the evaluation behind each of its keys, as given
    assert written["compared"] == {"sft": str(tmp_path / "s"), "grpo": str(tmp_path / "s"), "grpo_w0": None}


def test_the_permutation_test_is_mcnemar_for_one_evaluation_a_side_and_exact_for_pools() -> None:
    import random

    rng = random.Random(3)
    for _ in range(20):
        base = [rng.random() < 0.4 for _ in range(30)]
        other = [rng.random() < 0.6 for _ in range(30)]
        gained = sum(o and not b for b, o in zip(base, other, strict=True))
        lost = sum(b and not o for b, o in zip(base, other, strict=True))
        p = permutation_p([(int(b), 1) for b in base], [(int(o), 1) for o in other])
        assert p == pytest.approx(mcnemar_p(gained, lost), abs=1e-12)
    # one task, the start failed once, three replicates solved it: the one failure of the four episodes lands
    # on the start's side with probability 1/4
    assert permutation_p([(0, 1)], [(3, 3)]) == pytest.approx(1 / 4)
    # two such tasks: both failures on the start's side, 1/16; the other way round is as extreme only if the
    # rates differ as much, which three replicates solving none and a start solving both would
    assert permutation_p([(0, 1)] * 2, [(3, 3)] * 2) == pytest.approx(1 / 16)
    assert permutation_p([(1, 1)] * 2, [(0, 3)] * 2) == pytest.approx(1 / 16)
    # tasks every episode solved (or none did) carry no information
    assert permutation_p([(0, 1), (1, 1), (0, 1)], [(3, 3), (3, 3), (0, 3)]) == pytest.approx(1 / 4)
    assert permutation_p([(1, 1)], [(2, 3)]) == 1.0


def test_a_pool_of_replicates_is_scored_by_its_mean_on_each_task(tmp_path: Path) -> None:
    n = 8
    start = load_outcomes(_eval(tmp_path / "s", "file", [i < 2 for i in range(n)], [1e11] * n))
    runs = []
    for r, solved in enumerate(
        (5, 6, 7)
    ):  # three seeds: 5, 6 and 7 of 8 solved, at 100, 200, 300 GFLOP a task
        # the third seed never edits: its 8 episodes (7 of them solved) are the pool's episodes without an edit
        shape = [{"steps": 4 + r, "prompt_tokens": 1000, "edits": int(r < 2), "reason": "submit"}] * n
        folder = _eval(
            tmp_path / f"r{r}", "file", [i < solved for i in range(n)], [1e11 * (r + 1)] * n, extra=shape
        )
        record = json.loads((folder / "eval.json").read_text())
        record["model"] = {"path": "m", "exported_from": {"run": f"runs/arm_s{r}", "step": 20}}
        (folder / "eval.json").write_text(json.dumps(record))
        runs.append(load_outcomes(folder))
    out = compare(start, runs, start)
    assert out["replicates"] == {"sft": 1, "grpo": 3, "grpo_w0": 1}
    assert out["grpo_success"] == pytest.approx(18 / 24) and out["sft_success"] == pytest.approx(2 / 8)
    # pooled compute over pooled successes: 8 x (100 + 200 + 300) GFLOP over 18 successes
    assert out["grpo_cost_per_success"] == pytest.approx(8 * 600 / 18)
    assert out["success_diff"] == pytest.approx(18 / 24 - 2 / 8)
    # SE over tasks: the spread of the per-task rates (1 on tasks 0-4, then 2/3, 1/3, 0); binomial for one eval
    rates = [1.0] * 5 + [2 / 3, 1 / 3, 0.0]
    spread = sum((r - 0.75) ** 2 for r in rates) / n
    assert out["success_se"]["grpo"] == pytest.approx(math.sqrt(spread / n))
    assert out["success_se"]["sft"] == pytest.approx(math.sqrt(0.25 * 0.75 / n))
    low, high = out["success_diff_bootstrap_ci"]
    assert low < out["success_diff"] < high
    # tasks 0-1: all solved; 2-4: start 0, pool 3/3; 5: 2/3; 6: 1/3; 7: 0/3
    expected = permutation_p([(int(i < 2), 1) for i in range(n)], [(3, 3)] * 5 + [(2, 3), (1, 3), (0, 3)])
    assert out["success_diff_p"] == pytest.approx(expected) and expected < 0.05
    assert out["success_diff_test"] == "exact paired permutation"
    assert out["grpo_vs_w0_success_diff_test"] == "exact paired permutation"
    assert (
        out["shape"]["grpo"]["steps_per_episode"] == 5.0
        and out["shape"]["grpo"]["edits_per_episode"] == 2 / 3
    )
    assert (out["shape"]["grpo"]["no_edit_episodes"], out["shape"]["grpo"]["no_edit_solved"]) == (8, 7)
    assert out["exported_from"]["grpo"] == [{"run": f"runs/arm_s{r}", "step": 20} for r in range(3)]
    # one evaluation a side: the summary says the p-value is McNemar's
    assert compare(start, runs[0])["success_diff_test"] == "exact McNemar"


def test_the_command_pools_comma_separated_folders_and_refuses_mismatched_replicates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wins = [True, False, True, False]
    s = _eval(tmp_path / "s", "file", [False] * 4, [1e11] * 4)
    a = _eval(tmp_path / "a", "file", wins, [1e11] * 4)
    b = _eval(tmp_path / "b,c", "file", [True] * 4, [1e11] * 4)  # a folder whose name holds a comma
    out = tmp_path / "summary.json"
    assert main(["compare", str(s), f"{a},{b}", str(b), "--out", str(out)]) == 1  # "b,c" split: no folder "b"
    assert "not the eval.json" in capsys.readouterr().err
    assert main(["compare", str(s), f"{a},{a}", str(b), "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["compared"] == {"sft": str(s), "grpo": [str(a), str(a)], "grpo_w0": str(b)}
    assert written["replicates"]["grpo"] == 2 and written["grpo_success"] == 0.5
    assert written["grpo_w0_success"] == 1.0  # the comma-named folder, taken whole
    other = _eval(tmp_path / "o", "file", [True] * 5, [1e11] * 5)
    with pytest.raises(UsageError, match="replicates of one slot"):
        Pool((load_outcomes(a), load_outcomes(other)))
    assert main(["compare", str(s), f"{a},{other}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "replicates of one slot" in err[0]
