"""The offline task suite: task data model, built-in families, splits, user task loading.

Families (each a deterministic ``(seed, difficulty) -> Task``): ``retention``, ``board``, ``offload``, ``repo``,
``research``. See :mod:`ctxrl.env.tasks.base` for the data model and :mod:`ctxrl.env.tasks.toolscript` for how
tools are invoked.
"""

from ctxrl.env.tasks.base import (
    VERIFIER_KINDS,
    Task,
    TaskSource,
    ToolSpec,
    VerifierSpec,
    private_root,
    task_fingerprint,
)
from ctxrl.env.tasks.loader import FileTaskSource, load_tasks
from ctxrl.env.tasks.registry import (
    DIFFICULTIES,
    FAMILIES,
    BuiltinTaskSource,
    from_dataset_row,
    make_task,
    task_to_row,
    to_dataset,
)
from ctxrl.env.tasks.splits import SPLIT_RANGES, split_of, split_seeds
from ctxrl.env.tasks.verifiers import Verdict

__all__ = [
    "DIFFICULTIES",
    "FAMILIES",
    "SPLIT_RANGES",
    "VERIFIER_KINDS",
    "BuiltinTaskSource",
    "FileTaskSource",
    "Task",
    "TaskSource",
    "ToolSpec",
    "Verdict",
    "VerifierSpec",
    "from_dataset_row",
    "load_tasks",
    "make_task",
    "private_root",
    "split_of",
    "split_seeds",
    "task_fingerprint",
    "task_to_row",
    "to_dataset",
]
