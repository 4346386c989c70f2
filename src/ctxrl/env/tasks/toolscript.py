"""Build the executable python3 scripts that implement task tools.

Every task tool (``next_chunk``, ``search``, ``read``, ``run_tests`` …) is a script ``tools/NAME``, run by the
harness for a function call (through :meth:`ctxrl.env.tasks.base.ToolSpec.to_shell`) in a sandbox. Where the
script lives decides whether a shell may filter its output at the source (``tool | grep``, ``tool >
/dev/null``), which would bypass the context problem a task poses:

- a **workspace tool** is a file of the episode workspace, so the model's shell may also run, pipe and
  redirect it. Families use this where filtering is the intended skill: ``repo``'s ``run_tests`` (a code agent
  runs and greps its own tests).
- a **harness tool** (``ToolSpec.private``) is written, with the data it serves (``Task.private_files``), to
  the episode's private folder beside the workspace, which no workspace command can reach; only a function
  call runs it, so its output reaches the context whole. A shell command naming its path is answered with a
  note and not run. Families use this where filtering would bypass the task: the streams of ``retention`` and
  ``board``, ``research``'s corpus, ``offload``'s full reads and questions (its reports stay in the workspace
  too, for ``--pattern``, grep and ``read_file``: re-reading details is the intended way through), ``repo``'s
  specification.

A textual check of shell commands (refusing ``tools/x | grep``) would not be sound: ``sh -c``, a variable, a
python subprocess or reading the data file directly all get around it. Moving the tool and its data out of
the workspace is.

One argument convention serves every caller:

``tools/NAME --key value --other value``
    the form ``to_shell`` writes; ``--key=value`` works too.
``tools/NAME '{"key": "value"}'``
    one JSON object as the only argument.
``tools/NAME some words``
    only for a tool with exactly one parameter: the bare words, joined by spaces, are its value.

Values are converted by the parameter's JSON-schema ``type``: ``string`` as given, ``integer`` / ``number``
parsed, ``boolean`` from true/false/1/0/yes/no, ``array`` / ``object`` parsed as JSON. A wrong call (unknown or
missing argument, unparseable value) prints ``error: …`` and a usage line on stdout and exits 2, so the model
reads what was wrong. ``--help`` prints the description and usage and exits 0.

Scripts use only the standard library (the sandbox has python3 and coreutils, no network) and find their data
relative to their own location, so they work from any working directory. State they keep between calls
(which chunk is next, which reports were opened) lives in workspace files under ``.task/``.
"""

from __future__ import annotations

import json
from typing import Any

# The part every script shares: argument parsing under the convention above. ``NAME``, ``COMMAND``,
# ``DESCRIPTION``, ``PARAMS`` and ``ROOT`` are defined just above it; the body defines ``run(args) -> str``.
_PRELUDE = r'''
def _usage():
    parts = []
    for key, prop in PARAMS.get("properties", {}).items():
        slot = "--%s %s" % (key, prop.get("type", "string").upper())
        parts.append(slot if key in PARAMS.get("required", []) else "[%s]" % slot)
    return "usage: %s %s" % (COMMAND, " ".join(parts))


def _fail(message):
    print("error: %s\n%s" % (message, _usage()))
    sys.exit(2)


def _convert(key, value):
    kind = PARAMS["properties"][key].get("type", "string")
    try:
        if kind == "string":
            return value if isinstance(value, str) else json.dumps(value)
        if kind == "integer":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(value)
            return int(value)
        if kind == "number":
            return float(value)
        if kind == "boolean":
            if isinstance(value, bool):
                return value
            lowered = str(value).strip().lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return lowered in ("true", "1", "yes")
        if kind in ("array", "object"):
            parsed = json.loads(value) if isinstance(value, str) else value
            if not isinstance(parsed, list if kind == "array" else dict):
                raise ValueError(value)
            return parsed
    except (TypeError, ValueError):
        _fail("--%s must be of type %s, not %r" % (key, kind, value))
    return value


def parse_args(argv):
    props = PARAMS.get("properties", {})
    if len(argv) == 1 and argv[0].lstrip().startswith("{"):
        try:
            given = json.loads(argv[0])
        except ValueError as exc:
            _fail("the argument is not a JSON object (%s)" % exc)
        if not isinstance(given, dict):
            _fail("the argument is not a JSON object")
    elif argv and not any(a.startswith("--") for a in argv) and len(props) == 1:
        given = {next(iter(props)): " ".join(argv)}
    else:
        given = {}
        i = 0
        while i < len(argv):
            arg = argv[i]
            if not arg.startswith("--") or arg == "--":
                _fail("unexpected argument %r (arguments are --key value)" % arg)
            key, eq, value = arg[2:].partition("=")
            if not eq:
                if i + 1 >= len(argv):
                    _fail("--%s needs a value" % key)
                i += 1
                value = argv[i]
            given[key] = value
            i += 1
    unknown = sorted(k for k in given if k not in props)
    if unknown:
        _fail("unknown argument %s; this tool takes: %s" % (", ".join(unknown), ", ".join(props) or "nothing"))
    missing = [k for k in PARAMS.get("required", []) if k not in given]
    if missing:
        _fail("missing argument %s" % ", ".join(missing))
    return {k: _convert(k, v) for k, v in given.items()}


def write_json_atomic(path, data):
    """Replace ``path`` in one step, so an interrupted call never leaves half a state file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def main():
    if sys.argv[1:] in (["--help"], ["-h"]):
        print("%s: %s\n%s" % (NAME, DESCRIPTION, _usage()))
        return 0
    text = run(parse_args(sys.argv[1:]))
    code = 0
    if isinstance(text, tuple):
        text, code = text
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return code
'''


def build_script(name: str, description: str, parameters: dict[str, Any], command: str, body: str) -> str:
    """Source of the executable script for one tool.

    ``body`` is python source that defines ``run(args: dict) -> str | tuple[str, int]`` (the text to print
    and, optionally, the exit status); it may use ``ROOT`` (the workspace, a ``pathlib.Path``),
    ``write_json_atomic(path, data)`` and ``json``/``os``/``sys``/``re``/``math``.
    ``command`` is the script's path relative to the workspace, e.g. ``tools/search``.
    """
    depth = len([part for part in command.split("/") if part])
    header = (
        "#!/usr/bin/env python3\n"
        f'"""{name}: {description}\n\nGenerated by ctxrl for this task. Run `{command} --help` for usage."""\n\n'
        "import json\nimport math\nimport os\nimport re\nimport sys\nfrom pathlib import Path\n\n"
        f"NAME = {name!r}\n"
        f"COMMAND = {command!r}\n"
        f"DESCRIPTION = {description!r}\n"
        f"PARAMS = json.loads({json.dumps(parameters)!r})\n"
        # The workspace is the folder that holds the tools folder, wherever the shell's cwd is.
        f"ROOT = Path(__file__).resolve().parents[{depth - 1}]\n"
    )
    footer = '\n\nif __name__ == "__main__":\n    sys.exit(main())\n'
    return header + _PRELUDE + "\n" + body.strip("\n") + "\n" + footer
