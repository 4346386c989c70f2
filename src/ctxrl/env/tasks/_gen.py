"""Shared pieces of the task generators: seeded randomness, filler text, the stream tool.

Generators draw every random choice from ``rng(family, seed, difficulty)``, a ``random.Random`` seeded with a
string (hashed with SHA-512 by ``random``, never with the per-process ``hash()``), so the same arguments give
the same task in every process and on every machine.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from ctxrl.env.tasks.base import ToolSpec
from ctxrl.env.tasks.toolscript import build_script
from ctxrl.errors import TaskError


def rng(family: str, seed: int, difficulty: str) -> random.Random:
    """The generator's only source of randomness."""
    return random.Random(f"ctxrl-task/{family}/{difficulty}/{seed}")


def pick_preset(presets: dict[str, Any], family: str, difficulty: str) -> Any:
    """The knobs of ``difficulty``; :class:`TaskError` naming the known levels otherwise."""
    if difficulty not in presets:
        raise TaskError(f"family {family!r} has no difficulty {difficulty!r}; known: {', '.join(presets)}")
    return presets[difficulty]


def hexstr(r: random.Random, n: int) -> str:
    return "".join(r.choice("0123456789abcdef") for _ in range(n))


def near_miss(r: random.Random, value: str) -> str:
    """``value`` with one character changed to another of the same class (digit, hex letter, letter)."""
    while True:
        i = r.randrange(len(value))
        c = value[i]
        if c.isdigit():
            pool = "0123456789"
        elif c in "abcdef":
            pool = "abcdef0123456789"
        elif c.isalpha():
            pool = "abcdefghijklmnopqrstuvwxyz" if c.islower() else "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
        else:
            continue
        choice = r.choice([p for p in pool if p != c])
        return value[:i] + choice + value[i + 1 :]


WORDS = [
    "system",
    "cache",
    "queue",
    "worker",
    "shard",
    "region",
    "replica",
    "backup",
    "ledger",
    "index",
    "cluster",
    "node",
    "route",
    "policy",
    "window",
    "metric",
    "signal",
    "buffer",
    "batch",
    "channel",
    "socket",
    "handler",
    "daemon",
    "kernel",
    "thread",
    "lease",
    "token",
    "quota",
    "budget",
    "tenant",
    "archive",
    "bucket",
    "gateway",
    "proxy",
    "session",
    "relay",
    "anchor",
    "beacon",
    "vector",
    "matrix",
    "sample",
    "filter",
    "stream",
    "packet",
    "frame",
    "module",
    "kernel",
    "patch",
    "release",
    "branch",
    "commit",
    "merge",
    "audit",
    "review",
    "report",
    "summary",
    "record",
    "entry",
    "field",
]
VERBS = [
    "reported",
    "observed",
    "scheduled",
    "rotated",
    "flushed",
    "retried",
    "merged",
    "rejected",
    "accepted",
    "delayed",
    "compacted",
    "replicated",
    "indexed",
    "throttled",
    "promoted",
    "drained",
    "restored",
    "validated",
    "synced",
    "pruned",
]
ADJ = [
    "stale",
    "fresh",
    "primary",
    "secondary",
    "cold",
    "warm",
    "idle",
    "busy",
    "degraded",
    "healthy",
    "pending",
    "partial",
    "nominal",
]
STARS = [
    "orion",
    "vega",
    "lyra",
    "draco",
    "cygnus",
    "hydra",
    "aquila",
    "carina",
    "pavo",
    "indus",
    "lupus",
    "norma",
    "volans",
    "musca",
    "corvus",
    "crux",
    "ara",
    "fornax",
    "pictor",
    "dorado",
    "octans",
    "tucana",
]
SURNAMES = [
    "Okafor",
    "Lindqvist",
    "Moreau",
    "Tanaka",
    "Haddad",
    "Novak",
    "Ferreira",
    "Kowalski",
    "Brennan",
    "Sato",
    "Adeyemi",
    "Varga",
    "Castillo",
    "Nakamura",
    "Petrov",
    "Olsen",
    "Mensah",
    "Duarte",
    "Holm",
    "Iyer",
    "Quinn",
    "Rahman",
    "Sorensen",
    "Abara",
    "Keller",
    "Marsh",
    "Ito",
    "Vance",
]
GIVEN = [
    "Amara",
    "Bruno",
    "Chiara",
    "Dmitri",
    "Elif",
    "Farah",
    "Goran",
    "Hana",
    "Ivo",
    "Jun",
    "Kaia",
    "Leon",
    "Mira",
    "Nils",
    "Oona",
    "Pavel",
    "Rosa",
    "Saul",
    "Tala",
    "Uma",
    "Viktor",
    "Wen",
    "Yara",
    "Zoltan",
]
CITIES = [
    "Brightwater",
    "Calder",
    "Dunmore",
    "Eastvale",
    "Fernhill",
    "Glenrock",
    "Harrowgate",
    "Ivybridge",
    "Kestrel",
    "Larkspur",
    "Millbrook",
    "Northam",
    "Oakridge",
    "Pinecrest",
    "Quarry",
    "Redcliff",
    "Saltmarsh",
    "Thornbury",
    "Underhill",
    "Westhaven",
    "Yarrow",
    "Zennor",
]


def sentence(r: random.Random) -> str:
    """One filler sentence of plausible log / report prose."""
    return (
        f"The {r.choice(ADJ)} {r.choice(WORDS)} {r.choice(VERBS)} {r.randint(2, 97)} "
        f"{r.choice(WORDS)}s after the {r.choice(WORDS)} {r.choice(WORDS)} was {r.choice(VERBS)}."
    )


# -- the stream tool (retention, board) ----------------------------------------------------------------------

STREAM_STATE = ".task/stream.json"

_STREAM_BODY = r"""
STATE = ROOT / ".task" / "stream.json"


def run(args):
    state = json.loads(STATE.read_text())
    pending = state["pending"]
    if not pending:
        return "(end of stream: all %d parts were delivered)" % state["total"]
    part = pending.pop(0)
    # The stream is consumed: a delivered part is gone from the workspace and cannot be fetched again.
    write_json_atomic(STATE, state)
    return part
"""


@dataclass(frozen=True)
class Stream:
    """A consumable stream of text parts, served one per call by a no-argument harness tool.

    The tool is private (``ToolSpec.private``) and its parts are ``private_files`` of the task: the stream is
    not in the workspace, so a shell cannot grep it or filter a part before it reaches the context (which
    would bypass the retention problem the stream poses)."""

    tool: ToolSpec
    files: dict[str, str]
    """The task's ``private_files`` that hold the stream."""


def stream_tool(name: str, description: str, parts: list[str]) -> Stream:
    """The tool ``tools/NAME`` that prints the next part of ``parts`` on each call, then an end marker."""
    params: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
    command = f"tools/{name}"
    script = build_script(name, description, params, command, _STREAM_BODY)
    tool = ToolSpec(name, description, params, command, script, private=True)
    state = {"total": len(parts), "pending": parts}
    return Stream(tool=tool, files={STREAM_STATE: json.dumps(state, indent=0)})
