"""The layout of a GRPO run folder: every artifact's name, in one place (no torch here).

    out/config.yaml                          the run config (ctxrl train writes it)
    out/metrics.jsonl                        one line of metrics per step (main rank)
    out/ranks/rank-<r>.jsonl                 each rank's own line per step (tasks, pid, weight hash)
    out/checkpoints/step-NNNNNN/             model/ (save_pretrained), trainable.pt, optimizer.pt,
                                             rng-<r>.pt, state.json (step, graded switch, train config)
    out/checkpoints/latest                   the name of the newest complete checkpoint

A checkpoint is written to a temporary folder and renamed into place, and ``latest`` is replaced the same
way, so a run killed at any moment leaves the previous checkpoint whole. :mod:`ctxrl.train.keep` slims a
checkpoint to its bf16 adapter for committing; :func:`ctxrl.train.checkpoint.load_checkpoint` resumes from
either.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ctxrl.errors import UsageError

CONFIG = "config.yaml"
CHECKPOINTS = "checkpoints"
LATEST = "latest"
METRICS = "metrics.jsonl"
RANKS = "ranks"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def latest_checkpoint(run: Path) -> Path:
    """``run/checkpoints/<the folder latest names>``; a UsageError when there is none."""
    pointer = run / CHECKPOINTS / LATEST
    if not pointer.is_file():
        raise UsageError(f"{run} has no checkpoint ({pointer} does not exist)")
    folder = run / CHECKPOINTS / pointer.read_text(encoding="utf-8").strip()
    if not folder.is_dir():
        raise UsageError(f"{pointer} names {folder.name}, which does not exist")
    return folder


def truncate_metrics(path: Path, done: int) -> None:
    """Keep only the lines of steps ``<= done`` (the checkpoint a resumed run starts from). A last line cut
    short (the run was killed while writing it) is dropped: that step runs again. Any other line that is
    not a step's JSON record is a UsageError naming the file and the line."""
    if not path.exists():
        return
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read it as text ({exc})") from None
    lines = [line for line in text.splitlines() if line.strip()]
    kept = []
    for n, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):
                break
            raise UsageError(
                f"{path}: record {n} of {len(lines)} is not JSON; only the last may be cut short"
            ) from None
        step = record.get("step") if isinstance(record, dict) else None
        if not isinstance(step, int | float):
            raise UsageError(f"{path}: record {n} has no step number")
        if step <= done:
            kept.append(line)
    if len(kept) != len(lines):
        path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


MOVED = {
    ("rollout", "task_budget"): ("harness", "task_budget"),
    **{("train", k): ("train", "reward", k) for k in ("graded", "penalties", "cost_unit")},
    **{("train", k): ("train", "loss", k) for k in ("epsilon_low", "epsilon_high", "kl_coef", "tis_cap")},
}
"""Keys a run's saved ``config.yaml`` may hold from before they moved (2026-12-03), and where they live now."""


def upgrade_saved_config(data: dict[str, Any]) -> dict[str, Any]:
    """A saved run config (plain data) with every key of :data:`MOVED` in its new place, so a run folder
    written before a key moved still exports and reports. A key already in its new place wins."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for (section, key), target in MOVED.items():
        old = out.get(section)
        if not isinstance(old, dict) or key not in old:
            continue
        value = old.pop(key)
        node = out
        for part in target[:-1]:
            node[part] = dict(node.get(part) or {})
            node = node[part]
        node.setdefault(target[-1], value)
    return out


def json_lines(path: str | Path) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed value)`` for each non-blank line of a JSONL file (trajectories, metrics, rank
    logs): the one JSONL reader. A missing or unreadable file, a line that is not JSON or text that is not
    UTF-8 is a UsageError naming the file (and the line)."""
    path = Path(path)
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    with handle:
        try:
            for n, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    yield n, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise UsageError(f"{path}:{n}: not JSON ({exc.msg} at column {exc.colno})") from None
        except UnicodeDecodeError:
            raise UsageError(f"{path}: not UTF-8 text") from None
