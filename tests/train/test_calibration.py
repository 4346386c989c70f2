"""The calibration table: eval cells tabulated per level in ladder order, the training level named by the
written rule (the SFT start inside [25 %, 75 %], closest to 50 %), and one-line errors on a wrong folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctxrl.cli import main
from ctxrl.errors import UsageError
from ctxrl.train.calibration import calibrate, choose, load_cells
from ctxrl.train.eval_table import RECEIPT_KINDS, summary_table


def _cell(folder: Path, level: str, group: str, solved: dict[str, int], n: int = 32) -> None:
    """An eval.json as ``ctxrl eval --out`` writes it: ``solved[label]`` of ``n`` episodes succeeded."""
    results = {
        label: [
            {
                "family": "retention",
                "success": i < k,
                "prompt_tokens": 1000,
                "cost_flops": 2e11,
                "cost_tokens": 900,
                "edits": 1,
                "rollbacks": 0,
                "receipts": dict.fromkeys(RECEIPT_KINDS, 0),
            }
            for i in range(n)
        ]
        for label, k in solved.items()
    }
    path = folder / level / group / "eval.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"summary": summary_table(results, ["retention"])}))


def test_the_table_follows_the_ladder_and_names_the_level_closest_to_half(tmp_path: Path) -> None:
    _cell(tmp_path, "short", "sft", {"file": 4, "tools": 0})  # 12 %: below the band
    _cell(tmp_path, "mini", "sft", {"file": 28, "tools": 10})  # 88 % too easy; 31 % in the band
    _cell(tmp_path, "small", "sft", {"file": 18, "tools": 3})  # 56 %: in the band, closest to half
    _cell(tmp_path, "mini", "scripted", {"append": 32, "file-manager": 32})
    levels, rows = load_cells(tmp_path)
    assert levels == ["mini", "small", "short"]  # ladder order, not alphabetical
    assert rows["sft/file"]["small"].success == pytest.approx(18 / 32)
    assert rows["scripted/append"]["mini"].cost_per_success == pytest.approx(200.0)  # GFLOP
    assert rows["sft/tools"]["short"].cost_per_success is None  # nothing solved: undefined, never 0
    record = calibrate(tmp_path)
    se = (18 / 32 * 14 / 32 / 32) ** 0.5
    assert record["chosen"] == {"level": "small", "mode": "file", "success": 18 / 32, "se": pytest.approx(se)}
    text = (tmp_path / "calibration.md").read_text()
    assert "| sft/file | 0.88 ± 0.06 (32) | 0.56 ± 0.09 (32) | 0.12 ± 0.06 (32) |" in text
    assert "Training level: **small** in **file** mode" in text
    assert json.loads((tmp_path / "calibration.json").read_text())["chosen"]["level"] == "small"


def test_no_level_is_named_when_no_start_is_in_the_band(tmp_path: Path) -> None:
    _cell(tmp_path, "mini", "sft", {"file": 30})
    _cell(tmp_path, "short", "sft", {"file": 1})
    _cell(tmp_path, "small", "zeroshot", {"file": 16})  # a zero-shot row in the band names nothing
    assert choose(*load_cells(tmp_path)) is None
    assert calibrate(tmp_path)["chosen"] is None
    assert "no training level is named" in (tmp_path / "calibration.md").read_text()


def test_a_tie_goes_to_the_higher_rung(tmp_path: Path) -> None:
    _cell(tmp_path, "mini", "sft", {"file": 12})
    _cell(tmp_path, "small", "sft", {"file": 20})  # |0.375 - 0.5| == |0.625 - 0.5|
    assert choose(*load_cells(tmp_path))["level"] == "small"  # type: ignore[index]


def test_wrong_folders_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError, match=r"holds no <level>/<group>/eval\.json cells"):
        load_cells(tmp_path)
    bad = tmp_path / "mini" / "sft" / "eval.json"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    with pytest.raises(UsageError, match=r"eval\.json: not the eval\.json of `ctxrl eval --out`"):
        load_cells(tmp_path)
    # JSON of the wrong shape inside: the same one error, not a TypeError from the parsing
    for inner in ('{"summary": 5}', '{"summary": {"p": 5}}', '{"summary": {"p": {"retention": {}}}}'):
        bad.write_text(inner)
        with pytest.raises(UsageError, match=r"not the eval\.json of `ctxrl eval --out`"):
            load_cells(tmp_path)
    bad.write_text('{"summary": {"p": {"overall": {"episodes": 4}}}}')
    with pytest.raises(UsageError, match=r"\(no 'success'\)"):
        load_cells(tmp_path)
    assert main(["calibrate", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing is not a folder" in err[0]
