"""The task data model: :class:`Task`, its tools (:class:`ToolSpec`) and its grader (:class:`VerifierSpec`).

Everything here is a plain dataclass that round-trips through JSON (``to_dict`` / ``from_dict``), so built-in
tasks, user tasks from JSONL or task folders, and rows of a ``datasets.Dataset`` are the same thing.

What the model sees of a task: ``prompt``, the workspace (``files`` plus one executable script per workspace
tool) and the tools' names, descriptions and parameters. What it must not see: ``verifier`` (holds the answer) and
``metadata`` (holds ground truth for tests and scripted policies). The environment keeps those two out of
every observation.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, runtime_checkable

from ctxrl.env.tasks import verifiers
from ctxrl.env.tasks.verifiers import Verdict
from ctxrl.errors import TaskError

VERIFIER_KINDS = ("exact", "all_values", "board", "command", "json_fields")
"""Every verifier kind :class:`VerifierSpec` knows."""

REFERENCE_CHARS_PER_TOKEN = 3.5
"""The tokenizer density task budgets are sized for (``Task.budget_tokens``); see :meth:`Task.budget_for`."""

_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
_JSON_TYPES = ("string", "integer", "number", "boolean", "array", "object")


class SandboxLike(Protocol):
    """What the ``command`` verifier needs of a sandbox (``ctxrl.env.sandbox.Sandbox`` is one)."""

    def run(self, command: str, *, timeout_s: float | None = None) -> Any: ...


SandboxFactory = Callable[[Path], SandboxLike]
"""Builds the sandbox of a workspace; the ``command`` verifier runs its check in it."""


def _path_problem(path: object) -> str | None:
    """Why ``path`` is not a plain relative POSIX path inside the workspace, or None if it is."""
    if not isinstance(path, str) or not path:
        return f"{path!r} is not a path"
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or "\\" in path or "\0" in path:
        return f"{path!r} is not a relative path inside the workspace (no leading '/', no '..')"
    return None


@dataclass(frozen=True)
class ToolSpec:
    """One task tool: its function-calling schema and the workspace command that implements it.

    Invocation (the same in every mode, see :mod:`ctxrl.env.tasks.toolscript`): the harness turns a function
    call ``name(arguments)`` into ``to_shell(arguments)``, i.e. ``command --key value …`` with every piece
    shell-quoted, and runs it in the episode sandbox with the workspace as cwd; the command's output is the
    tool result. A model in file mode types the same command line.
    """

    name: str
    """Function name the model calls (letters, digits, ``_``, ``-``)."""
    description: str
    """One or two sentences for the model: what the tool does and returns."""
    parameters: dict[str, Any]
    """JSON schema of the arguments: ``{"type": "object", "properties": {...}, "required": [...]}``."""
    command: str
    """Command line prefix run in the workspace, e.g. ``tools/search``."""
    script: str | None = None
    """Python source written to the path ``command`` by :meth:`Task.materialize` (made executable); None for a
    command that already exists in the sandbox or among the task's files."""
    private: bool = False
    """A **harness tool**: its script (and the task's ``private_files`` it reads) live in the episode's private
    folder (:func:`private_root`), not in the workspace, and only a function call runs it. A shell cannot
    run, read or filter it, so its output reaches the context whole. False: a **workspace tool**, a script the
    model may also run from the shell (and pipe, redirect or grep)."""
    view: str | None = None
    """The key of the document a successful call's output is a view of, as a template over the arguments
    (``reports/{name}.txt``, ``{doc_id}``); None: the output is no document view (a consumed stream part, a
    test report). Usage mode lists such results under File Views and ``evict_file_view`` drops them by key
    (see :meth:`view_key`)."""

    def __post_init__(self) -> None:
        problem = _tool_problem(self.name, self.description, self.parameters, self.command, self.script)
        problem = problem or _view_problem(self.view, self.parameters)
        if self.private and self.script is None:
            problem = problem or "field 'private' needs field 'script' (a harness tool runs its own script)"
        if problem:
            raise TaskError(f"tool {self.name!r}: {problem}")

    def view_key(self, arguments: Mapping[str, Any]) -> str | None:
        """The document key of a call with ``arguments`` (the :attr:`view` template filled with the argument
        values as given, stripped), or None when the tool has no view or an argument it names is missing.

        >>> ToolSpec("read", "", {"type": "object", "properties": {"doc_id": {}}}, "tools/read",
        ...          view="doc {doc_id}").view_key({"doc_id": " D007 "})
        'doc D007'
        """
        if self.view is None:
            return None
        names = set(_VIEW_FIELD.findall(self.view))
        if not names <= set(arguments):
            return None
        values = {k: str(arguments[k]).strip() for k in names}
        return _VIEW_FIELD.sub(lambda m: values[m.group(1)], self.view)

    def to_shell(self, arguments: Mapping[str, Any]) -> str:
        """The shell command line that runs this tool with ``arguments``; never raises on a mapping.

        Strings are passed as given, other values as JSON; every piece is quoted, so any argument text is
        safe. The tool itself validates the arguments (and answers a wrong call with a usage line).

        >>> ToolSpec("search", "", {"type": "object"}, "tools/search").to_shell({"query": "it's here", "k": 3})
        "tools/search --query 'it'\\"'\\"'s here' --k 3"
        """
        parts = [self.command]
        for key, value in arguments.items():
            text = value if isinstance(value, str) else json.dumps(value)
            parts += [shlex.quote(f"--{key}"), shlex.quote(text)]
        return " ".join(parts)

    def usage(self) -> str:
        """One line showing the shell form, e.g. ``tools/read --doc_id STRING``."""
        slots = []
        required = self.parameters.get("required", [])
        for key, prop in self.parameters.get("properties", {}).items():
            slot = f"--{key} {str(prop.get('type', 'string')).upper()}"
            slots.append(slot if key in required else f"[{slot}]")
        return " ".join([self.command, *slots])

    def to_openai(self) -> dict[str, Any]:
        """The tool as an OpenAI / chat-template function definition."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "command": self.command,
            "script": self.script,
            "private": self.private,
            "view": self.view,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "tool") -> ToolSpec:
        """Build from a dict; a wrong or missing field raises :class:`TaskError` naming ``where`` and the field."""
        d = _expect_mapping(data, where)
        _no_unknown(d, ("name", "description", "parameters", "command", "script", "private", "view"), where)
        values = {
            "name": _field(d, "name", str, where),
            "description": _field(d, "description", str, where, default=""),
            "parameters": _field(d, "parameters", dict, where, default={"type": "object", "properties": {}}),
            "command": _field(d, "command", str, where),
            "script": _field(d, "script", (str, type(None)), where, default=None),
        }
        problem = _tool_problem(**values)
        private = _field(d, "private", bool, where, default=False)
        view = _field(d, "view", (str, type(None)), where, default=None)
        problem = problem or _view_problem(view, values["parameters"])
        if private and values["script"] is None:
            problem = problem or "field 'private' needs field 'script' (a harness tool runs its own script)"
        if problem:
            raise TaskError(f"{where}: {problem}")
        return cls(**values, private=private, view=view)


_VIEW_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_-]*)\}")


def _view_problem(view: Any, parameters: Any) -> str | None:
    """What is wrong with a tool's ``view`` template, or None."""
    if view is None:
        return None
    if not isinstance(view, str) or not view.strip():
        return "field 'view' must be a non-empty key template or null"
    props = parameters.get("properties", {}) if isinstance(parameters, dict) else {}
    unknown = [k for k in _VIEW_FIELD.findall(view) if k not in props]
    if unknown:
        return f"field 'view' names {unknown}, which are not parameters of the tool"
    return None


def _tool_problem(name: Any, description: Any, parameters: Any, command: Any, script: Any) -> str | None:
    """What is wrong with a tool's fields, as ``field …: why``, or None."""
    if not isinstance(description, str):
        return "field 'description' must be a string"
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        return f"field 'name' must be letters, digits, '_' or '-', not {name!r}"
    if not isinstance(command, str) or not command.strip():
        return "field 'command' must be a non-empty command line"
    params = parameters
    if not isinstance(params, dict) or params.get("type") != "object":
        return 'field \'parameters\' must be a JSON schema with "type": "object"'
    props = params.get("properties", {})
    if not isinstance(props, dict):
        return "field 'parameters.properties' must be an object"
    for key, prop in props.items():
        if not _TOOL_NAME.fullmatch(key):
            return f"parameter name {key!r} must be letters, digits, '_' or '-'"
        if not isinstance(prop, dict) or prop.get("type", "string") not in _JSON_TYPES:
            return f"parameter {key!r} needs a JSON-schema type out of {', '.join(_JSON_TYPES)}"
    required = params.get("required", [])
    if not isinstance(required, list) or any(r not in props for r in required):
        return "field 'parameters.required' must list parameters named in 'properties'"
    if script is not None:
        problem = _path_problem(command)
        if problem:
            return f"field 'command' (where its script is written): {problem}"
    return None


@dataclass(frozen=True)
class VerifierSpec:
    """How an answer is graded, as data (so user tasks in JSONL can carry one).

    Kinds and the fields they use:

    - ``exact``: ``expected`` (str); equal up to whitespace (``case_sensitive``).
    - ``all_values``: ``expected`` (list of str) must each occur verbatim as a whole token, no value of
      ``forbidden`` may occur (``case_sensitive``).
    - ``board``: ``expected`` (str, one grid row per line, cells separated by spaces); the last grid of that
      shape in the answer must equal it cell for cell.
    - ``command``: ``command`` (str) runs in the workspace sandbox after the files in ``restore`` (path →
      text) are written back (so the check cannot be edited away); success iff exit status 0. The answer
      text is ignored.
    - ``json_fields``: ``expected`` (dict); the first JSON object in the answer must have these field values.
    """

    kind: str
    expected: Any = None
    forbidden: list[str] = field(default_factory=list)
    case_sensitive: bool = True
    command: str | None = None
    restore: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 60.0
    """Wall-time limit of the ``command`` check."""

    def __post_init__(self) -> None:
        problem = _verifier_problem(**self.to_dict())
        if problem:
            raise TaskError(f"verifier: {problem}")

    def verify(
        self, answer: str, workspace: Path | None = None, sandbox_factory: SandboxFactory | None = None
    ) -> Verdict:
        """Grade ``answer``; never raises on any answer (a non-string answer grades as its ``str``).

        ``command`` needs the episode ``workspace``; ``sandbox_factory`` defaults to
        ``Sandbox(workspace, SandboxConfig())`` and may raise :class:`~ctxrl.errors.SandboxError` when this
        machine has no working sandbox (a setup problem, not a wrong answer).
        """
        text = answer if isinstance(answer, str) else ("" if answer is None else str(answer))
        if self.kind == "exact":
            return verifiers.check_exact(text, self.expected, case_sensitive=self.case_sensitive)
        if self.kind == "all_values":
            return verifiers.check_all_values(
                text, self.expected, forbidden=self.forbidden, case_sensitive=self.case_sensitive
            )
        if self.kind == "board":
            return verifiers.check_board(text, self.expected)
        if self.kind == "json_fields":
            return verifiers.check_json_fields(text, self.expected)
        return self._verify_command(workspace, sandbox_factory)

    def _verify_command(self, workspace: Path | None, sandbox_factory: SandboxFactory | None) -> Verdict:
        if workspace is None:
            return Verdict(False, 0.0, "the command verifier needs the episode workspace (none given)")
        workspace = Path(workspace)
        for rel, text in self.restore.items():
            _write(workspace, rel, text)
        if sandbox_factory is None:
            from ctxrl.env.sandbox import Sandbox, SandboxConfig

            box: SandboxLike = Sandbox(workspace, SandboxConfig())
        else:
            box = sandbox_factory(workspace)
        assert self.command is not None  # checked in __post_init__
        result = box.run(self.command, timeout_s=self.timeout_s)
        tail = " ".join(str(result.output).strip().splitlines()[-3:])[-300:]
        if result.timed_out:
            return Verdict(False, 0.0, f"check timed out after {self.timeout_s:g}s: {tail}")
        if result.exit_code == 0:
            return Verdict(True, 1.0, f"check passed: {tail}")
        return Verdict(False, 0.0, f"check failed (exit {result.exit_code}): {tail}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "expected": self.expected,
            "forbidden": list(self.forbidden),
            "case_sensitive": self.case_sensitive,
            "command": self.command,
            "restore": dict(self.restore),
            "timeout_s": self.timeout_s,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "verifier") -> VerifierSpec:
        """Build from a dict; an unknown kind or a wrong field raises :class:`TaskError` naming it."""
        d = _expect_mapping(data, where)
        fields = ("kind", "expected", "forbidden", "case_sensitive", "command", "restore", "timeout_s")
        _no_unknown(d, fields, where)
        kind = _field(d, "kind", str, where)
        values = {
            "kind": kind,
            "expected": d.get("expected"),
            "forbidden": d.get("forbidden", []),
            "case_sensitive": d.get("case_sensitive", True),
            "command": d.get("command"),
            "restore": d.get("restore", {}),
            "timeout_s": d.get("timeout_s", 60.0),
        }
        problem = _verifier_problem(**values)
        if problem:
            raise TaskError(f"{where}: {problem}")
        return cls(**values)


def _verifier_problem(
    kind: Any, expected: Any, forbidden: Any, case_sensitive: Any, command: Any, restore: Any, timeout_s: Any
) -> str | None:
    """What is wrong with a verifier's fields, as ``field …: why``, or None."""
    if kind not in VERIFIER_KINDS:
        return f"unknown verifier kind {kind!r}; known kinds: {', '.join(VERIFIER_KINDS)}"
    if not isinstance(forbidden, list) or not all(isinstance(v, str) and v.strip() for v in forbidden):
        return "field 'forbidden' must be a list of non-empty strings"
    if not isinstance(case_sensitive, bool):
        return "field 'case_sensitive' must be true or false"
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
        return f"field 'timeout_s' must be a number > 0, not {timeout_s!r}"
    if kind == "exact" and not isinstance(expected, str):
        return "kind 'exact' needs field 'expected' to be a string"
    if kind == "all_values":
        if (
            not isinstance(expected, list)
            or not expected
            or not all(isinstance(v, str) and v.strip() for v in expected)
        ):
            return "kind 'all_values' needs field 'expected' to be a non-empty list of non-empty strings"
        clash = [v for v in expected if v in forbidden]
        if clash:
            return f"values both expected and forbidden: {clash}"
    if kind == "board":
        rows = verifiers.parse_grid_text(expected) if isinstance(expected, str) else []
        if not rows or len({len(r) for r in rows}) != 1:
            return "kind 'board' needs field 'expected' to be a grid: lines of equally many cells"
    if kind == "json_fields" and (not isinstance(expected, dict) or not expected):
        return "kind 'json_fields' needs field 'expected' to be a non-empty object"
    if kind == "command" and (not isinstance(command, str) or not command.strip()):
        return "kind 'command' needs field 'command' (the check to run in the workspace)"
    if not isinstance(restore, dict):
        return "field 'restore' must map workspace paths to file text"
    for rel, text in restore.items():
        problem = _path_problem(rel)
        if problem or not isinstance(text, str):
            return f"field 'restore': {problem or f'{rel!r} must map to the file text'}"
    return None


@dataclass(frozen=True)
class Task:
    """One episode's task: what the model is told, its workspace, its tools, and how it is graded."""

    task_id: str
    """Unique and stable, e.g. ``retention:default:42``."""
    family: str
    split: str
    """``train``, ``dev`` or ``test`` (user tasks may use any name)."""
    seed: int
    difficulty: str
    prompt: str
    """The task text; becomes part of the pinned prefix."""
    files: dict[str, str]
    """Workspace files: relative POSIX path → UTF-8 text."""
    tools: list[ToolSpec]
    verifier: VerifierSpec
    budget_tokens: int
    """Context budget the task is sized for, in tokens of :data:`REFERENCE_CHARS_PER_TOKEN` chars; use
    :meth:`budget_for` to get it in a given tokenizer's tokens (``HarnessConfig.budget``)."""
    max_steps: int
    """Suggested step limit (``HarnessConfig.max_steps``)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Hidden from the model: ground truth, sizes, notes for scripted policies and tests."""
    private_files: dict[str, str] = field(default_factory=dict)
    """Files only the harness tools (``ToolSpec.private``) see: written to the episode's private folder
    (:meth:`materialize_private`), never to the workspace. Data a shell must not read or filter lives here."""

    def __post_init__(self) -> None:
        problem = _task_problem(
            self.budget_tokens, self.max_steps, self.files, self.tools, self.private_files
        )
        if problem:
            raise TaskError(f"task {self.task_id!r}: {problem}")

    def budget_for(self, count_tokens: Callable[[str], int]) -> int:
        """The budget in the tokens of the tokenizer behind ``count_tokens`` (text → number of tokens).

        ``budget_tokens`` is sized for :data:`REFERENCE_CHARS_PER_TOKEN`. Tokenizers differ a lot on this
        text (the tiny test tokenizer needs about 1.6 chars per token, large models about 3.5), so the budget
        is scaled by the density ``count_tokens`` shows on the task's own prompt and files. The ratios the
        families are designed around (total observations several times the budget, one observation well
        under it) then hold for any tokenizer.
        """
        every = {**self.private_files, **self.files}
        sample = (self.prompt + "\n" + "\n".join(every[k] for k in sorted(every)))[:40_000]
        tokens = count_tokens(sample)
        if tokens <= 0:
            return self.budget_tokens
        chars_per_token = len(sample) / tokens
        return max(1, round(self.budget_tokens * REFERENCE_CHARS_PER_TOKEN / chars_per_token))

    def tool(self, name: str) -> ToolSpec:
        """The tool called ``name``; :class:`TaskError` naming the task's tools if there is none."""
        for tool in self.tools:
            if tool.name == name:
                return tool
        raise TaskError(
            f"task {self.task_id!r} has no tool {name!r}; its tools: {[t.name for t in self.tools]}"
        )

    def tool_help(self) -> str:
        """How to call the workspace tools from a shell, one line each (harness tools are function calls only)."""
        lines = [f"- {t.usage()}    # {t.description}" for t in self.tools if not t.private]
        return "Task tools are executable scripts in the workspace; run them from the shell:\n" + "\n".join(
            lines
        )

    def materialize(self, workspace: Path) -> None:
        """Write the task's files and workspace tool scripts into ``workspace`` (created if needed; existing
        files are overwritten). Tool scripts are made executable (0755). Harness tools and ``private_files``
        are not written here (:meth:`materialize_private`)."""
        root = Path(workspace)
        root.mkdir(parents=True, exist_ok=True)
        for rel, text in self.files.items():
            _write(root, rel, text)
        for tool in self.tools:
            if tool.script is not None and not tool.private:
                _write(root, tool.command, tool.script).chmod(0o755)

    def materialize_private(self, root: Path) -> None:
        """Write ``private_files`` and the harness tools' scripts into ``root`` (the episode's private folder,
        :func:`private_root`; created if needed). The harness runs the harness tools there, out of the
        model's reach."""
        folder = Path(root)
        folder.mkdir(parents=True, exist_ok=True)
        for rel, text in self.private_files.items():
            _write(folder, rel, text)
        for tool in self.tools:
            if tool.script is not None and tool.private:
                _write(folder, tool.command, tool.script).chmod(0o755)

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "family": self.family,
            "split": self.split,
            "seed": self.seed,
            "difficulty": self.difficulty,
            "prompt": self.prompt,
            "files": dict(self.files),
            "tools": [t.to_dict() for t in self.tools],
            "verifier": self.verifier.to_dict(),
            "budget_tokens": self.budget_tokens,
            "max_steps": self.max_steps,
            "metadata": self.metadata,
            "private_files": dict(self.private_files),
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "task") -> Task:
        """Build from a dict (``to_dict``'s output or a user's task). Required: ``task_id``, ``prompt``,
        ``verifier``; the rest default (family ``user``, split ``test``, seed 0, difficulty ``default``, no
        files, no tools, budget 8000, 40 steps). An unknown, missing or mistyped field raises
        :class:`TaskError` naming ``where`` and the field."""
        d = _expect_mapping(data, where)
        known = ("task_id", "family", "split", "seed", "difficulty", "prompt", "files", "tools", "verifier",
                 "budget_tokens", "max_steps", "metadata", "private_files")  # fmt: skip
        _no_unknown(d, known, where)
        files = _field(d, "files", dict, where, default={})
        private_files = _field(d, "private_files", dict, where, default={})
        for name, mapping in (("files", files), ("private_files", private_files)):
            for rel, text in mapping.items():
                if not isinstance(text, str):
                    raise TaskError(f"{where}: field {name!r}: {rel!r} must map to the file's text")
        tools_raw = _field(d, "tools", list, where, default=[])
        if "verifier" not in d:
            raise TaskError(f"{where}: missing field 'verifier'")
        values = {
            "task_id": _field(d, "task_id", str, where),
            "family": _field(d, "family", str, where, default="user"),
            "split": _field(d, "split", str, where, default="test"),
            "seed": _field(d, "seed", int, where, default=0),
            "difficulty": _field(d, "difficulty", str, where, default="default"),
            "prompt": _field(d, "prompt", str, where),
            "files": files,
            "tools": [ToolSpec.from_dict(t, f"{where}: tools[{i}]") for i, t in enumerate(tools_raw)],
            "verifier": VerifierSpec.from_dict(d["verifier"], f"{where}: verifier"),
            "budget_tokens": _field(d, "budget_tokens", int, where, default=8000),
            "max_steps": _field(d, "max_steps", int, where, default=40),
            "metadata": _field(d, "metadata", dict, where, default={}),
            "private_files": private_files,
        }
        problem = _task_problem(
            values["budget_tokens"], values["max_steps"], files, values["tools"], private_files
        )
        if problem:
            raise TaskError(f"{where}: {problem}")
        return cls(**values)

    def fingerprint(self) -> str:
        """A short stable hash of the whole task (sha256 of its canonical JSON), for pinning generation."""
        return task_fingerprint(self.to_dict())


def private_root(workspace: Path) -> Path:
    """The episode's private folder for ``workspace``: a sibling (``<workspace>.task``), so no command run
    in the workspace sandbox can reach it."""
    workspace = Path(workspace)
    return workspace.parent / f"{workspace.name}.task"


def task_fingerprint(task_dict: Mapping[str, Any]) -> str:
    """First 16 hex digits of the sha256 of the canonical JSON of a task dict."""
    blob = json.dumps(task_dict, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def _task_problem(
    budget_tokens: int,
    max_steps: int,
    files: Mapping[str, str],
    tools: list[ToolSpec],
    private_files: Mapping[str, str] | None = None,
) -> str | None:
    """What is wrong with a task's fields (beyond their types), or None."""
    if budget_tokens <= 0:
        return f"field 'budget_tokens' must be a positive number of tokens, not {budget_tokens}"
    if max_steps <= 0:
        return f"field 'max_steps' must be a positive number of steps, not {max_steps}"
    for name, paths in (("files", files), ("private_files", private_files or {})):
        for path in paths:
            problem = _path_problem(path)
            if problem:
                return f"field {name!r}: {problem}"
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        return f"field 'tools': two tools share a name: {names}"
    return None


@runtime_checkable
class TaskSource(Protocol):
    """Anything that yields tasks by split: the built-in families, a JSONL file, a task folder."""

    @property
    def families(self) -> tuple[str, ...]:
        """Family names this source can yield."""
        ...

    def tasks(self, split: str, n: int | None = None) -> Iterator[Task]:
        """The first ``n`` tasks of ``split`` (all of them when ``n`` is None), in a stable order."""
        ...


# -- helpers ------------------------------------------------------------------------------------------------


def _write(root: Path, rel: str, text: str) -> Path:
    """Write ``root/rel`` without ever leaving ``root``.

    The harness runs this on the host, after the model had a shell in the workspace: any component of the
    path that the model replaced by a symlink (which could point anywhere on the host) or by a file of the
    wrong kind is removed first, so the write lands inside the workspace; the file itself is replaced unless
    it is a plain file (a FIFO there would block the write for ever, a socket would fail it).
    """
    current = Path(root)
    parts = PurePosixPath(rel).parts
    for part in parts[:-1]:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            _remove(current)
        current.mkdir(exist_ok=True)
    target = current / parts[-1]
    try:
        kind = os.lstat(target).st_mode
    except FileNotFoundError:
        kind = None
    if kind is not None and not stat.S_ISREG(kind):
        _remove(target)
    # no link followed, no blocking open: what is there now was checked or removed just above
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(target, flags, 0o644)
    except PermissionError:  # a plain file the model made unwritable (the harness not running as root)
        _remove(target)
        fd = os.open(target, flags | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return target


def _remove(path: Path) -> None:
    """Remove a file, a symlink (not what it points to) or a directory tree of any depth."""
    from ctxrl.env.sandbox import remove_tree  # the sandbox module is only needed on this path

    remove_tree(path)


def _expect_mapping(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise TaskError(f"{where}: expected a JSON object, got {type(data).__name__}")
    return data


def _no_unknown(d: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise TaskError(f"{where}: unknown field(s) {unknown}; known fields: {', '.join(known)}")


_MISSING = object()


def _field(d: Mapping[str, Any], key: str, kind: Any, where: str, default: Any = _MISSING) -> Any:
    """``d[key]`` checked against ``kind`` (a type or tuple of types); the default when absent, if any."""
    if key not in d:
        if default is _MISSING:
            raise TaskError(f"{where}: missing field {key!r}")
        return default
    value = d[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int in python, but a JSON true is never a valid count or seed.
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise TaskError(f"{where}: field {key!r} must be {names}, not {type(value).__name__} {value!r:.60}")
    return value
