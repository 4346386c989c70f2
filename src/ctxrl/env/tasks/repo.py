"""Family ``repo``: fix the one function that still follows an outdated revision of a long specification.

The workspace holds ``repo/``: a package of several modules full of small documented functions, and a
``unittest`` suite (``repo/tests``). The package implements a specification, ``SPEC.md``, that was revised
several times: each function has an entry stating its contract (``Sum of the values, each weighted by 7,
capped at 400.``), and later revisions restate some entries with new constants; the latest statement of an
entry is in force. One function's code (and docstring) still follows an older statement of its entry, which
makes exactly its test fail. ``run_tests`` runs the suite; ``read_spec --page N`` prints one page of the
specification.

**Why it binds the context.** The specification is several times the budget and is served only by
``read_spec``, a harness tool (``ToolSpec.private``): it is not in the workspace, so it cannot be grepped,
and its pages reach the context whole. The revision that holds the failing function's constants sits on a
late page, and no page says that no later revision follows before the last one, so a solver must page
through the whole specification while keeping the latest statement of one entry: append-only overflows.
The repository itself stays an ordinary workspace (grep, sed and running the tests directly are allowed;
they are how a code agent works).

The verifier (kind ``command``, see :func:`grading_command`) writes the original test files back, then runs
them in the sandbox from a trusted position: success iff every one of the known tests ran and passed. The
answer text is ignored. ``metadata["oracle_fix"]`` is a shell command that applies the known fix (used by
tests; scripted policies derive the fix from what they read).
"""

from __future__ import annotations

import json
import random
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ctxrl.env.tasks import _gen
from ctxrl.env.tasks.base import Task, ToolSpec, VerifierSpec
from ctxrl.env.tasks.splits import split_of
from ctxrl.env.tasks.toolscript import build_script

FAMILY = "repo"

_GRADER = """\
import importlib.util, os, shutil, sys, tempfile, unittest
finish, write = os._exit, os.write  # taken before any code under test runs (it may patch the os module)
package, expected, files = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
root = tempfile.mkdtemp()
keep = lambda d, names: [n for n in names if not (n.endswith(".py") or os.path.isdir(os.path.join(d, n)))]
shutil.copytree(package, os.path.join(root, package), ignore=keep)
sys.path.insert(0, root)
suite, loader = unittest.TestSuite(), unittest.TestLoader()
for i, path in enumerate(files):
    spec = importlib.util.spec_from_file_location(f"ctxrl_graded_{i}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    suite.addTests(loader.loadTestsFromModule(module))
result = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite)
clean = result.wasSuccessful() and result.testsRun == expected and not result.skipped
clean = clean and not result.expectedFailures
try:
    sys.stdout.flush()
except Exception:
    pass
write(1, f"\\nctxrl-grade: {'PASS' if clean else 'FAIL'} ran={result.testsRun} of {expected}\\n".encode())
finish(0 if clean else 1)  # no exit hooks, no finalisers: nothing of the code under test runs after this line
"""


def grading_command(package: str, test_files: list[str], n_tests: int) -> str:
    """The verifier's shell command: run the restored ``test_files`` against ``repo/<package>``, trusted.

    Trust comes from where the tests run, not from the workspace the model wrote: ``python3 -I -B`` (no
    current directory, ``PYTHON*`` variables or user site on ``sys.path``, so a planted ``unittest`` package
    or ``sitecustomize.py`` is never imported; no bytecode read or written); a fresh copy of only the
    package's ``.py`` sources, first on ``sys.path`` (nothing else of ``repo/`` is importable, so no planted
    module shadows the standard library, and no stale or planted ``.pyc`` is used); only the known test files,
    loaded by path (an added test file, ``conftest.py`` or ``tests/__init__.py`` never runs). Success needs
    exit 0 **and** the grader's own last line saying that all ``n_tests`` tests ran and passed with none
    skipped: code under test that exits early (``os._exit(0)``) or raises ``SkipTest`` does not pass. The
    grader writes that line to the file descriptor itself and leaves with ``os._exit``, both taken before the
    package is imported, so an exit hook of the code under test (``atexit``, a finaliser) never runs to print
    a line of its own after it. What this cannot stop is code under test that tampers with the running interpreter itself (patching
    ``unittest`` in memory) to fake the whole report.
    """
    names = [p.removeprefix("repo/") for p in test_files]
    run = ["python3", "-I", "-B", "-c", _GRADER, package, str(n_tests), *names]
    passed = f"ctxrl-grade: PASS ran={n_tests} of {n_tests}"
    return (
        f"cd repo && out=$({shlex.join(run)} 2>&1); status=$?; printf '%s\\n' \"$out\"; "
        f'[ "$status" -eq 0 ] && [ "${{out##*$\'\\n\'}}" = {shlex.quote(passed)} ]'
    )


@dataclass(frozen=True)
class Knobs:
    n_modules: int
    functions_per_module: int
    tests_per_module: int
    spec_pages: int
    """Pages of the specification (one ``read_spec`` call each)."""
    page_chars: int
    """Approximate length of one page (entries and revisions, with prose between them)."""
    budget_tokens: int
    max_steps: int


PRESETS = {
    "easy": Knobs(3, 14, 2, spec_pages=10, page_chars=3400, budget_tokens=4500, max_steps=32),
    "default": Knobs(7, 22, 2, spec_pages=14, page_chars=3400, budget_tokens=4500, max_steps=40),
    "hard": Knobs(10, 24, 2, spec_pages=18, page_chars=3400, budget_tokens=4500, max_steps=56),
}
SPEC_KEY = "SPEC.md"
"""The document key of every page of the specification (usage mode's file view)."""

_PACKAGES = ["ledgerkit", "shipyard", "tallyho", "quillpress", "orbitool", "fernlog"]
_MODULES = [
    "billing",
    "inventory",
    "routing",
    "metrics",
    "textops",
    "scheduling",
    "pricing",
    "shipping",
    "accounts",
    "reports",
]
_NOUNS = [
    "orders",
    "refunds",
    "parcels",
    "invoices",
    "tickets",
    "batches",
    "shipments",
    "credits",
    "samples",
    "readings",
    "visits",
    "claims",
    "leases",
    "routes",
    "slots",
    "tokens",
    "entries",
    "quotes",
    "bids",
    "loads",
]


@dataclass(frozen=True)
class _Template:
    """A function shape: its code (``{name}`` and drawn constants), its possible bugs and its test inputs."""

    stem: str
    draw: Callable[[random.Random], dict[str, Any]]
    code: str
    bugs: tuple[tuple[str, str], ...]
    """(correct line, buggy line) pairs, as templates; one is applied to the buggy function."""
    args: Callable[[random.Random, dict[str, Any]], str]
    """Python source of a call's argument list, e.g. ``[3, 9, 14]``."""


def _ints(r: random.Random, n: int, lo: int = 0, hi: int = 50) -> list[int]:
    return [r.randint(lo, hi) for _ in range(n)]


_TEMPLATES = (
    _Template(
        "weighted_total",
        lambda r: {"w": r.randint(2, 9), "cap": r.randint(300, 900)},
        "def {name}(values):\n"
        '    """Sum of the values, each weighted by {w}, capped at {cap}.\n\n'
        "    Used when {noun} are aggregated for the nightly ledger; the cap keeps one outlier from\n"
        '    dominating the batch total.\n    """\n'
        "    total = 0\n    for value in values:\n        total += value * {w}\n    return min(total, {cap})\n",
        (
            ("        total += value * {w}", "        total += value * {w1}"),
            ("    return min(total, {cap})", "    return max(total, {cap})"),
        ),
        lambda r, p: repr(_ints(r, 4, 1, 20)),
    ),
    _Template(
        "count_above",
        lambda r: {"t": r.randint(10, 40)},
        "def {name}(values):\n"
        '    """How many values are strictly above {t}.\n\n'
        "    A threshold count over {noun}; values equal to the threshold do not count, which matters\n"
        '    for the boundary reports.\n    """\n'
        "    count = 0\n    for value in values:\n        if value > {t}:\n            count += 1\n    return count\n",
        (("        if value > {t}:", "        if value >= {t}:"),),
        lambda r, p: repr([p["t"], p["t"], *_ints(r, 4, 0, 60)]),
    ),
    _Template(
        "window_peak",
        lambda r: {"w": r.randint(2, 4)},
        "def {name}(values):\n"
        '    """The largest sum of {w} consecutive values (0 for fewer than {w} values).\n\n'
        "    Peak load over a sliding window of {noun}; every full window is considered, including the\n"
        '    last one.\n    """\n'
        "    best = 0\n    for i in range(len(values) - {w} + 1):\n        best = max(best, sum(values[i : i + {w}]))\n"
        "    return best\n",
        (("    for i in range(len(values) - {w} + 1):", "    for i in range(len(values) - {w}):"),),
        lambda r, p: repr([*_ints(r, 5, 0, 9), *_ints(r, p["w"], 40, 60)]),
    ),
    _Template(
        "text_checksum",
        lambda r: {"m": r.randint(31, 61), "mod": r.choice([997, 1009, 4093, 65521])},
        "def {name}(text):\n"
        '    """A rolling checksum of the text: acc = acc * {m} + ord(ch), modulo {mod}.\n\n'
        "    Labels of {noun} are compared by this checksum before the expensive exact comparison, so\n"
        '    it must match the reference implementation bit for bit.\n    """\n'
        "    acc = 0\n    for ch in text:\n        acc = (acc * {m} + ord(ch)) % {mod}\n    return acc\n",
        (("        acc = (acc * {m} + ord(ch)) % {mod}", "        acc = (acc * {m1} + ord(ch)) % {mod}"),),
        lambda r, p: repr(f"{r.choice(_NOUNS)}-{r.randint(10, 99)}"),
    ),
    _Template(
        "clamp_scale",
        lambda r: {
            "a": r.randint(2, 7),
            "b": r.randint(1, 20),
            "lo": r.randint(0, 10),
            "hi": r.randint(200, 400),
        },
        "def {name}(x):\n"
        '    """x scaled by {a} and shifted by {b}, clamped to [{lo}, {hi}].\n\n'
        "    Converts raw {noun} readings to the display range; out-of-range readings stick to the\n"
        '    nearest bound.\n    """\n'
        "    return max({lo}, min({hi}, x * {a} + {b}))\n",
        (
            (
                "    return max({lo}, min({hi}, x * {a} + {b}))",
                "    return max({lo}, min({hi}, x * {a} - {b}))",
            ),
        ),
        lambda r, p: str(r.randint(3, 30)),
    ),
    _Template(
        "slug",
        lambda r: {"sep": r.choice(["-", "_", "."])},
        "def {name}(text):\n"
        '    """Lower-case words of the text joined by {sep!r}.\n\n'
        "    Builds stable keys for {noun}; whitespace of any length separates words.\n"
        '    """\n'
        '    return "{sep}".join(text.lower().split())\n',
        (('    return "{sep}".join(text.lower().split())', '    return "{sep}".join(text.upper().split())'),),
        lambda r, p: repr(f"{r.choice(_gen.WORDS).title()}  {r.choice(_NOUNS)} {r.randint(1, 9)}"),
    ),
    _Template(
        "running_sum",
        lambda r: {"k": r.randint(1, 3)},
        "def {name}(values):\n"
        '    """Running totals of the values, starting after the first {k} (which are skipped).\n\n'
        "    The first {k} {noun} of a batch are warm-up entries and never enter the totals.\n"
        '    """\n'
        "    out = []\n    acc = 0\n    for value in values[{k}:]:\n        acc += value\n        out.append(acc)\n"
        "    return out\n",
        (("    for value in values[{k}:]:", "    for value in values[{k1}:]:"),),
        lambda r, p: repr(_ints(r, 6, 1, 9)),
    ),
    _Template(
        "percent_of",
        lambda r: {"d": r.randint(1, 3)},
        "def {name}(part, whole):\n"
        '    """part as a percentage of whole, rounded to {d} decimals (0.0 when whole is 0).\n\n'
        "    Share of {noun} in a period; reports print it with exactly {d} decimals.\n"
        '    """\n'
        "    if whole == 0:\n        return 0.0\n    return round(100 * part / whole, {d})\n",
        (("    return round(100 * part / whole, {d})", "    return round(100 * whole / part, {d})"),),
        lambda r, p: f"{r.randint(1, 40)}, {r.randint(41, 300)}",
    ),
)


@dataclass
class _Function:
    name: str
    module: str
    template: _Template
    params: dict[str, Any]
    source: str


def _make_function(r: random.Random, template: _Template, name: str, module: str) -> _Function:
    params = template.draw(r)
    # ``w1``-style keys: the constant of a buggy variant (one more than the correct one).
    params.update({f"{key}1": value + 1 for key, value in list(params.items()) if isinstance(value, int)})
    params["name"], params["noun"] = name, r.choice(_NOUNS)
    return _Function(name, module, template, params, template.code.format(**params))


def _call(fn: _Function, source: str, args: str) -> Any:
    """Run ``fn`` (as defined in ``source``) on ``args``; the generator's own code, so exec is safe."""
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    return eval(f"{fn.name}({args})", namespace)


def _contract(fn: _Function, params: dict[str, Any]) -> str:
    """The first line of the function's docstring under ``params``: its contract as the spec states it."""
    code = fn.template.code
    first = code[code.index('"""') + 3 : code.index("\n", code.index('"""'))]
    return first.format(**params)


# Constants a revision may change: those of the contract line that occur on exactly one code line (the window
# of ``window_peak`` is on two lines, so a stale window would need a two-line fix).
_REVISABLE = {
    "weighted_total": ("w", "cap"),
    "count_above": ("t",),
    "text_checksum": ("m", "mod"),
    "clamp_scale": ("a", "b", "lo", "hi"),
    "slug": ("sep",),
    "running_sum": ("k",),
    "percent_of": ("d",),
}


def _outdated(r: random.Random, params: dict[str, Any], key: str) -> dict[str, Any]:
    """``params`` with ``key`` set to the value an older revision stated."""
    value = params[key]
    if isinstance(value, str):
        old: Any = r.choice([c for c in ("-", "_", ".") if c != value])
    else:
        old = value + r.choice([d for d in (-2, -1, 1, 2, 3) if value + d >= 1])
    return {**params, key: old}


def _spec_pages(
    r: random.Random, k: Knobs, functions: list[_Function], buggy: _Function, stale: dict[str, Any]
) -> list[str]:
    """The specification as pages: every function's entry in the first two thirds (the buggy one with its
    outdated contract), revisions spread over the pages after it (the buggy function's on one of the last
    three pages), prose between the lines."""
    section = {fn.name: i + 1 for i, fn in enumerate(functions)}
    entries = [
        f"§{section[fn.name]} `{fn.name}` ({fn.module}): {_contract(fn, stale if fn is buggy else fn.params)}"
        for fn in functions
    ]
    # Decoy revisions restate other entries as they stand (the code already follows them).
    decoys = r.sample([fn for fn in functions if fn is not buggy], min(len(functions) - 1, 3 * k.spec_pages))
    lines_per_page: list[list[str]] = [[] for _ in range(k.spec_pages)]
    early = max(1, (2 * k.spec_pages) // 3)
    for i, entry in enumerate(entries):
        lines_per_page[i * early // len(entries)].append(entry)
    revision = 0
    for fn in decoys:
        page = r.randrange(early // 2, k.spec_pages)
        lines_per_page[page].append(
            f"§{section[fn.name]} `{fn.name}` is restated: {_contract(fn, fn.params)}"
        )
    last = r.randrange(max(early, k.spec_pages - 3), k.spec_pages)
    lines_per_page[last].append(
        f"§{section[buggy.name]} `{buggy.name}` is restated: {_contract(buggy, buggy.params)}"
    )
    pages = []
    for number, lines in enumerate(lines_per_page, start=1):
        if number > early:
            r.shuffle(lines)  # the buggy function's revision is not always the last line
        blocks = []
        for line in lines:
            if " is restated: " in line:
                revision += 1
                line = f"Revision {revision}. {line}"
            blocks.append(line)
        while sum(len(b) + 2 for b in blocks) < k.page_chars:
            blocks.insert(r.randint(0, len(blocks)), " ".join(_gen.sentence(r) for _ in range(2)))
        tail = "(end of the specification)" if number == k.spec_pages else f"(continued on page {number + 1})"
        body = "\n\n".join(blocks)
        pages.append(f"=== SPEC.md, page {number} of {k.spec_pages} ===\n{body}\n{tail}")
    return pages


MAX_DRAWS = 100
"""Draws of a repo's functions before a seed gives up (the first works for all but about 1 seed in 20,000)."""


def generate(seed: int, difficulty: str = "default") -> Task:
    """The repo task for ``seed`` at ``difficulty`` (``easy`` / ``default`` / ``hard``)."""
    k = _gen.pick_preset(PRESETS, FAMILY, difficulty)
    r = _gen.rng(FAMILY, seed, difficulty)
    # A draw of the package and its functions can leave no function able to carry a unique bug (rare: seed
    # 771499 at easy, found by the whole-step fuzzer); the next draw continues the same random stream, so every
    # seed whose first draw works keeps its task.
    for _draw in range(MAX_DRAWS):
        pkg = r.choice(_PACKAGES)
        modules = r.sample(_MODULES, k.n_modules)

        functions: list[_Function] = []
        used: set[str] = set()
        for module in modules:
            for _ in range(k.functions_per_module):
                template = r.choice(_TEMPLATES)
                while True:
                    name = f"{template.stem}_{r.choice(_NOUNS)}"
                    name = name if name not in used else f"{name}_{r.randint(2, 99)}"
                    if name not in used:
                        break
                used.add(name)
                functions.append(_make_function(r, template, name, module))

        tested = {m: r.sample([f for f in functions if f.module == m], k.tests_per_module) for m in modules}
        all_tested = [f for m in modules for f in tested[m]]
        # The bug: a tested function whose code follows an outdated value of one constant. Its changed code line
        # must occur nowhere in its module yet (so the failing state and the fix are unambiguous) and a test input
        # must tell the two versions apart.
        candidates = [(fn, key) for fn in all_tested for key in _REVISABLE.get(fn.template.stem, ())]
        r.shuffle(candidates)
        for buggy, key in candidates:
            stale = _outdated(r, buggy.params, key)
            buggy_source = buggy.template.code.format(**stale)
            changed = [
                (good, bad)
                for good, bad in zip(buggy.source.splitlines(), buggy_source.splitlines())
                if good != bad and not _in_docstring(buggy.source, good)
            ]
            if len(changed) != 1:
                continue
            good_line, bad_line = changed[0]
            module_text = "".join(f.source for f in functions if f.module == buggy.module)
            if module_text.count(bad_line + "\n") or buggy.source.count(good_line + "\n") != 1:
                continue
            separating = _separating_args(r, buggy, buggy_source)
            if separating is not None:
                break
        else:
            continue  # no candidate of this draw can carry the bug: draw again
        break
    else:
        raise AssertionError(
            f"repo seed {seed} ({difficulty}): no draw of {MAX_DRAWS} could carry a unique bug"
        )

    files: dict[str, str] = {
        f"repo/{pkg}/__init__.py": f'"""{pkg}: bookkeeping helpers, implementing SPEC.md."""\n',
        "repo/tests/__init__.py": "",
    }
    for module in modules:
        parts = [f'"""{module}: helpers for {r.choice(_NOUNS)} and {r.choice(_NOUNS)}."""\n']
        for fn in functions:
            if fn.module == module:
                parts.append(buggy_source if fn is buggy else fn.source)
        files[f"repo/{pkg}/{module}.py"] = "\n\n".join(parts)
    bug_file = f"repo/{pkg}/{buggy.module}.py"
    assert files[bug_file].count(bad_line + "\n") == 1, "the buggy line must be unique in its file"

    test_files: dict[str, str] = {}
    for module in modules:
        names = ", ".join(fn.name for fn in tested[module])
        lines = ["import unittest", "", f"from {pkg}.{module} import {names}", "", "",
                 f"class Test{module.title()}(unittest.TestCase):"]  # fmt: skip
        for fn in tested[module]:
            args = separating if fn is buggy else fn.template.args(r, fn.params)
            want = _call(fn, fn.source, args)
            lines += [
                f"    def test_{fn.name}(self):",
                f"        self.assertEqual({fn.name}({args}), {want!r})",
                "",
            ]
        lines += ["", 'if __name__ == "__main__":', "    unittest.main()"]
        test_files[f"repo/tests/test_{module}.py"] = "\n".join(lines) + "\n"
    files.update(test_files)

    pages = _spec_pages(r, k, functions, buggy, stale)
    run_params: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
    run_desc = "Run the repository's unit tests (python3 -m unittest in repo/) and print the report."
    run_tool = ToolSpec("run_tests", run_desc, run_params, "tools/run_tests",
                        build_script("run_tests", run_desc, run_params, "tools/run_tests", _RUN_TESTS_BODY))  # fmt: skip
    spec_params: dict[str, Any] = {
        "type": "object",
        "properties": {"page": {"type": "integer", "description": f"page number, 1 to {k.spec_pages}"}},
        "required": ["page"],
    }
    spec_desc = f"Print one page of the specification SPEC.md ({k.spec_pages} pages)."
    spec_tool = ToolSpec("read_spec", spec_desc, spec_params, "tools/read_spec",
                         build_script("read_spec", spec_desc, spec_params, "tools/read_spec", _READ_SPEC_BODY),
                         private=True, view=SPEC_KEY)  # fmt: skip
    fix_code = f"import pathlib; p = pathlib.Path({bug_file!r}); p.write_text(p.read_text().replace({bad_line!r}, {good_line!r}, 1))"
    prompt = (
        f"The Python package in repo/{pkg}/ ({k.n_modules} modules) implements the specification SPEC.md, "
        "which was revised several times: each function has an entry (`§N name: contract`), and a later "
        "`Revision` line may restate an entry with new constants; the latest statement of an entry is the one "
        "in force, and revisions can come on any page up to the last. One function still follows an outdated "
        "statement of its entry, and its unit test fails.\n\n"
        "Run the tool `run_tests` to see which test fails. Read the specification with the tool `read_spec` "
        f"(argument `page`, 1 to {k.spec_pages}; it is served only by this tool, page by page), find the "
        "contract in force for that function, and fix its code with shell commands (grep, sed, python3, "
        "heredocs). The specification is several times larger than your context budget, and so is the "
        "repository: keep what you need, not every page. Do not edit the tests; they are restored before "
        "grading. When `run_tests` passes, answer `done`."
    )
    source_files = sorted(p for p in files if p.startswith(f"repo/{pkg}/") and p.endswith(".py"))
    spec_calls = [f"tools/read_spec --page {n}" for n in range(1, k.spec_pages + 1)]
    return Task(
        task_id=f"{FAMILY}:{difficulty}:{seed}",
        family=FAMILY,
        split=split_of(seed),
        seed=seed,
        difficulty=difficulty,
        prompt=prompt,
        files=files,
        tools=[run_tool, spec_tool],
        verifier=VerifierSpec(
            kind="command",
            command=grading_command(pkg, sorted(test_files), k.tests_per_module * k.n_modules),
            restore=test_files,
            timeout_s=60.0,
        ),
        budget_tokens=k.budget_tokens,
        max_steps=k.max_steps,
        metadata={
            "package": pkg,
            "bug_file": bug_file,
            "bug_function": buggy.name,
            "failing_test": f"test_{buggy.name}",
            "buggy_line": bad_line,
            "fixed_line": good_line,
            "contract": _contract(buggy, buggy.params),
            "outdated_contract": _contract(buggy, stale),
            "oracle_fix": f"python3 -c {shlex.quote(fix_code)}",
            "oracle_answer": "done",
            # The way through: the tests' report, every page of the specification, then the function.
            "observation_calls": ["tools/run_tests", *spec_calls],
            "observation_chars": sum(len(p) + 1 for p in pages),
            "working_set_chars": len(buggy_source) + 400,
            "source_files": source_files,
        },
        private_files={".task/spec.json": json.dumps(pages, indent=0)},
    )


def _in_docstring(source: str, line: str) -> bool:
    """Whether ``line`` of a function's source is a line of its docstring."""
    doc = source.split('"""')[1]
    return line.strip() == '"""' or any(line.endswith(d) for d in doc.splitlines() if d)


def _separating_args(r: random.Random, fn: _Function, buggy_source: str) -> str | None:
    """A test argument list on which ``fn`` and its buggy version disagree (None if 50 draws find none)."""
    for _ in range(50):
        args = fn.template.args(r, fn.params)
        if _call(fn, buggy_source, args) != _call(fn, fn.source, args):
            return args
    return None


_READ_SPEC_BODY = r"""
SPEC = ROOT / ".task" / "spec.json"


def run(args):
    pages = json.loads(SPEC.read_text())
    page = args["page"]
    if not 1 <= page <= len(pages):
        return "error: no page %d; the specification has pages 1 to %d" % (page, len(pages)), 1
    return pages[page - 1]
"""


_RUN_TESTS_BODY = r"""
import re
import subprocess
import tempfile


def run(args):
    # A fresh bytecode cache per run, so an edit made within the same second is never shadowed by a stale .pyc.
    with tempfile.TemporaryDirectory() as cache:
        try:
            done = subprocess.run(
                [sys.executable, "-B", "-m", "unittest", "discover", "-s", "tests", "-t", "."],
                cwd=ROOT / "repo", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60,
                env={**os.environ, "PYTHONPYCACHEPREFIX": cache},
            )
        except subprocess.TimeoutExpired:
            return "error: the tests ran longer than 60 s and were stopped", 124
    # unittest prints its wall time ("Ran 14 tests in 0.008s"); drop it so observations are deterministic.
    report = re.sub(r"(Ran \d+ tests?) in [0-9.]+s", r"\1", done.stdout.strip())
    return report or "(no output)", done.returncode
"""
