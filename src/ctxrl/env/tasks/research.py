"""Family ``research``: multi-hop questions over a synthetic corpus, with ``search`` and ``read`` tools.

The corpus describes invented products, companies, people and cities; every fact needed sits inside a long
document of filler prose. A question such as "In which city was the founder of the company that makes
Vantor-9 born?" takes three hops (product → maker → founder → birth city), each a search plus a read.
Distractors: look-alike products of the same brand made by other companies, and a CEO beside the founder in
every company document; the answers their chains lead to are ``forbidden``. Reading every hop's document in
full overflows the budget; a manager keeps the one fact each document contributes and drops the rest.

``search`` and ``read`` are harness tools: the corpus is not in the workspace, so a document reaches the
context whole. A ``read`` result is a file view of the document, keyed by its id (``D017``).
"""

from __future__ import annotations

import json
import random
import shlex
from dataclasses import dataclass
from typing import Any

from ctxrl.env.tasks import _gen
from ctxrl.env.tasks.base import Task, ToolSpec, VerifierSpec
from ctxrl.env.tasks.splits import split_of
from ctxrl.env.tasks.toolscript import build_script

FAMILY = "research"


@dataclass(frozen=True)
class Knobs:
    n_brands: int
    """Product brands; each has three look-alike products (``Vantor-3``, ``Vantor-6`` …)."""
    n_companies: int
    n_people: int
    n_cities: int
    doc_chars: int
    """Approximate length of every document (filler around its facts)."""
    n_questions: int
    budget_tokens: int
    max_steps: int


PRESETS = {
    "easy": Knobs(5, 8, 10, 8, doc_chars=2000, n_questions=2, budget_tokens=3500, max_steps=24),
    "default": Knobs(8, 12, 16, 10, doc_chars=3800, n_questions=3, budget_tokens=3500, max_steps=40),
    "hard": Knobs(10, 16, 22, 12, doc_chars=3800, n_questions=4, budget_tokens=3500, max_steps=56),
}

_SYLLABLES = [
    "var",
    "nex",
    "quo",
    "ril",
    "tan",
    "dor",
    "bel",
    "mik",
    "sor",
    "zen",
    "cal",
    "pho",
    "lum",
    "tri",
    "vek",
    "ost",
    "andr",
    "ely",
    "gor",
    "ius",
    "kap",
    "sel",
]
_CATEGORIES = [
    "sensor array",
    "flow valve",
    "relay switch",
    "signal amplifier",
    "thermal camera",
    "load balancer",
    "drill head",
]
_ROLES = ("chief financial officer", "head of research", "board member", "lead engineer")
_STOP = [
    "a",
    "an",
    "and",
    "are",
    "at",
    "by",
    "for",
    "from",
    "in",
    "is",
    "it",
    "of",
    "on",
    "or",
    "the",
    "to",
    "was",
    "what",
    "when",
    "where",
    "which",
    "who",
    "with",
]


def _names(r: random.Random, n: int, syllables: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        name = "".join(r.choice(_SYLLABLES) for _ in range(syllables)).title()
        if name not in out:
            out.append(name)
    return out


def _document(r: random.Random, facts: list[str], size: int) -> str:
    """Filler prose of about ``size`` characters with the fact sentences spread through it."""
    sentences = list(facts)
    while sum(len(s) + 1 for s in sentences) < size:
        sentences.insert(r.randint(0, len(sentences)), _gen.sentence(r))
    # Break into paragraphs of ~5 sentences so a reader (or a grep) sees natural text.
    paragraphs = [" ".join(sentences[i : i + 5]) for i in range(0, len(sentences), 5)]
    return "\n\n".join(paragraphs)


@dataclass
class _World:
    products: dict[str, dict[str, Any]]
    companies: dict[str, dict[str, Any]]
    people: dict[str, dict[str, Any]]
    cities: list[str]


def _world(r: random.Random, k: Knobs) -> _World:
    cities = r.sample(_gen.CITIES, k.n_cities)
    people_names: list[str] = []
    while len(people_names) < k.n_people:
        name = f"{r.choice(_gen.GIVEN)} {r.choice(_gen.SURNAMES)}"
        if name not in people_names:
            people_names.append(name)
    people: dict[str, dict[str, Any]] = {
        p: {"city": r.choice(cities), "year": r.randint(1931, 1979), "roles": []} for p in people_names
    }
    company_names = [
        f"{n} {r.choice(['Works', 'Systems', 'Industries', 'Labs'])}" for n in _names(r, k.n_companies, 2)
    ]
    founders = r.sample(people_names, k.n_companies)
    companies: dict[str, dict[str, Any]] = {}
    for name, founder in zip(company_names, founders):
        ceo = r.choice([p for p in people_names if p != founder])
        companies[name] = {
            "founder": founder,
            "ceo": ceo,
            "city": r.choice(cities),
            "year": r.randint(1960, 2005),
        }
        people[founder]["roles"].append(f"founded {name}")
        people[ceo]["roles"].append(f"is the chief executive of {name}")
    products: dict[str, dict[str, Any]] = {}
    for brand in _names(r, k.n_brands, 2):
        for number in sorted(r.sample(range(2, 10), 3)):
            products[f"{brand}-{number}"] = {
                "maker": r.choice(company_names),
                "category": r.choice(_CATEGORIES),
                "year": r.randint(1995, 2023),
            }
    return _World(products, companies, people, cities)


_ROLE_TEXT = {"founder": "founder", "ceo": "chief executive"}
_QUESTIONS = {
    "city": "In which town was the {role} of the company that makes {p} born?",
    "year": "In which year was the {role} of the company that makes {p} born?",
}


def _person(w: _World, product: str, role: str) -> str:
    """The founder or chief executive (``role``) of the maker of ``product``."""
    return str(w.companies[w.products[product]["maker"]][role])


def _answer(w: _World, product: str, role: str, attribute: str) -> str:
    """Where or when the ``role`` person of ``product``'s maker was born: three hops."""
    return str(w.people[_person(w, product, role)][attribute])


_SEARCH_BODY = r"""
CORPUS = ROOT / ".task" / "corpus.json"
STOP = set(STOPWORDS)


def terms(text):
    return [t for t in re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)*", text.lower()) if t not in STOP]


def run(args):
    docs = json.loads(CORPUS.read_text())
    query = terms(args["query"])
    k = max(1, min(10, args.get("k", 5)))
    if not query:
        return "error: the query has no searchable words", 2
    df = {t: sum(1 for d in docs if t in set(terms(d["title"] + " " + d["text"]))) for t in set(query)}
    scored = []
    for d in docs:
        title, body = terms(d["title"]), terms(d["text"])
        score = sum(
            math.log((len(docs) + 1) / (df[t] + 0.5)) * (3 * title.count(t) + body.count(t)) for t in set(query)
        )
        if score > 0:
            scored.append((-score, d["id"], d))
    scored.sort(key=lambda item: (item[0], item[1]))
    lines = ["search %s: %d result(s)" % (json.dumps(args["query"]), min(k, len(scored)))]
    for _, doc_id, d in scored[:k]:
        sentences = re.split(r"(?<=[.!?])\s+", d["text"])
        best = max(sentences, key=lambda s: (sum(t in terms(s) for t in set(query)), -len(s)))
        snippet = best if len(best) <= 160 else best[:157] + "..."
        lines.append("%s  %s -- %s" % (doc_id, d["title"], snippet))
    return "\n".join(lines)
"""

_READ_BODY = r"""
CORPUS = ROOT / ".task" / "corpus.json"


def run(args):
    docs = {d["id"]: d for d in json.loads(CORPUS.read_text())}
    raw = args["doc_id"].strip().upper()
    digits = raw.lstrip("D")
    doc_id = "D%03d" % int(digits) if digits.isdigit() else raw
    if doc_id not in docs:
        return "error: no document %r; ids run from D001 to D%03d" % (args["doc_id"], len(docs)), 1
    d = docs[doc_id]
    return "%s  %s\n\n%s" % (d["id"], d["title"], d["text"])
"""


def generate(seed: int, difficulty: str = "default") -> Task:
    """The research task for ``seed`` at ``difficulty`` (``easy`` / ``default`` / ``hard``)."""
    k = _gen.pick_preset(PRESETS, FAMILY, difficulty)
    r = _gen.rng(FAMILY, seed, difficulty)
    w = _world(r, k)

    entries: list[tuple[str, list[str]]] = []
    for name, p in w.products.items():
        entries.append((name, [f"{name} is a {p['category']} made by {p['maker']}.",
                               f"{name} was first released in {p['year']}."]))  # fmt: skip
    for name, c in w.companies.items():
        made = (
            ", ".join(sorted(p for p, v in w.products.items() if v["maker"] == name)) or "no current products"
        )
        entries.append((name, [f"{name} was founded in {c['year']} by {c['founder']}.",
                               f"{name} is headquartered in {c['city']}.",
                               f"The chief executive of {name} is {c['ceo']}.",
                               f"Products of {name}: {made}."]))  # fmt: skip
    for name, person in w.people.items():
        facts = [f"{name} was born in {person['city']} in {person['year']}."]
        facts += [f"{name} {role}." for role in person["roles"]]
        if not person["roles"]:
            facts.append(f"{name} served as {r.choice(_ROLES)} of {r.choice(list(w.companies))}.")
        entries.append((name, facts))
    for city in w.cities:
        offices = r.sample(list(w.companies), 2)
        entries.append((city, [f"{city} is a town with {r.randint(8, 900)} thousand inhabitants.",
                               f"{offices[0]} and {offices[1]} have branch offices in {city}."]))  # fmt: skip
    r.shuffle(entries)
    docs = [
        {"id": f"D{i + 1:03d}", "title": title, "text": _document(r, facts, k.doc_chars)}
        for i, (title, facts) in enumerate(entries)
    ]
    doc_of = {d["title"]: d["id"] for d in docs}
    docs_by_id = {d["id"]: d for d in docs}
    read_chars = 0

    questions: list[str] = []
    expected: list[str] = []
    forbidden: set[str] = set()
    calls: list[str] = []
    for product in r.sample(sorted(w.products), k.n_questions):
        role, attribute = r.choice(sorted(_ROLE_TEXT)), r.choice(sorted(_QUESTIONS))
        questions.append(_QUESTIONS[attribute].format(role=_ROLE_TEXT[role], p=product))
        expected.append(_answer(w, product, role, attribute))
        # Wrong chains: the other role of the same company, and the same role behind look-alike products.
        other_role = "ceo" if role == "founder" else "founder"
        forbidden.add(_answer(w, product, other_role, attribute))
        brand = product.rsplit("-", 1)[0]
        forbidden |= {
            _answer(w, p, role, attribute) for p in w.products if p.startswith(brand + "-") and p != product
        }
        for title in (product, w.products[product]["maker"], _person(w, product, role)):
            calls += [f"tools/search --query {shlex.quote(title)}", f"tools/read --doc_id {doc_of[title]}"]
            read_chars += len(doc_of[title]) + len(title) + len(docs_by_id[doc_of[title]]["text"]) + 5
    forbidden -= set(expected)

    search_params: dict[str, Any] = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "words to look for"},
            "k": {"type": "integer", "description": "number of results, 1-10 (default 5)"},
        },
        "required": ["query"],
    }
    read_params: dict[str, Any] = {
        "type": "object",
        "properties": {"doc_id": {"type": "string", "description": "a document id such as D017"}},
        "required": ["doc_id"],
    }
    search_desc = "Search the corpus; prints the best-matching document ids, titles and one snippet each."
    read_desc = "Print one document of the corpus in full."
    search_body = f"STOPWORDS = {_STOP!r}\n" + _SEARCH_BODY
    # Harness tools: the corpus is not in the workspace, so a document reaches the context whole (a shell
    # that greps the corpus for the one sentence it needs would bypass the multi-hop reading the task poses).
    # A read is a file view of the document, keyed by its id.
    tools = [
        ToolSpec("search", search_desc, search_params, "tools/search",
                 build_script("search", search_desc, search_params, "tools/search", search_body),
                 private=True),
        ToolSpec("read", read_desc, read_params, "tools/read",
                 build_script("read", read_desc, read_params, "tools/read", _READ_BODY),
                 private=True, view="{doc_id}"),
    ]  # fmt: skip
    asks = "\n".join(f"{i + 1}. {q}" for i, q in enumerate(questions))
    prompt = (
        f"Answer these questions from a corpus of {len(docs)} documents about products, companies, people "
        f"and towns:\n{asks}\n\n"
        "Use the tool `search` (argument `query`) to find documents and `read` (argument `doc_id`) to read "
        "one. Each answer takes several hops (find the product, then its maker, then the person), and "
        "look-alike names (Vantor-3, Vantor-6) belong to different makers. Documents are long; reading all "
        "the ones you need will not fit in your context at once.\n\n"
        "Answer with one line per question, `N. answer`, the answer being a town name or a year."
    )
    return Task(
        task_id=f"{FAMILY}:{difficulty}:{seed}",
        family=FAMILY,
        split=split_of(seed),
        seed=seed,
        difficulty=difficulty,
        prompt=prompt,
        files={},
        private_files={".task/corpus.json": json.dumps(docs, indent=0)},
        tools=tools,
        verifier=VerifierSpec(kind="all_values", expected=expected, forbidden=sorted(forbidden)),
        budget_tokens=k.budget_tokens,
        max_steps=k.max_steps,
        metadata={
            "questions": questions,
            "answers": expected,
            "oracle_answer": "\n".join(f"{i + 1}. {a}" for i, a in enumerate(expected)),
            "observation_calls": calls,
            # The reads of every hop; the searches' result lists come on top.
            "observation_chars": read_chars,
            "working_set_chars": sum(len(q) + 40 for q in questions),
        },
    )
