"""Family ``retention``: keep a few exact values from a long, distractor-heavy stream of tool outputs.

The workspace holds a registry log served part by part by ``next_chunk`` (consumed: a delivered part is gone).
The prompt names a handful of (entity, field) pairs; the answer must reproduce each current value verbatim.
Distractors are built to punish sloppy retention: records of look-alike entities (``orion-7`` vs
``orion-17`` / ``vega-7``) carry values one character away from the true ones, other fields of the same
entity appear, and some values are rotated later in the stream (the old value is wrong). All of those are
``forbidden`` in the verifier, so pasting the whole log back fails too.

Sizing: the stream is several times the budget; what a manager must keep is a few short lines.

The stream tool is a harness tool (:func:`ctxrl.env.tasks._gen.stream_tool`): a shell cannot filter a part
before it reaches the context. A part is consumed, so it is no file view either.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ctxrl.env.tasks import _gen
from ctxrl.env.tasks.base import Task, VerifierSpec
from ctxrl.env.tasks.splits import split_of

FAMILY = "retention"


@dataclass(frozen=True)
class Knobs:
    n_chunks: int
    """Parts in the stream (one tool call each)."""
    lines_per_chunk: int
    n_targets: int
    """(entity, field) pairs the answer must give."""
    rotations: int
    """Targets whose value is replaced later in the stream (the earlier value becomes a wrong answer)."""
    budget_tokens: int
    max_steps: int
    lookalikes: int = 3
    """Records of look-alike entities per target, each with a near-miss value (at most 3)."""
    other_fields: int = 2
    """Records of the target entity's other fields per target (at most 4)."""
    warnings: bool = True
    """The prompt warns of rotated values and of a log larger than the budget; the ladder's lowest rungs,
    which have neither, leave both sentences out."""


PRESETS = {
    # The curriculum ladder for small models, lowest rung first (docs/results/learning/calibration.md):
    # one target in a two-part stream with a single confuser of each kind ...
    "mini": Knobs(
        n_chunks=2,
        lines_per_chunk=6,
        n_targets=1,
        rotations=0,
        budget_tokens=1600,
        max_steps=6,
        lookalikes=1,
        other_fields=1,
        warnings=False,
    ),
    # ... one target in three parts with two look-alikes ...
    "small": Knobs(
        n_chunks=3,
        lines_per_chunk=8,
        n_targets=1,
        rotations=0,
        budget_tokens=1600,
        max_steps=8,
        lookalikes=2,
        other_fields=1,
        warnings=False,
    ),
    # ... and ~1k-token contexts, four parts, two targets, every confuser, no rotation.
    "short": Knobs(n_chunks=4, lines_per_chunk=8, n_targets=2, rotations=0, budget_tokens=1500, max_steps=10),
    "easy": Knobs(
        n_chunks=10, lines_per_chunk=14, n_targets=3, rotations=0, budget_tokens=3000, max_steps=24
    ),
    "default": Knobs(
        n_chunks=24, lines_per_chunk=20, n_targets=4, rotations=1, budget_tokens=3000, max_steps=40
    ),
    "hard": Knobs(
        n_chunks=36, lines_per_chunk=20, n_targets=6, rotations=2, budget_tokens=3000, max_steps=56
    ),
}

_FIELDS = {
    "vault_key": lambda r: _gen.hexstr(r, 12),
    "checksum": lambda r: _gen.hexstr(r, 8),
    "port": lambda r: str(r.randint(10000, 65000)),
    "quota_mb": lambda r: str(r.randint(1000, 99999)),
    "build": lambda r: "b-" + _gen.hexstr(r, 6),
}


def _lookalikes(r: random.Random, entity: str) -> list[str]:
    """Entity names a careless reader confuses with ``entity``: same star other number, same number other star."""
    star, num = entity.split("-")
    others = [s for s in _gen.STARS if s != star]
    return [f"{star}-{num}{r.randint(0, 9)}", f"{star}-{r.randint(1, 9)}{num}", f"{r.choice(others)}-{num}"]


def _time_lines(r: random.Random, n: int, start: int) -> list[int]:
    times, t = [], start
    for _ in range(n):
        t += r.randint(1, 9)
        times.append(t)
    return times


def generate(seed: int, difficulty: str = "default") -> Task:
    """The retention task for ``seed`` at ``difficulty`` (``mini`` / ``small`` / ``short`` / ``easy`` /
    ``default`` / ``hard``)."""
    k = _gen.pick_preset(PRESETS, FAMILY, difficulty)
    r = _gen.rng(FAMILY, seed, difficulty)
    total_lines = k.n_chunks * k.lines_per_chunk

    # Targets: distinct entities, each with one field.
    entities = r.sample([f"{s}-{n}" for s in _gen.STARS for n in range(2, 10)], k.n_targets)
    targets = [{"entity": e, "field": r.choice(list(_FIELDS)), "value": ""} for e in entities]
    target_pairs = {(t["entity"], t["field"]) for t in targets}
    for t in targets:
        t["value"] = _FIELDS[t["field"]](r)

    # Records placed at chosen line positions; everything else is noise.
    placed: dict[int, str] = {}
    free = list(range(total_lines))
    r.shuffle(free)

    def place(text: str, lo: int = 0, hi: int = total_lines) -> int:
        for i, pos in enumerate(free):
            if lo <= pos < hi:
                del free[i]
                placed[pos] = text
                return pos
        raise AssertionError("no free line left in the stream")  # sizes guarantee room

    forbidden: list[str] = []
    rotated = set(r.sample(range(k.n_targets), k.rotations))
    for i, t in enumerate(targets):
        ent, fld, val = t["entity"], t["field"], t["value"]
        if i in rotated:
            old = _FIELDS[fld](r)
            # The old value early in the stream, the new one in the second half, after it.
            old_pos = place(f"registry {ent} {fld}={old}", 0, total_lines // 2)
            place(f"registry {ent} {fld}={val} (rotated; replaces the previous value)", old_pos + 1)
            forbidden.append(old)
        else:
            place(f"registry {ent} {fld}={val}")
        for look in _lookalikes(r, ent)[: k.lookalikes]:
            miss = _gen.near_miss(r, val)
            place(f"registry {look} {fld}={miss}")
            forbidden.append(miss)
        for other in r.sample([f for f in _FIELDS if f != fld], k.other_fields):
            place(f"registry {ent} {other}={_FIELDS[other](r)}")

    lines: list[str] = []
    times = _time_lines(r, total_lines, r.randint(100, 900))
    for pos in range(total_lines):
        text = placed.get(pos) or _noise(r, target_pairs)
        lines.append(f"[t+{times[pos]:05d}] {text}")
    chunks = []
    for c in range(k.n_chunks):
        body = "\n".join(lines[c * k.lines_per_chunk : (c + 1) * k.lines_per_chunk])
        chunks.append(f"=== registry log, part {c + 1}/{k.n_chunks} ===\n{body}")

    expected = [t["value"] for t in targets]
    forbidden = sorted({f for f in forbidden if f not in expected})
    asks = "\n".join(f"{i + 1}. `{t['field']}` of `{t['entity']}`" for i, t in enumerate(targets))
    prompt = (
        f"A service registry streams its log in {k.n_chunks} parts. Call the tool `next_chunk` (no arguments) "
        "once per part until it reports the end of the stream. A delivered part cannot be fetched again.\n\n"
        f"Then answer with the current value of each of these registry fields:\n{asks}\n\n"
        "Entity names look alike (orion-7, orion-17, vega-7 ...): match them exactly. "
        + (
            'A value may be replaced later in the stream by a line marked "(rotated)"; give the latest one. '
            if k.warnings
            else ""
        )
        + "Write one line per item, `entity field = value`, copying each value verbatim."
        + (" The whole log is several times larger than your context budget." if k.warnings else "")
    )
    stream = _gen.stream_tool(
        "next_chunk",
        "Print the next part of the registry log (no arguments); each part is delivered once.",
        chunks,
    )
    observed = sum(len(c) + 1 for c in chunks)
    return Task(
        task_id=f"{FAMILY}:{difficulty}:{seed}",
        family=FAMILY,
        split=split_of(seed),
        seed=seed,
        difficulty=difficulty,
        prompt=prompt,
        files={},
        private_files=stream.files,
        tools=[stream.tool],
        verifier=VerifierSpec(kind="all_values", expected=expected, forbidden=forbidden),
        budget_tokens=k.budget_tokens,
        max_steps=k.max_steps,
        metadata={
            "targets": targets,
            "oracle_answer": "\n".join(f"{t['entity']} {t['field']} = {t['value']}" for t in targets),
            "observation_calls": ["tools/next_chunk"] * k.n_chunks,
            "observation_chars": observed,
            "working_set_chars": sum(len(f"{t['entity']} {t['field']} = {t['value']}") + 1 for t in targets),
        },
    )


def _noise(r: random.Random, avoid: set[tuple[str, str]]) -> str:
    """A distractor line: chatter, request logs, or a registry record of a non-target pair."""
    kind = r.random()
    if kind < 0.35:
        while True:
            ent = f"{r.choice(_gen.STARS)}-{r.randint(2, 99)}"
            fld = r.choice(list(_FIELDS))
            if (ent, fld) not in avoid:
                return f"registry {ent} {fld}={_FIELDS[fld](r)}"
    if kind < 0.65:
        return (
            f"req={_gen.hexstr(r, 16)} route=/{r.choice(_gen.WORDS)}/{r.randint(1, 999)} "
            f"status={r.choice([200, 200, 200, 204, 304, 429, 503])} latency_ms={r.randint(1, 900)}"
        )
    return f"{r.choice(_gen.WORDS)}-{r.randint(1, 64)}: {_gen.sentence(r)}"
