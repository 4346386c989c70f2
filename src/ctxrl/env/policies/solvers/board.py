"""Board solver: apply the EVENT lines it sees to the board it last wrote down (or the task's start board).

Reads the region in order: a board snapshot (``[board after batch k/N]`` and the grid) replaces the state,
an ``EVENT`` line changes it, everything else changes nothing. Facts: the current board as a snapshot. A
snapshot always comes after the events it includes (a note replaces them, prose precedes the next result),
so reading in order applies every event exactly once. Submits after the last batch.
"""

from __future__ import annotations

import re

from ctxrl.env.policies.view import Call, Plan, View

_SIZE = re.compile(r"A (\d+)x(\d+) board starts as shown below")
_BATCHES = re.compile(r"there are (\d+) batches")
_SNAPSHOT = re.compile(r"^\[board after batch (\d+)/(\d+)\]$")
_BATCH = re.compile(r"event log, batch (\d+)/(\d+)")
_EVENT = re.compile(r"#\d+ EVENT (.+)$")
_CELL = re.compile(r"r(\d+)c(\d+)")
_DIRS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_END = "(end of stream"

Grid = list[list[str]]


def _grid_at(lines: list[str], start: int, height: int, width: int) -> Grid | None:
    """The ``height`` x ``width`` grid written on ``lines[start:]``, or None if it is not all there."""
    rows = lines[start : start + height]
    grid = [row.split() for row in rows]
    if len(grid) != height or any(len(r) != width or any(len(c) != 1 for c in r) for r in grid):
        return None
    return grid


def _find(grid: Grid, piece: str) -> tuple[int, int] | None:
    for r, row in enumerate(grid):
        for c, cell in enumerate(row):
            if cell == piece:
                return r, c
    return None


def apply_event(grid: Grid, event: str) -> None:
    """Apply one event (``move``, ``shift``, ``swap``, ``remove``, ``add``) in place; ignores what it cannot read."""
    words = event.split()
    if not words:
        return
    kind, args = words[0], words[1:]
    if kind in ("move", "add") and args:
        target = _CELL.search(event)
        if target is None:
            return
        old = _find(grid, args[0])
        if old is not None:
            grid[old[0]][old[1]] = "."
        row, col = int(target.group(1)) - 1, int(target.group(2)) - 1
        if 0 <= row < len(grid) and 0 <= col < len(grid[0]):
            grid[row][col] = args[0]
    elif kind == "shift" and len(args) == 3 and args[1] in _DIRS and args[2].isdigit():
        old = _find(grid, args[0])
        if old is None:
            return
        dr, dc = _DIRS[args[1]]
        row, col = old[0] + dr * int(args[2]), old[1] + dc * int(args[2])
        if 0 <= row < len(grid) and 0 <= col < len(grid[0]):
            grid[old[0]][old[1]] = "."
            grid[row][col] = args[0]
    elif kind == "swap" and len(args) == 2:
        a, b = _find(grid, args[0]), _find(grid, args[1])
        if a is not None and b is not None:
            grid[a[0]][a[1]], grid[b[0]][b[1]] = args[1], args[0]
    elif kind == "remove" and args:
        old = _find(grid, args[0])
        if old is not None:
            grid[old[0]][old[1]] = "."


def render(grid: Grid) -> str:
    return "\n".join(" ".join(row) for row in grid)


def solve(view: View) -> Plan:
    size = _SIZE.search(view.task)
    height, width = (int(size.group(1)), int(size.group(2))) if size else (0, 0)
    total = int(m.group(1)) if (m := _BATCHES.search(view.task)) else 0
    task_lines = view.task.splitlines()
    start = next(
        (i for i in range(len(task_lines)) if _grid_at(task_lines, i, height, width) is not None), None
    )
    grid = _grid_at(task_lines, start, height, width) if start is not None else None
    grid = grid or [["."] * width for _ in range(height)]
    read, ended = 0, False
    for text in view.texts():
        lines = text.splitlines()
        for i, line in enumerate(lines):
            snapshot = _SNAPSHOT.match(line)
            if snapshot and (found := _grid_at(lines, i + 1, height, width)) is not None:
                grid, read = found, max(read, int(snapshot.group(1)))
            elif batch := _BATCH.search(line):
                read = max(read, int(batch.group(1)))
            elif event := _EVENT.search(line):
                apply_event(grid, event.group(1))
            ended = ended or _END in line
    facts = (f"[board after batch {read}/{total}]", render(grid))
    if ended or (total and read >= total):
        return Plan((Call("submit", {"answer": render(grid)}),), facts)
    return Plan((Call("next_events"),), facts)
