"""The calibration table of a curriculum ladder, and the training level it names.

    ctxrl calibrate runs/calib      # reads runs/calib/<level>/<group>/eval.json, writes calibration.{json,md}

RL can only show learning where the starting policy sometimes succeeds and sometimes fails. The table gives
success ± its standard error of every policy at every level of the ladder, each cell one ``ctxrl eval --out``
folder: ``<folder>/<level>/<group>/eval.json``, whose rows (scripted policies, or a model in each mode)
become the table's rows ``<group>/<row>`` (``scripted/append``, ``zeroshot/file``, ``sft/tools`` ...).
``scripts/calibrate_smollm2.sh`` runs the cells.

**The rule** (:func:`choose`): the training level and mode are those of the ``sft/<mode>`` row whose held-out
success lies in [25 %, 75 %] — closest to 50 %, the higher rung on a tie. Above 75 % there is little left for
RL to show; below 25 % groups rarely hold a success. No row in the band: no level is named (the table shows
each row's success, so which side it missed on).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxrl.errors import UsageError

BAND = (0.25, 0.75)
"""Held-out success of the SFT start a training level must lie in."""
START = "sft"
"""The cell group holding the SFT start's evaluation."""


@dataclass(frozen=True)
class Cell:
    """One row of one level: episodes, success and its standard error, compute per success, edits."""

    n: int
    success: float
    se: float
    cost_per_success: float | None
    """GFLOP per solved episode; None when none was solved."""
    edits: float

    def text(self) -> str:
        return f"{self.success:.2f} ± {self.se:.2f} ({self.n})"


def load_cells(folder: Path) -> tuple[list[str], dict[str, dict[str, Cell]]]:
    """``(levels in ladder order, {row: {level: cell}})`` from ``folder``'s eval cells (see the module
    docstring); a UsageError naming the folder when it holds none, or naming a cell that is not eval output."""
    from ctxrl.env.tasks.registry import DIFFICULTIES

    rows: dict[str, dict[str, Cell]] = {}
    found: set[str] = set()
    for path in sorted(folder.glob("*/*/eval.json")):
        level, group = path.parent.parent.name, path.parent.name
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))["summary"]
            cells = {}
            for label, families in summary.items():
                s = families["overall"]
                cost = s.get("cost_per_success")
                cells[f"{group}/{label}"] = Cell(
                    n=int(s["episodes"]),
                    success=float(s["success"]),
                    se=float(s["success_se"]),
                    cost_per_success=None if cost is None else float(cost) / 1e9,
                    edits=float(s["edits"]),
                )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            what = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
            raise UsageError(f"{path}: not the eval.json of `ctxrl eval --out` ({what})") from None
        found.add(level)
        for row, cell in cells.items():
            rows.setdefault(row, {})[level] = cell
    if not rows:
        raise UsageError(
            f"{folder} holds no <level>/<group>/eval.json cells; run scripts/calibrate_smollm2.sh"
        )
    levels = [d for d in DIFFICULTIES if d in found] + sorted(found - set(DIFFICULTIES))
    return levels, rows


def choose(levels: list[str], rows: dict[str, dict[str, Cell]]) -> dict[str, Any] | None:
    """The training ``{"level", "mode", "success", "se"}`` by the rule of the module docstring, or None."""
    best: tuple[float, int, str, str] | None = None
    for row, cells in rows.items():
        group, _, mode = row.partition("/")
        if group != START:
            continue
        for rank, level in enumerate(levels):
            cell = cells.get(level)
            if cell is None or not BAND[0] <= cell.success <= BAND[1]:
                continue
            key = (abs(cell.success - 0.5), -rank, level, mode)
            if best is None or key < best:
                best = key
    if best is None:
        return None
    level, mode = best[2], best[3]
    cell = rows[f"{START}/{mode}"][level]
    return {"level": level, "mode": mode, "success": cell.success, "se": cell.se}


def calibrate(folder: str | Path) -> dict[str, Any]:
    """Tabulate ``folder``'s cells; write ``calibration.json`` and ``calibration.md`` there; return the JSON."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"{folder} is not a folder of calibration cells")
    levels, rows = load_cells(folder)
    chosen = choose(levels, rows)
    record = {
        "levels": levels,
        "band": list(BAND),
        "rows": {
            row: {
                level: {
                    "n": c.n,
                    "success": c.success,
                    "se": c.se,
                    "cost_per_success_gflop": c.cost_per_success,
                    "edits": c.edits,
                }
                for level, c in cells.items()
            }
            for row, cells in rows.items()
        },
        "chosen": chosen,
    }
    (folder / "calibration.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    (folder / "calibration.md").write_text(markdown(levels, rows, chosen), encoding="utf-8")
    return record


def markdown(levels: list[str], rows: dict[str, dict[str, Cell]], chosen: dict[str, Any] | None) -> str:
    """The table (success ± SE (episodes) per row and level; GFLOP per success below) and the chosen level."""
    head = "| policy | " + " | ".join(levels) + " |\n|---|" + "---:|" * len(levels) + "\n"
    body = ""
    for row, cells in rows.items():
        body += f"| {row} | " + " | ".join(cells[lv].text() if lv in cells else "—" for lv in levels) + " |\n"
    cost = "| policy | " + " | ".join(levels) + " |\n|---|" + "---:|" * len(levels) + "\n"
    for row, cells in rows.items():
        values = [cells.get(lv) for lv in levels]
        cost += f"| {row} | " + " | ".join(_gflop(c) for c in values) + " |\n"
    lo, hi = (round(100 * b) for b in BAND)
    if chosen is None:
        verdict = (
            f"No `{START}/<mode>` row lies in [{lo} %, {hi} %] at any level: no training level is named."
        )
    else:
        verdict = (
            f"Training level: **{chosen['level']}** in **{chosen['mode']}** mode (SFT start "
            f"{chosen['success']:.2f} ± {chosen['se']:.2f}; the rule: the `{START}/<mode>` cell in "
            f"[{lo} %, {hi} %] closest to 50 %)."
        )
    return (
        "# Calibration\n\nHeld-out success ± standard error (episodes):\n\n"
        + head
        + body
        + "\nCompute per success (GFLOP; — where nothing was solved or the cell was not run):\n\n"
        + cost
        + "\n"
        + verdict
        + "\n"
    )


def _gflop(cell: Cell | None) -> str:
    if cell is None or cell.cost_per_success is None or math.isnan(cell.cost_per_success):
        return "—"
    return f"{cell.cost_per_success:,.0f}"
