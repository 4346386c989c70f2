"""Family ``repo``: find and fix one bug in a synthetic pure-python repository with a failing test.

The workspace holds ``repo/``: a package of several modules full of small documented functions, and a
``unittest`` suite (``repo/tests``). One function has a one-line bug (an off-by-one, a flipped comparison, a
wrong constant) that makes exactly its test fail. ``run_tests`` runs the suite. The failing test names the
function, not the file; the repository is several times the budget, so a manager greps for the definition
instead of reading everything, fixes the line with shell tools, and re-runs the tests.

The verifier (kind ``command``, see :func:`grading_command`) writes the original test files back, then runs
them in the sandbox from a trusted position: success iff every one of the known tests ran and passed. The
answer text is ignored. ``metadata["oracle_fix"]`` is a shell command that
applies the known fix (used by tests and scripted policies).
"""

from __future__ import annotations

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
print(f"ctxrl-grade: {'PASS' if clean else 'FAIL'} ran={result.testsRun} of {expected}")
sys.exit(0 if clean else 1)
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
    skipped: code under test that exits early (``os._exit(0)``) or raises ``SkipTest`` does not pass.
    What this cannot stop is code under test that tampers with the running interpreter itself (patching
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
    budget_tokens: int
    max_steps: int


PRESETS = {
    "easy": Knobs(n_modules=3, functions_per_module=14, tests_per_module=2, budget_tokens=4500, max_steps=24),
    "default": Knobs(
        n_modules=7, functions_per_module=22, tests_per_module=2, budget_tokens=4500, max_steps=40
    ),
    "hard": Knobs(
        n_modules=10, functions_per_module=24, tests_per_module=2, budget_tokens=4500, max_steps=56
    ),
}

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


def generate(seed: int, difficulty: str = "default") -> Task:
    """The repo task for ``seed`` at ``difficulty`` (``easy`` / ``default`` / ``hard``)."""
    k = _gen.pick_preset(PRESETS, FAMILY, difficulty)
    r = _gen.rng(FAMILY, seed, difficulty)
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
    # The bug: a (function, variant) whose buggy line occurs nowhere in its module yet, so after the change
    # it occurs exactly once and both the failing state and the fix are unambiguous.
    candidates = [(fn, bug) for fn in all_tested for bug in fn.template.bugs]
    r.shuffle(candidates)
    for buggy, bug in candidates:
        good_line, bad_line = (line.format(**buggy.params) for line in bug)
        module_text = "".join(f.source for f in functions if f.module == buggy.module)
        if module_text.count(bad_line + "\n") == 0 and buggy.source.count(good_line + "\n") == 1:
            break
    else:
        raise AssertionError(
            "no function can carry a unique bug"
        )  # 14 tested functions make this unreachable
    buggy_source = buggy.source.replace(good_line + "\n", bad_line + "\n")

    files: dict[str, str] = {
        f"repo/{pkg}/__init__.py": f'"""{pkg}: bookkeeping helpers."""\n',
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
            for _ in range(50):
                args = fn.template.args(r, fn.params)
                want = _call(fn, fn.source, args)
                if fn is not buggy or _call(fn, buggy_source, args) != want:
                    break
            else:
                raise AssertionError(f"no test input separates the bug in {fn.name}")
            lines += [
                f"    def test_{fn.name}(self):",
                f"        self.assertEqual({fn.name}({args}), {want!r})",
                "",
            ]
        lines += ["", 'if __name__ == "__main__":', "    unittest.main()"]
        test_files[f"repo/tests/test_{module}.py"] = "\n".join(lines) + "\n"
    files.update(test_files)

    run_params: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
    run_desc = "Run the repository's unit tests (python3 -m unittest in repo/) and print the report."
    run_tool = ToolSpec("run_tests", run_desc, run_params, "tools/run_tests",
                        build_script("run_tests", run_desc, run_params, "tools/run_tests", _RUN_TESTS_BODY))  # fmt: skip
    fix_code = f"import pathlib; p = pathlib.Path({bug_file!r}); p.write_text(p.read_text().replace({bad_line!r}, {good_line!r}, 1))"
    prompt = (
        f"The Python package in repo/{pkg}/ ({k.n_modules} modules) has a failing unit test. Run the tool "
        "`run_tests` to see which test fails, find the bug in the package source and fix it with shell "
        "commands (grep, sed, python3, heredocs). The repository is several times larger than your context "
        "budget: search for what you need rather than reading every file. Do not edit the tests; they are "
        "restored before grading. When `run_tests` passes, answer `done`."
    )
    source_files = sorted(p for p in files if p.startswith(f"repo/{pkg}/") and p.endswith(".py"))
    return Task(
        task_id=f"{FAMILY}:{difficulty}:{seed}",
        family=FAMILY,
        split=split_of(seed),
        seed=seed,
        difficulty=difficulty,
        prompt=prompt,
        files=files,
        tools=[run_tool],
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
            "oracle_fix": f"python3 -c {shlex.quote(fix_code)}",
            "oracle_answer": "done",
            # Exploring the repository means reading its sources; the tests' report comes on top.
            "observation_calls": ["tools/run_tests", *(f"cat {p}" for p in source_files)],
            "observation_chars": sum(len(files[p]) for p in source_files),
            "working_set_chars": len(buggy_source) + 400,
        },
    )


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
