"""Where an evaluation's compute goes: each policy's retention episodes split by the kind of turn that spent it.

    python scripts/cost_breakdown.py runs/ladder/final_wide_edit runs/ladder/final_wide_edit_w1 \
        --out docs/results/learning/cost_breakdown.json

Each argument is an eval (or rollout) folder holding ``trajectories.jsonl``. A turn's compute is its recorded
prefix-cache cost (``cost.flops``: uncached prompt tokens and generated tokens); the turn is a **read** while the
episode has called the stream tool (``next_chunk``) at most as many times as its task has parts, the **end check**
on the next call (the stream answers with its end marker; the task's prompt asks for calls "until it reports the
end of the stream", though it also says how many parts there are), a **late read** on any call after that (the
end marker again), an **edit** when the turn edited the context, a **submit**, or **other**.
``rebuilt_after_edit_share`` is the share spent in the turns whose prompt was rebuilt because the turn before
edited (their cache starts over after the pinned prefix); it overlaps the kinds.

Also per policy: how many episodes read every part, and the success rate of those that did and those that did not
(a retention answer can only be right when the part holding it was read). Only the trajectories are read; nothing
runs a model, so it takes seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from ctxrl.env.tasks.retention import PRESETS
from ctxrl.errors import UsageError
from ctxrl.train.run_folder import json_lines

STREAM_TOOL = "next_chunk"
KINDS = ("read", "end_check", "late_read", "edit", "submit", "other")


def turn_kind(step: dict, reads_so_far: int, parts: int) -> str:
    """The kind of one turn, given how many stream reads the episode made before it."""
    tools = step.get("tool_calls") or []
    if step.get("edited"):
        return "edit"
    if STREAM_TOOL in tools:
        if reads_so_far < parts:
            return "read"
        return "end_check" if reads_so_far == parts else "late_read"
    if "submit" in tools:
        return "submit"
    return "other"


def breakdown(episodes: list[dict]) -> dict:
    """The figures of one policy's retention episodes (see the module docstring)."""
    flops: Counter[str] = Counter()
    rebuilt = 0.0
    counts: Counter[str] = Counter()
    solved = read_all = solved_read_all = 0
    for episode in episodes:
        if episode.get("family") != "retention":
            raise ValueError(f"{episode.get('task_id')}: not a retention episode")
        if episode.get("difficulty") not in PRESETS:
            raise ValueError(
                f"{episode.get('task_id')}: unknown retention level {episode.get('difficulty')!r}"
            )
        parts = PRESETS[episode["difficulty"]].n_chunks
        reads = 0
        for step in episode["steps"]:
            kind = turn_kind(step, reads, parts)
            cost = float((step.get("cost") or {}).get("flops", 0.0))
            flops[kind] += cost
            counts[kind] += 1
            if step.get("prompt_source") == "rebuild" and step.get("rebuild_reason") == "edit":
                rebuilt += cost
            reads += kind in ("read", "end_check", "late_read")
        success = bool(episode["success"])
        solved += success
        if reads >= parts:
            read_all += 1
            solved_read_all += success
    n = len(episodes)
    total = sum(flops.values())
    not_all = n - read_all
    return {
        "episodes": n,
        "solved": solved,
        "gflop_per_success": total / 1e9 / solved if solved else None,
        "gflop_per_episode": total / 1e9 / n,
        "per_episode": {kind: counts[kind] / n for kind in KINDS},
        "compute_share": {kind: flops[kind] / total for kind in KINDS},
        "rebuilt_after_edit_share": rebuilt / total,
        "read_every_part": read_all,
        "success_if_read_every_part": solved_read_all / read_all if read_all else None,
        "success_otherwise": (solved - solved_read_all) / not_all if not_all else None,
    }


def load(folder: Path) -> list[dict]:
    """The episodes of ``folder/trajectories.jsonl``, read by the project's one JSONL reader."""
    return [episode for _, episode in json_lines(folder / "trajectories.jsonl")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "folders", nargs="+", type=Path, help="eval or rollout folders with trajectories.jsonl"
    )
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    try:
        table = {folder.name: breakdown(load(folder)) for folder in args.folders}
    except (UsageError, ValueError, KeyError) as exc:  # a file, a line or a field
        print(f"cost_breakdown: {exc}", file=sys.stderr)
        return 2
    header = (
        "policy | solved | GFLOP/success | reads | end checks | late reads | edits | "
        "compute: read / end check / late / edit / submit"
    )
    print(header)
    for name, row in table.items():
        share = row["compute_share"]
        per = row["per_episode"]
        print(
            f"{name} | {row['solved']}/{row['episodes']} | {row['gflop_per_success'] or 0:.0f} | "
            f"{per['read']:.2f} | {per['end_check']:.2f} | {per['late_read']:.2f} | {per['edit']:.2f} | "
            f"{share['read']:.2f} / {share['end_check']:.2f} / {share['late_read']:.2f} / {share['edit']:.2f} / "
            f"{share['submit']:.2f}"
        )
    if args.out is not None:
        args.out.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
