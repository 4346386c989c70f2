"""``ctxrl calibrate``: the calibration table of a curriculum ladder and the training level it names.

    bash scripts/calibrate_smollm2.sh runs/calib runs/ladder/sft/model   # runs the eval cells, then this
    ctxrl calibrate runs/calib                                           # writes calibration.{json,md}

See :mod:`ctxrl.train.calibration` for the cells it reads and the rule.
"""

from __future__ import annotations

import argparse


def run_calibrate(args: argparse.Namespace) -> int:
    """Entry point of ``ctxrl calibrate``: write the table and print it with the level it names."""
    from ctxrl.train.calibration import calibrate

    calibrate(args.folder)
    print((args.folder / "calibration.md").read_text(encoding="utf-8"), end="")
    print(f"wrote {args.folder / 'calibration.json'} and {args.folder / 'calibration.md'}")
    return 0
