"""Research solver: answer each multi-hop question hop by hop (product → maker → person → birth town/year).

Every hop is a ``search`` for the entity's name, then a ``read`` of the document titled exactly so, unless a
fact sentence already in view (a document, a snippet, a kept fact) answers the hop. Facts: the fact sentences
of every hop found so far, verbatim, and ``doc NAME = Dnnn`` for a hop whose document is found but not read.
Questions are taken one after another; submits when every chain ends in a town or a year.
"""

from __future__ import annotations

import re

from ctxrl.env.policies.view import Call, Plan, View, strip_turn_header

_WORD = r"[A-Z][a-z]+"
_COMPANY = rf"{_WORD} (?:Works|Systems|Industries|Labs)"
_PERSON = rf"{_WORD} {_WORD}"
_QUESTION = re.compile(
    r"^(\d+)\. In which (town|year) was the (founder|chief executive) of the company that makes ([\w-]+) born\?",
    re.MULTILINE,
)
_MAKER = re.compile(rf"\b({_WORD}-\d) is an? [a-z ]+ made by ({_COMPANY})\.")
_FOUNDER = re.compile(rf"\b({_COMPANY}) was founded in \d{{4}} by ({_PERSON})\.")
_CEO = re.compile(rf"\bThe chief executive of ({_COMPANY}) is ({_PERSON})\.")
_BORN = re.compile(rf"\b({_PERSON}) was born in ({_WORD}) in (\d{{4}})\.")
_HIT = re.compile(r"^(D\d{3})  (.+?) -- ", re.MULTILINE)
_DOC_FACT = re.compile(r"^doc (.+) = (D\d{3})$", re.MULTILINE)
_DOC_HEAD = re.compile(r"^(D\d{3})  (.+)$")


class _Known:
    """The facts in view, as sentences (kept verbatim) and lookups."""

    def __init__(self, view: View) -> None:
        self.maker: dict[str, str] = {}
        self.role: dict[tuple[str, str], str] = {}
        self.born: dict[str, tuple[str, str]] = {}
        # "maker P" / "founder C" / "chief executive C" / "born X" -> the sentence, verbatim
        self.sentences: dict[str, str] = {}
        self.doc: dict[str, str] = {}  # title -> document id
        self.read: set[str] = set()  # titles whose document was read in full
        for text in view.texts():
            for m in _MAKER.finditer(text):
                self.maker[m.group(1)] = m.group(2)
                self.sentences[f"maker {m.group(1)}"] = m.group(0)
            for m in _FOUNDER.finditer(text):
                self.role[(m.group(1), "founder")] = m.group(2)
                self.sentences[f"founder {m.group(1)}"] = m.group(0)
            for m in _CEO.finditer(text):
                self.role[(m.group(1), "chief executive")] = m.group(2)
                self.sentences[f"chief executive {m.group(1)}"] = m.group(0)
            for m in _BORN.finditer(text):
                self.born[m.group(1)] = (m.group(2), m.group(3))
                self.sentences[f"born {m.group(1)}"] = m.group(0)
            hits = [*_HIT.findall(text), *((doc_id, title) for title, doc_id in _DOC_FACT.findall(text))]
            for doc_id, title in hits:
                self.doc.setdefault(title.strip(), doc_id)
            head = _DOC_HEAD.match(strip_turn_header(text).split("\n", 1)[0])
            if head and "\n\n" in text:
                self.read.add(head.group(2).strip())


def solve(view: View) -> Plan:
    questions = [(int(n), kind, role, product) for n, kind, role, product in _QUESTION.findall(view.task)]
    known = _Known(view)
    answers: dict[int, str] = {}
    next_call: Call | None = None
    facts: list[str] = []
    pending_docs: list[str] = []
    for number, kind, role, product in questions:
        maker = known.maker.get(product)
        person = known.role.get((maker, role)) if maker else None
        born = known.born.get(person) if person else None
        for key in (f"maker {product}", f"{role} {maker}", f"born {person}"):
            if key in known.sentences and known.sentences[key] not in facts:
                facts.append(known.sentences[key])
        if born is not None:
            answers[number] = born[0] if kind == "town" else born[1]
            continue
        entity = person or maker or product
        if next_call is None:
            doc_id = known.doc.get(entity)
            if doc_id is None:
                next_call = Call("search", {"query": entity})
            elif entity not in known.read:
                next_call = Call("read", {"doc_id": doc_id})
            else:  # read, yet the fact is not there: look the entity up again with a different query
                next_call = Call("search", {"query": f"{entity} born" if person else entity, "k": 10})
        if entity in known.doc:
            pending_docs.append(entity)
    facts += [f"doc {title} = {known.doc[title]}" for title in pending_docs]
    if next_call is None:
        answer = "\n".join(f"{n}. {answers.get(n, 'unknown')}" for n, *_ in questions)
        return Plan((Call("submit", {"answer": answer}),), tuple(facts))
    return Plan((next_call,), tuple(facts))
