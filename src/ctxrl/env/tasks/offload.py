"""Family ``offload``: read large files, let their views go, re-read details on demand.

The workspace holds several maintenance reports under ``reports/``, each roughly half the context budget.
``open_report`` prints one in full (and records that it was opened); ``questions`` reveals the questions only
after every report has been opened in full. The questions ask for one field of one unit in one report; the
same unit appears in other reports with other values (those values are ``forbidden``). Keeping every report in
context overflows; summarising them loses the exact values. The way through is to evict the views and re-read
the few lines needed (``open_report --pattern`` or grep), since the files stay in the workspace.

``open_report`` and ``questions`` are harness tools over a private copy of the reports (so a full read reaches
the context whole: a shell cannot mark a report opened with ``open_report > /dev/null``, nor decode the
questions); an ``open_report`` result is a file view of ``reports/<name>.txt`` (usage mode can evict it).
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass
from typing import Any

from ctxrl.env.tasks import _gen
from ctxrl.env.tasks.base import Task, ToolSpec, VerifierSpec
from ctxrl.env.tasks.splits import split_of
from ctxrl.env.tasks.toolscript import build_script

FAMILY = "offload"


@dataclass(frozen=True)
class Knobs:
    n_reports: int
    units_per_report: int
    """Unit lines per report (~110 characters each, plus prose between sections)."""
    n_questions: int
    budget_tokens: int
    max_steps: int


PRESETS = {
    "easy": Knobs(n_reports=3, units_per_report=50, n_questions=2, budget_tokens=6000, max_steps=24),
    "default": Knobs(n_reports=6, units_per_report=80, n_questions=4, budget_tokens=6000, max_steps=40),
    "hard": Knobs(n_reports=8, units_per_report=80, n_questions=6, budget_tokens=6000, max_steps=56),
}

_SITES = ["north", "south", "east", "west", "central", "harbor", "summit", "valley"]
_FIELDS = ("serial", "firmware", "rack", "owner")

_OPEN_BODY = r"""
OPENED = ROOT / ".task" / "opened.json"


def run(args):
    name = args["name"].strip()
    if name.endswith(".txt"):
        name = name[:-4]
    if name.startswith("reports/"):
        name = name[len("reports/"):]
    path = ROOT / "reports" / (name + ".txt")
    names = sorted(p.stem for p in (ROOT / "reports").glob("*.txt"))
    if "/" in name or not path.is_file():
        return "error: no report %r; reports: %s" % (args["name"], ", ".join(names)), 1
    text = path.read_text()
    pattern = args.get("pattern")
    if pattern:
        hits = [line for line in text.splitlines() if pattern in line]
        return "%d line(s) of reports/%s.txt contain %r:\n%s" % (len(hits), name, pattern, "\n".join(hits))
    opened = json.loads(OPENED.read_text()) if OPENED.exists() else []
    if name not in opened:
        write_json_atomic(OPENED, sorted(opened + [name]))
    return text
"""

_QUESTIONS_BODY = r"""
OPENED = ROOT / ".task" / "opened.json"
QUESTIONS = ROOT / ".task" / "questions.b64"


def run(args):
    names = sorted(p.stem for p in (ROOT / "reports").glob("*.txt"))
    opened = set(json.loads(OPENED.read_text())) if OPENED.exists() else set()
    missing = [n for n in names if n not in opened]
    if missing:
        return "Open every report in full with open_report first; not yet opened: %s" % ", ".join(missing), 1
    import base64
    questions = json.loads(base64.b64decode(QUESTIONS.read_text()).decode())
    return "Questions (answer each with the exact value):\n" + "\n".join(
        "%d. %s" % (i + 1, q) for i, q in enumerate(questions)
    )
"""


def _unit_values(r: random.Random) -> dict[str, str]:
    return {
        "serial": f"SN-{r.randint(10000, 99999)}-{r.choice('ABCDEFGHJKLMNPQRSTUVWXYZ')}{r.choice('ABCDEFGHJKLMNPQRSTUVWXYZ')}",
        "firmware": f"{r.randint(1, 9)}.{r.randint(0, 30)}.{r.randint(0, 99)}",
        "rack": f"{r.choice('ABCDEFGH')}{r.randint(1, 24)}",
        "owner": f"{r.choice(_gen.GIVEN).lower()}.{r.choice(_gen.SURNAMES).lower()}",
    }


def _report(r: random.Random, site: str, units: dict[str, dict[str, str]]) -> str:
    """One report: a header, then sections of unit lines separated by short prose notes."""
    lines = [
        f"MAINTENANCE REPORT - site {site.upper()}",
        f"generated for audit cycle {r.randint(100, 999)}",
        "",
    ]
    for i, (unit, v) in enumerate(units.items()):
        if i % 10 == 0:
            lines += ["", f"Section {i // 10 + 1}. {_gen.sentence(r)} {_gen.sentence(r)}", ""]
        lines.append(
            f"unit {unit} | serial {v['serial']} | firmware {v['firmware']} | rack {v['rack']} | "
            f"owner {v['owner']} | hours {r.randint(10, 99999)} | status {r.choice(['ok', 'ok', 'watch', 'due'])}"
        )
    lines += ["", f"End of report for site {site.upper()}."]
    return "\n".join(lines) + "\n"


def generate(seed: int, difficulty: str = "default") -> Task:
    """The offload task for ``seed`` at ``difficulty`` (``easy`` / ``default`` / ``hard``)."""
    k = _gen.pick_preset(PRESETS, FAMILY, difficulty)
    r = _gen.rng(FAMILY, seed, difficulty)
    sites = r.sample(_SITES, k.n_reports)
    # A shared pool of unit ids, so one id appears in several reports with different values.
    pool = [f"{star}-{n:02d}" for star in _gen.STARS for n in range(1, 40)]
    pool = r.sample(pool, k.units_per_report * 2)
    data: dict[str, dict[str, dict[str, str]]] = {}
    for site in sites:
        unit_ids = sorted(r.sample(pool, k.units_per_report))
        data[site] = {u: _unit_values(r) for u in unit_ids}

    questions: list[str] = []
    targets: list[dict[str, Any]] = []
    forbidden: set[str] = set()
    shared = [(s, u) for s in sites for u in data[s] if sum(u in data[o] for o in sites) >= 2]
    for site, unit in r.sample(shared, k.n_questions):
        fld = r.choice(_FIELDS)
        value = data[site][unit][fld]
        targets.append({"report": f"reports/{site}.txt", "unit": unit, "field": fld, "value": value})
        questions.append(f"In reports/{site}.txt, what is the {fld} of unit {unit}?")
        forbidden |= {data[o][unit][fld] for o in sites if o != site and unit in data[o]}
    expected = [t["value"] for t in targets]

    files = {f"reports/{site}.txt": _report(r, site, units) for site, units in data.items()}
    private_files = {
        **files,
        ".task/questions.b64": base64.b64encode(json.dumps(questions).encode()).decode(),
    }
    open_params: dict[str, Any] = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "report name, e.g. north"},
            "pattern": {"type": "string", "description": "print only the lines containing this text"},
        },
        "required": ["name"],
    }
    open_desc = (
        "Print a report from reports/ in full, or with --pattern only the lines that contain the pattern."
    )
    q_params: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
    q_desc = "Print the questions; works once every report has been opened in full."
    # Harness tools over a private copy of the reports: a full read reaches the context whole (a shell that
    # redirected `open_report` to /dev/null would unlock the questions without reading). The reports stay in
    # the workspace too: re-reading details with --pattern, grep or read_file is the intended way through.
    tools = [
        ToolSpec("open_report", open_desc, open_params, "tools/open_report",
                 build_script("open_report", open_desc, open_params, "tools/open_report", _OPEN_BODY),
                 private=True, view="reports/{name}.txt"),
        ToolSpec("questions", q_desc, q_params, "tools/questions",
                 build_script("questions", q_desc, q_params, "tools/questions", _QUESTIONS_BODY),
                 private=True),
    ]  # fmt: skip
    names = ", ".join(sites)
    prompt = (
        f"The folder reports/ holds {k.n_reports} maintenance reports: {names}. Each is large, about half "
        "of your context budget. Open each one in full with the tool `open_report` (argument `name`). When "
        "all are opened, call `questions` (no arguments): it asks for details of specific units in specific "
        "reports. The same unit appears in several reports with different values, so take each value from "
        "the report the question names.\n\n"
        "The reports stay in the workspace: re-read what you need with `open_report` and its `pattern` "
        "argument (prints only matching lines) or with shell tools such as grep.\n\n"
        "Answer with one line per question, `N. value`, copying each value verbatim."
    )
    oracle_calls = [f"tools/open_report --name {s}" for s in sites] + ["tools/questions"]
    question_text_chars = sum(len(q) + 4 for q in questions) + 50
    return Task(
        task_id=f"{FAMILY}:{difficulty}:{seed}",
        family=FAMILY,
        split=split_of(seed),
        seed=seed,
        difficulty=difficulty,
        prompt=prompt,
        files=files,
        private_files=private_files,
        tools=tools,
        verifier=VerifierSpec(
            kind="all_values", expected=expected, forbidden=sorted(forbidden - set(expected))
        ),
        budget_tokens=k.budget_tokens,
        max_steps=k.max_steps,
        metadata={
            "targets": targets,
            "questions": questions,
            "oracle_answer": "\n".join(f"{i + 1}. {v}" for i, v in enumerate(expected)),
            "observation_calls": oracle_calls,
            "observation_chars": sum(len(files[f"reports/{s}.txt"]) + 1 for s in sites) + question_text_chars,
            "working_set_chars": question_text_chars + 130 * k.n_questions,
        },
    )
