"""Offload solver: open every report once, ask for the questions, re-read one line per question, answer.

A report counts as opened when its full text is in view, when a kept fact says so, or when an
``open_report`` call without ``pattern`` is in view with a result that is not an error (the harness may have
spilled the body already). Answers come from ``open_report --pattern "unit U |"`` results, whose header names
the report, so a value is always taken from the report the question names.
"""

from __future__ import annotations

import re

from ctxrl.env.policies.view import Call, Plan, View

_REPORTS = re.compile(r"maintenance reports: ([a-z, ]+)\.")
_FULL = re.compile(r"^MAINTENANCE REPORT - site (\w+)$", re.MULTILINE)
_OPENED_FACT = re.compile(r"^reports opened: ([a-z, ]*)$", re.MULTILINE)
_QUESTION = re.compile(r"^(\d+)\. In reports/(\w+)\.txt, what is the (\w+) of unit ([\w-]+)\?$", re.MULTILINE)
_MATCHES = re.compile(r"^\d+ line\(s\) of reports/(\w+)\.txt contain '([^']*)':$", re.MULTILINE)
_ANSWER = re.compile(r"^answer (\d+) = (\S+)", re.MULTILINE)


def _pattern(unit: str) -> str:
    return f"unit {unit} |"


def solve(view: View) -> Plan:
    names = m.group(1).replace(" ", "").split(",") if (m := _REPORTS.search(view.task)) else []
    opened: set[str] = set()
    questions: dict[int, tuple[str, str, str]] = {}
    answers: dict[int, str] = {}
    lines_of: dict[tuple[str, str], str] = {}  # (report, pattern) -> the matching unit line
    for text in view.texts():
        opened |= {site.lower() for site in _FULL.findall(text)}
        for listed in _OPENED_FACT.findall(text):
            opened |= {n for n in listed.split(", ") if n}
        for number, report, fld, unit in _QUESTION.findall(text):
            questions[int(number)] = (report, fld, unit)
        for number, value in _ANSWER.findall(text):
            answers[int(number)] = value
        for header in _MATCHES.finditer(text):
            rest = text[header.end() :].lstrip("\n").split("\n", 1)[0]
            lines_of[(header.group(1), header.group(2))] = rest
    for _, call_id, call in view.calls():
        result = view.result_of(call_id)
        full_read = call.name == "open_report" and "pattern" not in call.arguments
        if full_read and result is not None and "[exit code" not in result.text:
            opened.add(str(call.arguments.get("name", "")))
    for number, (report, fld, unit) in questions.items():
        line = lines_of.get((report, _pattern(unit)), "")
        if number not in answers and (value := re.search(rf"\b{fld} (\S+)", line)):
            answers[number] = value.group(1)

    facts = [f"reports opened: {', '.join(n for n in names if n in opened)}"]
    facts += [
        f"{n}. In reports/{r}.txt, what is the {f} of unit {u}?" for n, (r, f, u) in sorted(questions.items())
    ]
    facts += [f"answer {n} = {v}" for n, v in sorted(answers.items())]
    unopened = [n for n in names if n not in opened]
    if unopened:
        return Plan((Call("open_report", {"name": unopened[0]}),), tuple(facts))
    if not questions:
        return Plan((Call("questions"),), tuple(facts))
    missing = [n for n in sorted(questions) if n not in answers]
    if missing:
        reads = tuple(
            Call("open_report", {"name": questions[n][0], "pattern": _pattern(questions[n][2])})
            for n in missing
        )
        return Plan(reads, tuple(facts))
    answer = "\n".join(f"{n}. {answers[n]}" for n in sorted(questions))
    return Plan((Call("submit", {"answer": answer}),), tuple(facts))
