"""Bring your own tasks: load them from a JSONL file or from task folders.

JSONL: one task object per line (the shape of ``Task.to_dict()``; see ``Task.from_dict`` for required fields and
defaults). Blank lines are skipped.

Folders: ``DIR/<name>/task.json`` (a task object, ``files`` optional) plus ``DIR/<name>/files/``, whose files
become the workspace files under their relative paths. ``DIR`` may also be one task folder itself.

Every problem raises :class:`~ctxrl.errors.TaskError` naming the file, the line (JSONL) and the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from ctxrl.env.tasks.base import Task
from ctxrl.errors import TaskError


def load_tasks(path: str | Path) -> list[Task]:
    """Every task in a ``.jsonl`` file or a folder of task folders, in file order / folder-name order."""
    path = Path(path)
    if not path.exists():
        raise TaskError(f"{path}: no such task file or folder")
    tasks = _load_dir(path) if path.is_dir() else _load_jsonl(path)
    seen: dict[str, str] = {}
    for task in tasks:
        if task.task_id in seen:
            raise TaskError(f"{path}: task_id {task.task_id!r} appears twice; task ids must be unique")
        seen[task.task_id] = task.task_id
    return tasks


def _load_jsonl(path: Path) -> list[Task]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskError(f"{path}: cannot read as UTF-8 text ({exc})") from None
    tasks = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            data = json.loads(line)
        except ValueError as exc:
            raise TaskError(f"{where}: not valid JSON ({exc})") from None
        tasks.append(Task.from_dict(data, where=where))
    if not tasks:
        raise TaskError(f"{path}: no tasks in the file")
    return tasks


def _load_dir(path: Path) -> list[Task]:
    if (path / "task.json").is_file():
        return [_load_task_folder(path)]
    folders = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise TaskError(f"{path}: no task folders (expected {path}/<name>/task.json)")
    return [_load_task_folder(folder) for folder in folders]


def _load_task_folder(folder: Path) -> Task:
    spec = folder / "task.json"
    if not spec.is_file():
        raise TaskError(f"{folder}: missing task.json")
    try:
        data = json.loads(spec.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TaskError(f"{spec}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise TaskError(f"{spec}: expected a JSON object, got {type(data).__name__}")
    files_dir = folder / "files"
    if files_dir.is_dir():
        given = data.get("files", {})
        if not isinstance(given, dict):
            raise TaskError(f"{spec}: field 'files' must be an object mapping paths to text")
        files = dict(given)
        for file in sorted(p for p in files_dir.rglob("*") if p.is_file()):
            rel = file.relative_to(files_dir).as_posix()
            if rel in files:
                raise TaskError(f"{file}: also given in task.json field 'files'; keep one of the two")
            try:
                files[rel] = file.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise TaskError(f"{file}: not UTF-8 text (task files must be text)") from None
        data = {**data, "files": files}
    return Task.from_dict(data, where=str(spec))


class FileTaskSource:
    """User tasks from a JSONL file or task folders, as a :class:`~ctxrl.env.tasks.base.TaskSource`.

    Loads (and validates) everything on construction, so a malformed task fails before any episode runs.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._tasks = load_tasks(self.path)

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(sorted({t.family for t in self._tasks}))

    def tasks(self, split: str, n: int | None = None) -> Iterator[Task]:
        chosen = [t for t in self._tasks if t.split == split]
        if not chosen:
            splits = sorted({t.split for t in self._tasks})
            raise TaskError(f"{self.path}: no tasks in split {split!r}; its splits: {', '.join(splits)}")
        yield from chosen if n is None else chosen[:n]
