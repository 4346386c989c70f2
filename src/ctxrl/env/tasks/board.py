"""Family ``board``: track a grid through a long stream of events; the answer is the final grid.

``next_events`` serves the event log batch by batch (consumed once). Only lines marked ``EVENT`` change the
board; ``REJECTED`` proposals (which would move a piece somewhere it never goes) and telemetry do not. Relative
events (``shift``, ``swap``) need the current positions, so the state must really be tracked.

Efficiency: the state is a few dozen characters, the stream thousands. A manager keeps one copy of the grid and
edits it in place after each batch (a small edit near the end of the context); re-emitting the whole grid
every batch, or keeping the batches, costs more tokens and prefix reuse. Success is only exact correctness;
the efficiency channel (``ctxrl.rewards``) is what prefers in-place updates among successful episodes.
``metadata["state_chars"]`` gives the size of one copy of the state for that comparison.

The stream tool is a harness tool (:func:`ctxrl.env.tasks._gen.stream_tool`): a shell cannot filter a part
before it reaches the context. A part is consumed, so it is no file view either.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ctxrl.env.tasks import _gen
from ctxrl.env.tasks.base import Task, VerifierSpec
from ctxrl.env.tasks.splits import split_of

FAMILY = "board"


@dataclass(frozen=True)
class Knobs:
    height: int
    width: int
    n_pieces: int
    n_batches: int
    """Tool calls to read the whole stream."""
    events_per_batch: int
    """Board-changing lines per batch."""
    noise_per_batch: int
    """Lines per batch that change nothing (telemetry, rejected proposals)."""
    budget_tokens: int
    max_steps: int


PRESETS = {
    "easy": Knobs(
        5, 5, 5, n_batches=10, events_per_batch=3, noise_per_batch=10, budget_tokens=2500, max_steps=24
    ),
    "default": Knobs(
        6, 6, 8, n_batches=24, events_per_batch=4, noise_per_batch=14, budget_tokens=2500, max_steps=40
    ),
    "hard": Knobs(
        8, 8, 12, n_batches=36, events_per_batch=5, noise_per_batch=14, budget_tokens=2500, max_steps=56
    ),
}

Pos = tuple[int, int]
_DIRS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"  # no I or O: they read like 1 and 0 in a grid


def render(pieces: dict[str, Pos], height: int, width: int) -> str:
    """The grid as text: ``height`` lines of ``width`` cells separated by one space, ``.`` for empty."""
    cells = [["."] * width for _ in range(height)]
    for letter, (row, col) in pieces.items():
        cells[row][col] = letter
    return "\n".join(" ".join(row) for row in cells)


def _cell(pos: Pos) -> str:
    return f"r{pos[0] + 1}c{pos[1] + 1}"


class _Board:
    """The true state while events are generated; every event it emits is valid on the current state."""

    def __init__(self, r: random.Random, k: Knobs) -> None:
        self.r, self.k = r, k
        everywhere = [(row, col) for row in range(k.height) for col in range(k.width)]
        letters = r.sample(_LETTERS, k.n_pieces)
        self.pieces: dict[str, Pos] = dict(zip(letters, r.sample(everywhere, k.n_pieces)))
        self.everywhere = everywhere

    def empty_cells(self) -> list[Pos]:
        taken = set(self.pieces.values())
        return [p for p in self.everywhere if p not in taken]

    def event(self) -> str:
        """Apply one random valid event and describe it."""
        r, pieces = self.r, self.pieces
        while True:
            kind = r.choices(["move", "shift", "swap", "remove", "add"], weights=[3, 4, 2, 1, 1])[0]
            if kind == "move" and pieces:
                letter = r.choice(sorted(pieces))
                pieces[letter] = r.choice(self.empty_cells())
                return f"move {letter} -> {_cell(pieces[letter])}"
            if kind == "shift" and pieces:
                letter = r.choice(sorted(pieces))
                name, (dr, dc) = r.choice(sorted(_DIRS.items()))
                steps = r.randint(1, 3)
                row, col = pieces[letter][0] + dr * steps, pieces[letter][1] + dc * steps
                if 0 <= row < self.k.height and 0 <= col < self.k.width and (row, col) in self.empty_cells():
                    pieces[letter] = (row, col)
                    return f"shift {letter} {name} {steps}"
            if kind == "swap" and len(pieces) >= 2:
                a, b = r.sample(sorted(pieces), 2)
                pieces[a], pieces[b] = pieces[b], pieces[a]
                return f"swap {a} {b}"
            if kind == "remove" and len(pieces) > self.k.n_pieces // 2:
                letter = r.choice(sorted(pieces))
                del pieces[letter]
                return f"remove {letter}"
            if kind == "add" and len(pieces) < self.k.n_pieces + 2:
                letter = r.choice([c for c in _LETTERS if c not in pieces])
                pieces[letter] = r.choice(self.empty_cells())
                return f"add {letter} at {_cell(pieces[letter])}"

    def rejected(self) -> str:
        """A proposal that is never applied (a plausible move to an empty cell)."""
        letter = self.r.choice(sorted(self.pieces))
        return f"proposal REJECTED (no change): move {letter} -> {_cell(self.r.choice(self.empty_cells()))}"


def _telemetry(r: random.Random) -> str:
    if r.random() < 0.5:
        return (
            f"sensor s-{r.randint(1, 40)} temp={r.randint(150, 290) / 10}C humidity={r.randint(20, 80)}% "
            f"vibration={r.randint(0, 99)} status={r.choice(['ok', 'ok', 'ok', 'warn'])}"
        )
    return f"operator note: {_gen.sentence(r)}"


def generate(seed: int, difficulty: str = "default") -> Task:
    """The board task for ``seed`` at ``difficulty`` (``easy`` / ``default`` / ``hard``)."""
    k = _gen.pick_preset(PRESETS, FAMILY, difficulty)
    r = _gen.rng(FAMILY, seed, difficulty)
    board = _Board(r, k)
    start = render(board.pieces, k.height, k.width)

    batches: list[str] = []
    seq = 0
    for b in range(k.n_batches):
        kinds = ["event"] * k.events_per_batch + ["noise"] * k.noise_per_batch
        r.shuffle(kinds)
        lines = []
        for kind in kinds:
            seq += 1
            if kind == "event":
                lines.append(f"#{seq:04d} EVENT {board.event()}")
            elif r.random() < 0.3:
                lines.append(f"#{seq:04d} {board.rejected()}")
            else:
                lines.append(f"#{seq:04d} {_telemetry(r)}")
        batches.append(f"=== event log, batch {b + 1}/{k.n_batches} ===\n" + "\n".join(lines))
    final = render(board.pieces, k.height, k.width)

    prompt = (
        f"A {k.height}x{k.width} board starts as shown below: row r1 is the top line, column c1 the left "
        "cell, `.` is an empty cell, letters are pieces.\n\n"
        f"{start}\n\n"
        f"Call the tool `next_events` (no arguments) once per batch until it reports the end of the stream; "
        f"there are {k.n_batches} batches and each is delivered once. Apply the lines marked EVENT, in order:\n"
        "- `move X -> rRcC`: piece X goes to row R, column C.\n"
        "- `shift X DIR N`: piece X moves N cells up, down, left or right.\n"
        "- `swap X Y`: pieces X and Y exchange places.\n"
        "- `remove X`: piece X leaves the board.\n"
        "- `add X at rRcC`: piece X is placed at row R, column C.\n"
        "Every other line (telemetry, REJECTED proposals, notes) changes nothing.\n\n"
        f"Answer with the final board in the same format: {k.height} lines of {k.width} cells separated by "
        "spaces. The event log is several times larger than your context budget."
    )
    stream = _gen.stream_tool(
        "next_events", "Print the next batch of the board's event log (no arguments); each batch is delivered once.",
        batches,
    )  # fmt: skip
    return Task(
        task_id=f"{FAMILY}:{difficulty}:{seed}",
        family=FAMILY,
        split=split_of(seed),
        seed=seed,
        difficulty=difficulty,
        prompt=prompt,
        files={},
        private_files=stream.files,
        tools=[stream.tool],
        verifier=VerifierSpec(kind="board", expected=final),
        budget_tokens=k.budget_tokens,
        max_steps=k.max_steps,
        metadata={
            "initial": start,
            "final": final,
            "oracle_answer": final,
            "state_chars": len(final),
            "efficiency_note": (
                "success is exact correctness of the final grid; among successful episodes the efficiency "
                "channel prefers keeping one grid and editing it in place over re-emitting it every batch"
            ),
            "observation_calls": ["tools/next_events"] * k.n_batches,
            "observation_chars": sum(len(b) + 1 for b in batches),
            "working_set_chars": len(final),
        },
    )
