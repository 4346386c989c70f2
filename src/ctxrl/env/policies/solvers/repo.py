"""Repo solver: run the tests, grep for the failing function, read it, fix the line that contradicts its
docstring with a ``python3`` heredoc, run the tests again, answer ``done``.

The fix is read off the function as printed: its docstring states the contract (``weighted by 7, capped at
400``, ``strictly above 12`` …) and one code line disagrees with it. :data:`_RULES` pairs a line shape with the
line the docstring implies; the line of that shape that differs is the bug. Nothing about the bug comes from
anywhere but the printed source.

Facts: the failing test, where the function is defined, the fix (file, buggy line, fixed line), whether it was
applied, and the latest test outcome. The state is read in order: a test report after the fix decides.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

from ctxrl.env.policies.view import Call, Plan, View

_FAIL = re.compile(r"^(?:FAIL|ERROR): test_(\w+) \(", re.MULTILINE)
_GREP = re.compile(r"^(repo/\S+\.py):(\d+):def (\w+)\(", re.MULTILINE)
_LOCATION_FACT = re.compile(r"^\[repo\] (\w+) is defined at (repo/\S+\.py):(\d+)$", re.MULTILINE)
_FIX_FACT = re.compile(r"^\[repo\] fix (\w+) in (repo/\S+\.py): (.+) -> (.+)$", re.MULTILINE)
_APPLIED_FACT = "[repo] fix applied"
_TESTS_FACT = re.compile(r"^\[repo\] tests (passed|failed)$", re.MULTILINE)
_FIX_MARK = "# ctxrl-fix "
_READ_LINES = 22

# (function-name stem, docstring pattern, buggy-or-good line shape, the good line from the docstring groups)
Rule = tuple[str, str, str, Callable[[re.Match[str]], str]]
_RULES: tuple[Rule, ...] = (
    ("weighted_total", r"each weighted by (\d+), capped at (\d+)", r"^\s+total \+= value \* \d+$",
     lambda d: f"        total += value * {d[1]}"),
    ("weighted_total", r"each weighted by (\d+), capped at (\d+)", r"^\s+return (?:min|max)\(total, \d+\)$",
     lambda d: f"    return min(total, {d[2]})"),
    ("count_above", r"strictly above (\d+)", r"^\s+if value >=? \d+:$", lambda d: f"        if value > {d[1]}:"),
    ("window_peak", r"largest sum of (\d+) consecutive", r"^\s+for i in range\(len\(values\) - \d+(?: \+ 1)?\):$",
     lambda d: f"    for i in range(len(values) - {d[1]} + 1):"),
    ("text_checksum", r"acc = acc \* (\d+) \+ ord\(ch\), modulo (\d+)", r"^\s+acc = \(acc \* \d+ \+ ord\(ch\)\) % \d+$",
     lambda d: f"        acc = (acc * {d[1]} + ord(ch)) % {d[2]}"),
    ("clamp_scale", r"x scaled by (\d+) and shifted by (\d+), clamped to \[(\d+), (\d+)\]",
     r"^\s+return max\(\d+, min\(\d+, x \* \d+ [+-] \d+\)\)$",
     lambda d: f"    return max({d[3]}, min({d[4]}, x * {d[1]} + {d[2]}))"),
    ("slug", r"joined by '(.)'", r"^\s+return \".\"\.join\(text\.(?:lower|upper)\(\)\.split\(\)\)$",
     lambda d: f'    return "{d[1]}".join(text.lower().split())'),
    ("running_sum", r"starting after the first (\d+)", r"^\s+for value in values\[\d+:\]:$",
     lambda d: f"    for value in values[{d[1]}:]:"),
    ("percent_of", r"rounded to (\d+) decimals", r"^\s+return round\(100 \* \w+ / \w+, \d+\)$",
     lambda d: f"    return round(100 * part / whole, {d[1]})"),
)  # fmt: skip


def find_fix(function: str, source: str) -> tuple[str, str] | None:
    """(buggy line, fixed line) of ``function`` as printed in ``source``, or None if no line contradicts its
    docstring."""
    start = source.find(f"def {function}(")
    if start < 0:
        return None
    end = source.find("\ndef ", start + 1)
    body = source[start : end if end > 0 else len(source)]
    lines = [re.sub(r"^\s*\d+\t", "", line) for line in body.splitlines()]  # tolerate `cat -n`
    text = "\n".join(lines)
    for stem, doc, shape, good in _RULES:
        contract = re.search(doc, text)
        if not function.startswith(stem) or contract is None:
            continue
        expected = good(contract)
        for line in lines:
            if re.match(shape, line) and line != expected:
                return line, expected
    return None


def _fix_command(path: str, bad: str, good: str) -> str:
    return (
        f"python3 - <<'EOF'\n{_FIX_MARK}{path}\nimport pathlib\np = pathlib.Path({path!r})\n"
        f"p.write_text(p.read_text().replace({bad + chr(10)!r}, {good + chr(10)!r}, 1))\nEOF"
    )


def solve(view: View) -> Plan:
    function = location = fix = None
    applied = False
    tests: str | None = None  # outcome of the latest test run: "passed" / "failed"
    for item in view.items:
        text = item.text
        for name in _FAIL.findall(text):
            function, tests, applied = name, "failed", False
        if item.name == "run_tests" and re.search(r"^OK\b", text, re.MULTILINE):
            tests = "passed"
        for m in _TESTS_FACT.finditer(text):
            tests = m.group(1)
        if _APPLIED_FACT in text:
            applied = True
        for m in _LOCATION_FACT.finditer(text):
            function, location = m.group(1), (m.group(2), int(m.group(3)))
        for m in _GREP.finditer(text):
            if m.group(3) == function:
                location = (m.group(1), int(m.group(2)))
        for m in _FIX_FACT.finditer(text):
            fix = (m.group(2), m.group(3), m.group(4))
        if function and location and fix is None and (found := find_fix(function, text)):
            fix = (location[0], *found)
        for call_id, call in item.calls:
            command = str(call.arguments.get("command", ""))
            result = view.result_of(call_id)
            if _FIX_MARK in command and result is not None and "[exit code" not in result.text:
                applied, tests = True, None
    facts: list[str] = []
    if function:
        facts.append(f"[repo] failing test: test_{function}")
    if function and location:
        facts.append(f"[repo] {function} is defined at {location[0]}:{location[1]}")
    if function and fix:
        facts.append(f"[repo] fix {function} in {fix[0]}: {fix[1]} -> {fix[2]}")
    if applied:
        facts.append(_APPLIED_FACT)
    if tests:
        facts.append(f"[repo] tests {tests}")
    if tests == "passed":
        return Plan((Call("submit", {"answer": "done"}),), tuple(facts))
    if applied or function is None:
        return Plan((Call("run_tests"),), tuple(facts))
    if fix is not None:
        return Plan((Call("shell", {"command": _fix_command(*fix)}),), tuple(facts))
    if location is not None:
        path, line = location
        return Plan(
            (Call("shell", {"command": f"sed -n '{line},{line + _READ_LINES}p' {shlex.quote(path)}"}),),
            tuple(facts),
        )
    return Plan((Call("shell", {"command": f"grep -rn 'def {function}(' repo/"}),), tuple(facts))
