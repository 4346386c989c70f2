"""Retention solver: read the registry log part by part, keep the lines about the asked (entity, field) pairs.

Facts: the ``registry ENTITY FIELD=VALUE`` line of every asked pair seen so far, verbatim with its
``(rotated; ...)`` mark if it has one, and how many parts were read. As the prompt says, a value is replaced
only by a later line marked rotated: a later unmarked line for the same pair is a distractor (a look-alike of
one asked entity can be another asked entity). Submits after the last part.
"""

from __future__ import annotations

import re

from ctxrl.env.policies.view import Call, Plan, View

_ASK = re.compile(r"^\d+\. `(\w+)` of `([\w-]+)`", re.MULTILINE)
_PARTS = re.compile(r"streams its log in (\d+) parts")
_RECORD = re.compile(r"registry (\S+) (\w+)=([0-9A-Za-z-]+)(?=\s|$)( \(rotated;[^)\n]*\))?")
_PART = re.compile(r"part (\d+)/(\d+)")
_END = "(end of stream"


def solve(view: View) -> Plan:
    asks = [(entity, fld) for fld, entity in _ASK.findall(view.task)]
    wanted = set(asks)
    total = int(m.group(1)) if (m := _PARTS.search(view.task)) else 0
    values: dict[tuple[str, str], tuple[str, str]] = {}  # pair -> (value, rotation mark or "")
    read, ended = 0, False
    for text in view.texts():
        for entity, fld, value, rotated in _RECORD.findall(text):
            if (entity, fld) in wanted and ((entity, fld) not in values or rotated):
                values[(entity, fld)] = (value, rotated)
        read = max([read, *(int(n) for n, _ in _PART.findall(text))])
        ended = ended or _END in text
    facts = [f"registry {e} {f}={''.join(values[(e, f)])}" for e, f in asks if (e, f) in values]
    facts.append(f"[progress] registry log: read part {read}/{total}")
    if ended or (total and read >= total):
        answer = "\n".join(f"{e} {f} = {values.get((e, f), ('unknown',))[0]}" for e, f in asks)
        return Plan((Call("submit", {"answer": answer}),), tuple(facts))
    return Plan((Call("next_chunk"),), tuple(facts))
