"""The built-in task families, their splits, and export to ``datasets``.

``make_task("retention", 42)`` is the whole API most callers need. A built-in task is a pure function of
(family, seed, difficulty); its split follows from its seed (:mod:`ctxrl.env.tasks.splits`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ctxrl.env.tasks import board, doors, offload, repo, research, retention
from ctxrl.env.tasks.base import Task
from ctxrl.env.tasks.splits import SPLIT_RANGES, split_seeds
from ctxrl.errors import TaskError

if TYPE_CHECKING:
    import datasets

Generator = Callable[[int, str], Task]

FAMILIES: dict[str, Generator] = {
    "retention": retention.generate,
    "board": board.generate,
    "offload": offload.generate,
    "repo": repo.generate,
    "research": research.generate,
}
"""The benchmark families: name → generator ``(seed, difficulty) -> Task``. "All families" means these."""

TOY_FAMILIES: dict[str, Generator] = {"doors": doors.generate}
"""Toy families for the golden learning tests (:mod:`ctxrl.env.tasks.doors`): made and trained on by name
(``tasks.families=[doors]``), never part of "all families"."""

LEVELS: dict[str, tuple[str, ...]] = {
    name: tuple(module.PRESETS) for name, module in (
        ("retention", retention), ("board", board), ("offload", offload), ("repo", repo), ("research", research),
        ("doors", doors),
    )
}  # fmt: skip
"""Family name → its difficulty levels. Every benchmark family has ``easy``, ``default`` and ``hard``;
``short`` (a curriculum level of ~1k-token contexts for training small models) exists where a family defines
it, and ``retention`` has two rungs below it (``mini``, ``small``: one value to keep, fewer confusers); the toy ``doors`` has ``bandit`` and ``detour``."""

DIFFICULTIES = ("mini", "small", "short", "easy", "default", "hard", "bandit", "detour")
"""Every level of some family (:data:`LEVELS` says which family has which)."""

KNOWN_FAMILIES: tuple[str, ...] = (*FAMILIES, *TOY_FAMILIES)
"""Every family a task can be made of by name: the benchmark families, then the toys."""


def check_difficulty(families: Sequence[str], difficulty: str) -> None:
    """:class:`TaskError` unless every family of ``families`` (all of them when empty) has ``difficulty``."""
    if difficulty not in DIFFICULTIES:
        raise TaskError(f"unknown difficulty {difficulty!r}; difficulties: {', '.join(DIFFICULTIES)}")
    lacking = [f for f in (families or FAMILIES) if f in LEVELS and difficulty not in LEVELS[f]]
    if lacking:
        having = [f for f, levels in LEVELS.items() if difficulty in levels]
        raise TaskError(
            f"difficulty {difficulty!r} exists only for {', '.join(having)}; {', '.join(lacking)} "
            f"{'has' if len(lacking) == 1 else 'have'} {', '.join(LEVELS[lacking[0]])}: choose the families "
            "(tasks.families=[...]) or another difficulty"
        )


def _generator(family: str) -> Generator:
    generate = FAMILIES.get(family) or TOY_FAMILIES.get(family)
    if generate is None:
        raise TaskError(f"unknown task family {family!r}; known families: {', '.join(KNOWN_FAMILIES)}")
    return generate


def make_task(family: str, seed: int, difficulty: str = "default", *, split: str | None = None) -> Task:
    """The built-in task of ``family`` for ``seed`` at ``difficulty``.

    With ``split``, the seed must lie in that split's range (:class:`TaskError` otherwise), which guards
    against evaluating on training seeds by accident.
    """
    generate = _generator(family)
    if split is not None:
        seeds = split_seeds(split)
        if seed not in seeds:
            raise TaskError(
                f"seed {seed} is not in split {split!r}, whose seeds are {seeds.start}-{seeds.stop - 1}; "
                f"use split_seeds({split!r}, n) to pick seeds"
            )
    return generate(seed, difficulty)


class BuiltinTaskSource:
    """The built-in families as a :class:`~ctxrl.env.tasks.base.TaskSource`.

    ``tasks(split, n)`` walks the split's seeds in order and yields one task per family for each seed
    (round-robin), so any prefix is balanced across families.
    """

    def __init__(self, families: Sequence[str] | None = None, difficulty: str = "default") -> None:
        chosen = tuple(families) if families is not None else tuple(FAMILIES)
        for family in chosen:
            _generator(family)
        if not chosen:
            raise TaskError(f"no task family chosen; known families: {', '.join(FAMILIES)}")
        self._families = chosen
        self.difficulty = difficulty

    @property
    def families(self) -> tuple[str, ...]:
        return self._families

    def tasks(self, split: str, n: int | None = None) -> Iterator[Task]:
        total = len(split_seeds(split)) * len(self._families)
        yield from self.window(split, 0, total if n is None else min(n, total))

    def window(self, split: str, start: int, n: int, *, wrap: bool = False) -> list[Task]:
        """Tasks ``start`` .. ``start + n - 1`` of ``split``'s stream (seed by seed, one task per family):
        the one task stream of training (step k of ``count`` tasks: ``window(split, k * count, count,
        wrap=True)``, wrapping around the split), evaluation (the first n) and evolution (each round the next
        ones). Without ``wrap`` a window past the split's end is a TaskError."""
        seeds, families = split_seeds(split), self._families
        out = []
        for i in range(start, start + n):
            j = i // len(families)
            if j >= len(seeds):
                if not wrap:
                    raise TaskError(
                        f"the {split} split has no task {i} ({len(seeds)} seeds x {len(families)} families)"
                    )
                j %= len(seeds)
            out.append(make_task(families[i % len(families)], seeds[j], self.difficulty, split=split))
        return out


def task_to_row(task: Task) -> dict[str, Any]:
    """One flat dataset row: a few columns to filter and read, plus the whole task as JSON."""
    return {
        "task_id": task.task_id,
        "family": task.family,
        "split": task.split,
        "seed": task.seed,
        "difficulty": task.difficulty,
        "prompt": task.prompt,
        "budget_tokens": task.budget_tokens,
        "max_steps": task.max_steps,
        # Files, tools and metadata differ in shape per family; one JSON column keeps the schema fixed.
        "task_json": json.dumps(task.to_dict(), sort_keys=True),
    }


def from_dataset_row(row: dict[str, Any]) -> Task:
    """The task a row of :func:`to_dataset` holds (exactly the task that was exported)."""
    if "task_json" not in row:
        raise TaskError(
            f"dataset row has no 'task_json' column (columns: {', '.join(row)}); not a ctxrl task row"
        )
    try:
        data = json.loads(row["task_json"])
    except (TypeError, ValueError) as exc:
        raise TaskError(
            f"dataset row {row.get('task_id')!r}: column 'task_json' is not valid JSON ({exc})"
        ) from None
    return Task.from_dict(data, where=f"dataset row {row.get('task_id')!r}")


def to_dataset(family: str, split: str, n: int, difficulty: str = "default") -> datasets.Dataset:
    """The first ``n`` tasks of ``family`` in ``split`` as a ``datasets.Dataset`` (one row per task)."""
    import datasets  # heavy import, only when exporting

    _generator(family)
    rows = [task_to_row(make_task(family, seed, difficulty)) for seed in split_seeds(split, n)]
    return datasets.Dataset.from_list(rows)


__all__ = [
    "DIFFICULTIES",
    "FAMILIES",
    "KNOWN_FAMILIES",
    "LEVELS",
    "SPLIT_RANGES",
    "TOY_FAMILIES",
    "BuiltinTaskSource",
    "check_difficulty",
    "from_dataset_row",
    "make_task",
    "split_seeds",
    "task_to_row",
    "to_dataset",
]
