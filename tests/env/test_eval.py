"""``ctxrl eval`` end to end on a tiny run, its table math, and its errors on bad input."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from ctxrl.cli import BENCHMARKS, main
from ctxrl.env.eval_cli import flat_metrics, markdown, summarize
from ctxrl.env.runner import EpisodeResult, EpisodeSpec


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the sandbox's fallback backend warns by design
        yield


def test_eval_end_to_end_writes_json_and_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, flat = tmp_path / "run", tmp_path / "metrics.json"
    argv = ["eval", "--policy", "append,file-manager", "--families", "offload", "repo", "--episodes", "2"]
    rc = main([*argv, "--workers", "2", "--out", str(out), "--json", str(flat)])
    assert rc == 0
    metrics = json.loads(flat.read_text())
    for policy in ("append", "file-manager"):
        for family in ("offload", "repo", "overall"):
            assert f"success/{policy}/{family}" in metrics and f"cost/{policy}/{family}" in metrics
    # append-only overflows on offload; the file manager compacts and answers; both fix the repo.
    assert metrics["success/append/offload"] == 0.0 and metrics["success/file-manager/offload"] == 1.0
    assert metrics["success/append/repo"] == 1.0 and metrics["success/file-manager/repo"] == 1.0
    assert metrics["success/append/overall"] == 0.5 and metrics["success_se/append/overall"] == 0.25
    assert metrics["edits/file-manager/offload"] > 0 and metrics["edits/append/offload"] == 0
    assert metrics["cost/file-manager/offload"] > metrics["cost/file-manager/repo"] > 0
    record = json.loads((out / "eval.json").read_text())
    assert record["command"] == (
        "ctxrl eval --policy append file-manager --families offload repo --split test --episodes 2 --workers 2"
    )
    assert len(record["episodes"]["file-manager"]) == 4
    assert record["summary"]["append"]["offload"]["success"] == 0.0
    md = (out / "eval.md").read_text()
    assert record["command"] in md and "| file-manager | offload | 2 | 1.00 ± 0.00 |" in md
    assert "| append | **overall** | 4 | 0.50 ± 0.25 |" in capsys.readouterr().out


def _episode(family: str, success: bool, flops: float, receipts: int) -> EpisodeResult:
    return EpisodeResult(
        spec=EpisodeSpec(family, "file", 110_000),
        task_id=f"{family}:default:110000",
        success=success,
        reason="submit",
        verdict="",
        steps=3,
        lm_calls=4,
        prompt_tokens=1000,
        generated_tokens=50,
        peak_tokens=900,
        cost_tokens=500.0,
        cost_flops=flops,
        edits=receipts,
        rollbacks=0,
        receipts={
            "applied": receipts,
            "applied_but_grew": 0,
            "rejected": 0,
            "failed": 0,
            "matched_nothing": 0,
        },
    )


def test_summary_math_by_hand() -> None:
    episodes = [
        _episode("board", True, 2e9, 2),
        _episode("board", False, 4e9, 0),
        _episode("board", True, 3e9, 1),
    ]
    row = summarize(episodes)
    assert row["success"] == pytest.approx(2 / 3)
    assert row["success_se"] == pytest.approx(((2 / 3) * (1 / 3) / 3) ** 0.5)
    assert (row["cost"], row["edits"], row["receipts/applied"]) == (3e9, 1.0, 1.0)
    table = {"file-manager": {"board": row, "overall": row}}
    assert flat_metrics(table)["cost/file-manager/board"] == 3e9
    assert "| file-manager | board | 3 | 0.67 ± 0.27 | 1,000 | 3.0 | 1.0 | 0.0 | 1.0 |" in markdown(table)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--families", "chess"], "unknown task family 'chess'"),
        (["--policy", "greedy"], "unknown policy 'greedy'"),
        (["--split", "holdout"], "unknown split 'holdout'"),
        (["--episodes", "20000"], "split 'test' has 10000 seeds"),
        (["--difficulty", "brutal"], "unknown difficulty 'brutal'"),
        (["--workers", "0"], "--workers must be >= 1"),
    ],
)
def test_bad_input_is_one_line_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", *argv]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_bad_option_value_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["eval", "--episodes", "many"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_bench_env_is_registered() -> None:
    assert BENCHMARKS["env"][0] == "ctxrl.env.runner:bench_env"
