"""Proposers: from contrastive notes and a parent skill to N candidate proposals.

A :class:`Proposer` returns raw proposals, JSON objects of the shape :mod:`ctxrl.evolve.proposal` describes (a
few edits of the parent's rules, or in the ``rewrite`` style a whole new body); the round reads each with
:func:`ctxrl.evolve.proposal.read_proposal` and drops, never repairs, what fails. Every proposal must cite the
note steps it targets and predict its effect.

- :class:`ChatProposer`: any chat model behind ``complete(messages, schema) -> str``, one call per proposal.
  ``schema`` is :func:`~ctxrl.evolve.proposal.proposal_schema` for this parent and these notes; a completer
  that can constrain decoding to it does (:func:`engine_complete` on an engine with structured outputs, the
  policy model proposing: self-evolution; :class:`OpenAIChat` with ``response_format``), one that cannot asks
  in words and the validation catches what is malformed.
- :class:`OpenAIProposer`: a :class:`ChatProposer` over an OpenAI-compatible ``/v1/chat/completions`` endpoint
  (a vLLM server, a hosted API), with the standard library's HTTP client: a timeout per request, retries
  with exponential backoff on connection errors, timeouts, HTTP 429 and 5xx, and one clear error naming the
  URL when it stays unreachable.
- :class:`OfflineProposer`: **deterministic and rule-based, for tests and the CPU quickstart; it is not a
  model.** It reads the notes' structured digests and edits one habit sentence of the skill, the compaction
  threshold (:data:`ctxrl.env.skills.COMPACT_SENTENCE`, which the scripted managers read): failures that passed
  the context limit or got urgent nudges lower it;
  successes that cost more because they edited more often raise it. Each of its N candidates moves the
  threshold by a different step (a ``revise`` of the rule that states it, or an ``add`` when none does), cites
  the steps that showed the problem and predicts the direction of the effect. A policy whose behaviour follows
  that sentence (the scripted skill-reading manager) can then improve under evolution; a real model reads it as
  an instruction like any other.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ctxrl.env.skills import COMPACT_PATTERN, COMPACT_SENTENCE, DEFAULT_COMPACT_PERCENT, compact_percent
from ctxrl.errors import CtxrlError
from ctxrl.evolve.config import EvolveConfig
from ctxrl.evolve.notes import ContrastNote, known_steps, render_notes
from ctxrl.evolve.proposal import MAX_EDITS, ProposalStyle, proposal_schema
from ctxrl.evolve.rules import itemise, numbered
from ctxrl.evolve.skill import MAX_BODY_CHARS, Skill

Message = dict[str, str]
Schema = dict[str, Any]
Complete = Callable[[list[list[Message]], "Schema | None"], list[str]]
"""``complete(conversations, schema) -> texts``: one chat completion per conversation (batched where the backend
can), each constrained to ``schema`` where the backend can."""


class ProposerError(CtxrlError):
    """A proposer could not produce candidates (endpoint unreachable, refused, or answering nonsense)."""


class Proposer(Protocol):
    """Contrastive notes + the parent skill -> ``n`` raw proposals for ``round``."""

    def propose(self, parent: Skill, notes: Sequence[ContrastNote], n: int, *, round: int) -> list[str]: ...


# ------------------------------------------------------------------------------------------- the prompt

_TASK = """You improve a context-management skill: the rules in an agent's system prompt that tell it how to \
manage its limited context window. You get the current skill and contrastive notes: for each task, a better run \
(A) and a worse run (B) of the same skill, one line per step (s0 is the first step) with the context size after \
the step, the calls, the context receipts and the budget nudges.

"""
EDIT_INSTRUCTIONS = (
    _TASK
    + """The skill is shown one rule per line, each with its id in brackets. Propose {edits} \
that would turn the worse runs into the better ones: revise a rule (new text for it), remove one, or add a new \
rule at the end; every rule you do not name stays as it is. Reply with one JSON object and nothing else, for \
example:

{{"targets": ["[n2.B.s5]"], "predicts": "fewer wrong answers after compaction; cost a little higher", "edits": \
[{{"op": "revise", "rule": "r3f2a", "text": "- Before you compact, copy every key and value you still need \
into the replacement note."}}]}}

targets are the steps your edit addresses, copied from the notes; rule is the id of a rule of the skill."""
)
REWRITE_INSTRUCTIONS = (
    _TASK
    + """Write ONE full rewrite of the skill that would turn the worse runs into the \
better ones. Reply with one JSON object and nothing else:

{{"targets": ["[n1.B.s7]"], "predicts": "<one line: the effect on success and on cost>", "body": "<the new \
skill, markdown, at most {max_chars} characters>"}}

targets are the steps your rewrite addresses, copied from the notes."""
)


def proposer_messages(
    parent: Skill,
    notes: Sequence[ContrastNote],
    *,
    round: int,
    variant: int,
    style: ProposalStyle = "edits",
    max_chars: int = MAX_BODY_CHARS,
    max_edits: int = MAX_EDITS,
) -> list[Message]:
    """The chat messages asking for one proposal (``variant`` numbers the proposals of one round, so a
    sampled model is nudged to give different ones)."""
    if style == "edits":
        edits = (
            "one small edit" if max_edits == 1 else f"at most {max_edits} small edits, each of another rule"
        )
        system = EDIT_INSTRUCTIONS.format(edits=edits)
        shown = numbered(itemise(parent.body))
    else:
        system = REWRITE_INSTRUCTIONS.format(max_chars=max_chars)
        shown = parent.body
    user = (
        f"Current skill:\n\n{shown}\n\n"
        f"Contrastive notes:\n\n{render_notes(notes)}\n\n"
        f"Write proposal {variant + 1} (round {round})."
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


@dataclass
class ChatProposer:
    """One chat completion per proposal, all of a round in one ``complete(conversations, schema)`` call (a
    served model, or the policy model through its engine, which batches them).

    ``fits(messages)``, when given, says whether a request leaves the model room for a whole answer (the
    engine's context minus the answer budget); the last notes (the least telling: success-vs-failure notes come
    first) are left out until it does, so an answer is never cut by the context limit. No note left: nothing
    is proposed."""

    complete: Complete
    style: ProposalStyle = "edits"
    max_chars: int = MAX_BODY_CHARS
    max_edits: int = MAX_EDITS
    fits: Callable[[list[Message]], bool] | None = None
    notes_shown: int | None = None
    """How many notes the last :meth:`propose` showed (after fitting)."""

    def propose(self, parent: Skill, notes: Sequence[ContrastNote], n: int, *, round: int) -> list[str]:
        kept = list(notes)

        def conversation(i: int) -> list[Message]:
            return proposer_messages(
                parent,
                kept,
                round=round,
                variant=i,
                style=self.style,
                max_chars=self.max_chars,
                max_edits=self.max_edits,
            )

        while self.fits is not None and kept and not self.fits(conversation(n)):
            kept.pop()
        self.notes_shown = len(kept)
        if notes and not kept:
            return []
        schema = proposal_schema(
            parent, known_steps(kept), style=self.style, max_chars=self.max_chars, max_edits=self.max_edits
        )
        return [text.strip() for text in self.complete([conversation(i) for i in range(n)], schema)]


@dataclass
class EngineChat:
    """:data:`Complete` through a generation engine (self-evolution: the policy model proposes): each
    conversation rendered with ``tokenizer``'s chat template, one batched ``engine.generate`` call, the texts
    decoded. ``structured``: the engine constrains decoding to the schema (``EngineSpec.structured_outputs``);
    else the schema is only described in the prompt."""

    engine: Any
    tokenizer: Any
    sampling: Any
    structured: bool

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # some tokenizers return an encoding
            ids = ids["input_ids"]
        return list(ids)

    def fits(self, messages: list[Message]) -> bool:
        """Whether the prompt and a whole answer (``sampling.max_new_tokens``) fit the engine's context."""
        limit = getattr(self.engine, "max_model_len", None)
        return limit is None or len(self.prompt_ids(messages)) + self.sampling.max_new_tokens <= int(limit)

    def __call__(self, conversations: list[list[Message]], schema: Schema | None) -> list[str]:
        prompts = [self.prompt_ids(messages) for messages in conversations]
        structured = self.structured and schema is not None
        params = replace(self.sampling, json_schema=json.dumps(schema)) if structured else self.sampling
        gens = self.engine.generate(prompts, params)
        return [self.tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in gens]


def engine_complete(engine: Any, tokenizer: Any, sampling: Any, *, structured: bool) -> EngineChat:
    """The :class:`EngineChat` of ``engine`` (see there)."""
    return EngineChat(engine, tokenizer, sampling, structured)


# ------------------------------------------------------------------------------------------- HTTP

_RETRY_STATUS = (408, 429, 500, 502, 503, 504)
_EVOLVE = EvolveConfig()  # the client's defaults are the evolve section's: one home per setting


@dataclass
class OpenAIChat:
    """``complete(messages, schema)`` over an OpenAI-compatible ``POST {base_url}/chat/completions``; with
    ``response_format`` on, a schema goes along as ``response_format: {"type": "json_schema", ...}`` (vLLM's
    server and hosted APIs with structured outputs constrain the answer to it)."""

    base_url: str
    """E.g. ``http://127.0.0.1:8000/v1`` (a vLLM server) or ``https://api.openai.com/v1``."""
    model: str
    api_key: str | None = None
    timeout_s: float = _EVOLVE.proposer_timeout_s
    retries: int = _EVOLVE.proposer_retries
    """Attempts after the first, on connection errors, timeouts, HTTP 408/429/5xx."""
    backoff_s: float = 2.0
    """Wait before retry i: backoff_s * 2**i."""
    temperature: float = _EVOLVE.proposer_temperature
    max_tokens: int = _EVOLVE.proposer_max_tokens
    response_format: bool = _EVOLVE.proposer_response_format
    """Send the proposal schema as ``response_format`` (off for an endpoint that refuses the field)."""
    sleep: Callable[[float], None] = time.sleep

    @classmethod
    def from_config(cls, config: EvolveConfig, api_key: str | None = None) -> OpenAIChat:
        """The client of ``config.proposer_*`` (url, model, timeout, retries, temperature, max tokens)."""
        if not config.proposer_url:
            raise ProposerError("proposer=openai needs evolve.proposer_url")
        return cls(
            config.proposer_url,
            config.proposer_model,
            api_key=api_key,
            timeout_s=config.proposer_timeout_s,
            retries=config.proposer_retries,
            temperature=config.proposer_temperature,
            max_tokens=config.proposer_max_tokens,
            response_format=config.proposer_response_format,
        )

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    def __call__(self, messages: list[Message], schema: Schema | None = None) -> str:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if schema is not None and self.response_format:
            payload["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "proposal", "schema": schema, "strict": True},
            }
        body = json.dumps(payload).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.sleep(self.backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    raw = response.read()
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:200].decode("utf-8", "replace").replace("\n", " ")
                if exc.code not in _RETRY_STATUS:
                    raise ProposerError(
                        f"proposer endpoint {self.url} answered HTTP {exc.code}: {detail}"
                    ) from None
                last = f"HTTP {exc.code}: {detail}"
                continue
            except (OSError, http.client.HTTPException) as exc:  # URLError, timeouts, resets, cut answers
                reason = getattr(exc, "reason", exc)
                last = f"{type(reason).__name__}: {reason}" if not isinstance(reason, str) else reason
                continue
            return _content(raw, self.url)
        raise ProposerError(
            f"proposer endpoint {self.url} unreachable after {self.retries + 1} attempts ({last})"
        )

    def complete_all(self, conversations: list[list[Message]], schema: Schema | None = None) -> list[str]:
        """:data:`Complete` over the endpoint: one request per conversation, in turn."""
        return [self(messages, schema) for messages in conversations]


def _content(raw: bytes, url: str) -> str:
    try:
        data: Any = json.loads(raw)
        content = data["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise ProposerError(
            f"proposer endpoint {url} did not answer like /v1/chat/completions: {raw[:120]!r}"
        ) from None
    if not isinstance(content, str):
        raise ProposerError(f"proposer endpoint {url} returned no text content")
    return content


class OpenAIProposer:
    """A :class:`ChatProposer` over an OpenAI-compatible endpoint (options: those of :class:`OpenAIChat`)."""

    def __init__(
        self,
        chat: OpenAIChat,
        style: ProposalStyle = "edits",
        max_chars: int = MAX_BODY_CHARS,
        max_edits: int = MAX_EDITS,
    ) -> None:
        self.chat = chat
        self.proposer = ChatProposer(chat.complete_all, style, max_chars, max_edits)

    @classmethod
    def from_config(cls, config: EvolveConfig, api_key: str | None = None) -> OpenAIProposer:
        """The proposer of an evolve section with ``proposer: openai``."""
        chat = OpenAIChat.from_config(config, api_key)
        return cls(chat, config.proposal_style, config.max_chars, config.max_edits)

    def propose(self, parent: Skill, notes: Sequence[ContrastNote], n: int, *, round: int) -> list[str]:
        return self.proposer.propose(parent, notes, n, round=round)


# ------------------------------------------------------------------------------------------- offline

DEFAULT_PERCENT = DEFAULT_COMPACT_PERCENT
"""The threshold a skill without the sentence is taken to have (the scripted managers' default fill, 0.6)."""
LOWER_STEPS = (10, 20, 5, 15, 25)
RAISE_STEPS = (10, 5, 15, 20, 25)
MIN_PERCENT, MAX_PERCENT = 20, 90


def with_compact_percent(body: str, percent: int) -> str:
    """``body`` with its compaction sentence set to ``percent`` (appended as a line if it has none)."""
    sentence = COMPACT_SENTENCE.format(percent=percent)
    if COMPACT_PATTERN.search(body):
        return COMPACT_PATTERN.sub(sentence, body, count=1)
    return body.rstrip() + "\n" + sentence


class OfflineProposer:
    """Deterministic rule-based edits of the compaction threshold (see the module docstring). Not a model:
    for tests and the CPU quickstart. Returns fewer than ``n`` (possibly none) when the notes show nothing to
    act on or the threshold is at its bound. ``style``: ``edits`` (revise or add the rule stating it) or
    ``rewrite`` (the whole body with the sentence changed)."""

    def __init__(self, style: ProposalStyle = "edits") -> None:
        self.style = style

    def propose(self, parent: Skill, notes: Sequence[ContrastNote], n: int, *, round: int) -> list[str]:
        pressure: list[str] = []  # citations of steps where a worse run hit the limit or got urgent nudges
        for note in notes:
            run = note.worse
            if not run.success and (run.overflowed or run.urgent_steps):
                pressure.extend(f"[{note.label}.B.s{s}]" for s in run.urgent_steps[:2])
                if not run.urgent_steps and run.steps:
                    pressure.append(f"[{note.label}.B.s{run.steps[-1].index}]")
        over_editing: list[str] = []  # citations of edits of dearer successes that edited more often
        for note in notes:
            if note.kind == "cost" and len(note.worse.edit_steps) > len(note.better.edit_steps):
                over_editing.extend(f"[{note.label}.B.s{s}]" for s in note.worse.edit_steps[:2])
        current = compact_percent(parent.body) or DEFAULT_PERCENT
        if pressure:
            targets, steps, sign = pressure, LOWER_STEPS, -1
            why = f"{len(pressure)} cited step(s) of failed runs were at or past the limit"
            predicts = (
                "fewer overflows and urgent steps; success up; cost up slightly from earlier compactions"
            )
        elif over_editing:
            targets, steps, sign = over_editing, RAISE_STEPS, +1
            why = "dearer successes compacted more often"
            predicts = "fewer compactions; cost down; success about the same"
        else:
            return []
        out: list[str] = []
        seen: set[int] = set()
        for step in steps[:n]:
            percent = min(MAX_PERCENT, max(MIN_PERCENT, current + sign * step))
            if percent == current or percent in seen:
                continue
            seen.add(percent)
            proposal: dict[str, Any] = {
                "targets": list(dict.fromkeys(targets[:6])),
                "predicts": f"threshold {current}% -> {percent}% ({why}): {predicts}",
            }
            if self.style == "edits":
                proposal["edits"] = [_threshold_edit(parent.body, percent)]
            else:
                proposal["body"] = with_compact_percent(parent.body, percent)
            out.append(json.dumps(proposal))
        return out


def _threshold_edit(body: str, percent: int) -> dict[str, str]:
    """The edit that sets ``body``'s compaction threshold to ``percent``: a revise of the first rule stating
    one, else an added rule."""
    sentence = COMPACT_SENTENCE.format(percent=percent)
    for rule in itemise(body):
        if COMPACT_PATTERN.search(rule.text):
            return {
                "op": "revise",
                "rule": rule.id,
                "text": COMPACT_PATTERN.sub(sentence, rule.text, count=1),
            }
    return {"op": "add", "text": sentence}
