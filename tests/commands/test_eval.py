"""``ctxrl eval`` end to end on a tiny run, its table math, and its errors on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctxrl.cli import main
from ctxrl.train.eval_table import episode_row, flat_metrics, markdown, summarize
from ctxrl.train.trajectory import EpisodeRecord, StepCost, StepRecord

SCRIPTED = ["engine.name=scripted", "sampling.max_new_tokens=8192"]


def test_eval_end_to_end_writes_json_and_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, flat = tmp_path / "run", tmp_path / "metrics.json"
    overrides = [*SCRIPTED, "eval.policies=[append,file-manager]", "eval.families=[offload,repo]"]
    overrides += ["eval.episodes=2", "rollout.workers=2"]
    rc = main(["eval", *overrides, "--out", str(out), "--json", str(flat)])
    assert rc == 0
    metrics = json.loads(flat.read_text())
    for policy in ("append", "file-manager"):
        for family in ("offload", "repo", "overall"):
            assert f"success/{policy}/{family}" in metrics and f"cost/{policy}/{family}" in metrics
    # append-only overflows on both (the repo's spec does not fit); the file manager compacts and answers.
    assert metrics["success/append/offload"] == 0.0 and metrics["success/file-manager/offload"] == 1.0
    assert metrics["success/append/repo"] == 0.0 and metrics["success/file-manager/repo"] == 1.0
    assert metrics["success/append/overall"] == 0.0 and metrics["success_se/append/overall"] == 0.0
    assert metrics["edits/file-manager/offload"] > 0 and metrics["edits/append/offload"] == 0
    assert metrics["cost/file-manager/offload"] > metrics["cost/file-manager/repo"] > 0
    record = json.loads((out / "eval.json").read_text())
    assert record["command"] == "ctxrl eval " + " ".join(overrides)
    assert record["model"]["exported_from"] is None  # scripted policies: no exported checkpoint
    assert len(record["episodes"]["file-manager"]) == 4
    assert record["summary"]["append"]["offload"]["success"] == 0.0
    md = (out / "eval.md").read_text()
    assert record["command"] in md and "| file-manager | offload | 2 | 1.00 ± 0.00 |" in md
    assert "| append | **overall** | 4 | 0.00 ± 0.00 |" in capsys.readouterr().out
    # every episode's full record and the resolved config are kept
    assert len((out / "trajectories.jsonl").read_text().splitlines()) == 8
    assert "name: scripted" in (out / "config.yaml").read_text()


def test_eval_offset_evaluates_a_later_block_of_the_split(tmp_path: Path) -> None:
    overrides = [*SCRIPTED, "eval.policies=[file-manager]", "eval.families=[offload]", "eval.episodes=2"]
    assert main(["eval", *overrides, "eval.offset=128", "--out", str(tmp_path / "run")]) == 0
    record = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert record["config"]["seeds"] == [110_128, 110_129]
    assert [e["task_id"] for e in record["episodes"]["file-manager"]] == [
        "offload:default:110128", "offload:default:110129",
    ]  # fmt: skip


def _step(kinds: list[str], prompt: int, rolled: int = 0) -> StepRecord:
    return StepRecord(
        prompt_ids=[1] * prompt, token_ids=[4, 5], logprobs=[0.0, 0.0], edit_mask=[0, 0],
        finish_reason="stop", num_cached_tokens=0, prompt_source="reset", rebuild_reason=None, text="",
        tool_calls=[], edit_calls=[], receipts=[f"r{k}" for k in kinds], receipt_kinds=kinds, readout="",
        nudges=[], context_tokens=prompt, edited=bool(kinds), free_turn=False, cost=StepCost(prompt, 0, 2, 0.0),
        rolled_back_turns=rolled,
    )  # fmt: skip


def _episode(family: str, success: bool, flops: float, edits: int) -> EpisodeRecord:
    steps = [_step(["applied"], 300) for _ in range(edits)] + [_step([], 1000 - 300 * edits)]
    return EpisodeRecord(
        task_id=f"{family}:default:110000", family=family, split="test", seed=110000, difficulty="default",
        mode="file", skill_id="s", group=0, index=0, engine="scripted", success=success,
        score=float(success), reward=float(success), end_reason="submit", answer="a", verdict="",
        cost_tokens=500.0, cost_flops=flops, steps=steps,
    )  # fmt: skip


def test_episode_row_counts_from_the_record() -> None:
    ep = _episode("board", True, 2e9, 2)
    ep.steps.append(_step(["rejected"], 10, rolled=3))
    row = episode_row(ep)
    assert (row["prompt_tokens"], row["lm_calls"], row["steps"], row["peak_tokens"]) == (1010, 4, 4, 400)
    assert (row["edits"], row["rollbacks"]) == (3, 1)
    assert row["receipts"] == {
        "applied": 2,
        "applied_but_grew": 0,
        "rejected": 1,
        "failed": 0,
        "matched_nothing": 0,
    }


def test_summary_math_by_hand() -> None:
    rows = [
        episode_row(_episode("board", True, 2e9, 2)),
        episode_row(_episode("board", False, 4e9, 0)),
        episode_row(_episode("board", True, 3e9, 1)),
    ]
    row = summarize(rows)
    assert row["success"] == pytest.approx(2 / 3)
    assert row["success_se"] == pytest.approx(((2 / 3) * (1 / 3) / 3) ** 0.5)
    assert (row["cost"], row["edits"], row["receipts/applied"]) == (3e9, 1.0, 1.0)
    assert row["cost_per_success"] == pytest.approx(9e9 / 2) and row["score"] == pytest.approx(2 / 3)
    table = {"file-manager": {"board": row, "overall": row}}
    assert flat_metrics(table)["cost/file-manager/board"] == 3e9
    assert "| file-manager | board | 3 | 0.67 ± 0.27 | 1,000 | 3.0 | 1.0 | 0.0 | 1.0 |" in markdown(table)


def test_cost_per_success_is_undefined_without_a_success() -> None:
    """Issue 24: with no success the figure is null in the JSON, never 0 (which would read as free)."""
    import json

    rows = [episode_row(_episode("board", False, 4e9, 0)), episode_row(_episode("board", False, 2e9, 1))]
    row = summarize(rows)
    assert row["success"] == 0.0 and row["cost_per_success"] is None and row["cost"] == 3e9
    flat = flat_metrics({"append": {"board": row}})
    assert json.loads(json.dumps(flat))["cost_per_success/append/board"] is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval.families=[chess]"], "unknown family 'chess'"),
        (["eval.policies=[greedy]"], "unknown policy 'greedy'"),
        (["eval.split=holdout"], "unknown split 'holdout'"),
        (["eval.episodes=20000"], "split 'test' has 10000 seeds"),
        (["eval.offset=9999", "eval.episodes=2"], "cannot take n=2 from offset 9999"),
        (["eval.offset=-1"], "cannot start at offset -1"),
        (["eval.difficulty=brutal"], "unknown difficulty 'brutal'"),
        (["rollout.workers=0"], "workers must be >= 1"),
        (["eval.modes=[notes]", "engine.name=hf"], "unknown mode 'notes'"),
    ],
)
def test_bad_input_is_one_line_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", *SCRIPTED, *argv]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
