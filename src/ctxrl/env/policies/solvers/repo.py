"""Repo solver: run the tests, page through the whole specification keeping the latest statement of the
failing function's entry, grep for the function, read it, fix the line that contradicts the contract in force
with a ``python3`` heredoc, run the tests again, answer ``done``.

The fix is read off the function as printed and the contract the specification states last (``weighted by
7, capped at 400``, ``strictly above 12`` …): one code line disagrees with it. :data:`_RULES` pairs a line
shape with the line the contract implies; the line of that shape that differs is the bug. Nothing about the
bug comes from anywhere but what was printed.

Facts: the failing test, how many spec pages were read, the latest contract of the function (with its
revision number; the entry itself is revision 0), where the function is defined, the fix (file, buggy line,
fixed line), whether it was applied, and the latest test outcome. The state is read in order: a test report
after the fix decides.
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
_FAILING_FACT = re.compile(r"^\[repo\] failing test: test_(\w+)$", re.MULTILINE)
_PAGE = re.compile(r"^=== SPEC\.md, page (\d+) of (\d+) ===$", re.MULTILINE)
_PAGES_FACT = re.compile(r"^\[repo\] spec pages read: (\d+) of (\d+)$", re.MULTILINE)
_CONTRACT_FACT = re.compile(r"^\[repo\] spec of (\w+) \(revision (\d+)\): (.+)$", re.MULTILINE)

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


def _statements(function: str, text: str) -> list[tuple[int, str]]:
    """(revision, contract) of every statement of ``function``'s spec entry in ``text`` (the entry is 0)."""
    name = re.escape(function)
    found = [(0, m.group(1)) for m in re.finditer(rf"^§\d+ `{name}` \(\w+\): (.+)$", text, re.MULTILINE)]
    pattern = rf"^Revision (\d+)\. §\d+ `{name}` is restated: (.+)$"
    found += [(int(m.group(1)), m.group(2)) for m in re.finditer(pattern, text, re.MULTILINE)]
    return found


def find_fix(function: str, source: str, contract: str | None = None) -> tuple[str, str] | None:
    """(buggy line, fixed line) of ``function`` as printed in ``source``, or None if no line contradicts the
    ``contract`` (default: the function's own docstring)."""
    start = source.find(f"def {function}(")
    if start < 0:
        return None
    end = source.find("\ndef ", start + 1)
    body = source[start : end if end > 0 else len(source)]
    lines = [re.sub(r"^\s*\d+\t", "", line) for line in body.splitlines()]  # tolerate `cat -n`
    text = "\n".join(lines)
    for stem, doc, shape, good in _RULES:
        stated = re.search(doc, text if contract is None else contract)
        if not function.startswith(stem) or stated is None:
            continue
        expected = good(stated)
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
    pages_read, pages = 0, 0
    contract: tuple[int, str] | None = None  # (revision, contract) of the latest statement seen
    for item in view.items:
        text = item.text
        for name in _FAIL.findall(text):
            function, tests, applied = name, "failed", False
        function = m.group(1) if (m := _FAILING_FACT.search(text)) else function
        for m in [*_PAGE.finditer(text), *_PAGES_FACT.finditer(text)]:
            pages_read, pages = max(pages_read, int(m.group(1))), int(m.group(2))
        for m in _CONTRACT_FACT.finditer(text):
            if m.group(1) == function and (contract is None or int(m.group(2)) >= contract[0]):
                contract = (int(m.group(2)), m.group(3))
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
        if function:
            for revision, stated in _statements(function, text):
                if contract is None or revision >= contract[0]:
                    contract = (revision, stated)
        for m in _FIX_FACT.finditer(text):
            fix = (m.group(2), m.group(3), m.group(4))
        spec_done = pages > 0 and pages_read >= pages
        if function and location and contract and spec_done and fix is None:
            found = find_fix(function, text, contract[1])
            fix = (location[0], *found) if found else None
        for call_id, call in item.calls:
            command = str(call.arguments.get("command", ""))
            result = view.result_of(call_id)
            if _FIX_MARK in command and result is not None and "[exit code" not in result.text:
                applied, tests = True, None
    facts: list[str] = []
    if function:
        facts.append(f"[repo] failing test: test_{function}")
    if pages:
        facts.append(f"[repo] spec pages read: {pages_read} of {pages}")
    if function and contract:
        facts.append(f"[repo] spec of {function} (revision {contract[0]}): {contract[1]}")
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
    if pages == 0 or pages_read < pages:
        return Plan((Call("read_spec", {"page": pages_read + 1}),), tuple(facts))
    if fix is not None:
        return Plan((Call("shell", {"command": _fix_command(*fix)}),), tuple(facts))
    if location is not None:
        path, line = location
        return Plan(
            (Call("shell", {"command": f"sed -n '{line},{line + _READ_LINES}p' {shlex.quote(path)}"}),),
            tuple(facts),
        )
    return Plan((Call("shell", {"command": f"grep -rn 'def {function}(' repo/"}),), tuple(facts))
