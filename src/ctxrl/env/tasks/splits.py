"""Seed ranges of the built-in splits: disjoint, and fixed forever (changing them would reshuffle datasets).

A built-in task is a pure function of (family, seed, difficulty), so its split is a function of its seed.
"""

from __future__ import annotations

from ctxrl.errors import TaskError

SPLIT_RANGES: dict[str, range] = {
    "train": range(0, 100_000),
    "dev": range(100_000, 110_000),
    "test": range(110_000, 120_000),
}
"""Seeds of each split."""

EXTRA = "extra"
"""The split name of seeds from 120,000 up: in no built-in split, free for ad-hoc experiments."""


def split_of(seed: int) -> str:
    """The split ``seed`` belongs to (``extra`` from 120,000 up); :class:`TaskError` for a negative seed."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise TaskError(f"a task seed must be an integer >= 0, not {seed!r}; {describe_splits()}")
    for name, seeds in SPLIT_RANGES.items():
        if seed in seeds:
            return name
    return EXTRA


def split_seeds(split: str, n: int | None = None, offset: int = 0) -> range:
    """``n`` seeds of ``split`` in order, from its ``offset``-th on (all of them when ``n`` is None)."""
    if split not in SPLIT_RANGES:
        raise TaskError(f"unknown split {split!r}; known splits: {', '.join(SPLIT_RANGES)}")
    seeds = SPLIT_RANGES[split]
    if not 0 <= offset <= len(seeds):
        raise TaskError(f"split {split!r} has {len(seeds)} seeds; cannot start at offset {offset}")
    if n is None:
        return seeds[offset:]
    if not 0 <= n <= len(seeds) - offset:
        raise TaskError(f"split {split!r} has {len(seeds)} seeds; cannot take n={n} from offset {offset}")
    return seeds[offset : offset + n]


def describe_splits() -> str:
    return "splits: " + ", ".join(f"{k} {v.start}-{v.stop - 1}" for k, v in SPLIT_RANGES.items())
