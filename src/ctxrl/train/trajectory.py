"""The trajectory record: what one rollout episode did, step by step, as the trainer and the cost model need it.

    episodes = rollout(engine, tokenizer, tasks, config).episodes
    save_trajectories(episodes, "runs/r1/trajectories.jsonl")
    again = load_trajectories("runs/r1/trajectories.jsonl")          # the same objects back
    ds = datasets.load_dataset("json", data_files="runs/r1/trajectories.jsonl", split="train")
    EpisodeRecord.from_dict(ds[0]) == again[0]                       # rows of the dataset, too

Per step (:class:`StepRecord`): the prompt ids the engine consumed and the ids it generated with their
logprobs (token in, token out: nothing here is re-tokenised text), the edit mask over the generated ids,
the receipts and budget readout the harness wrote, the cost components of the call (prefix-cache replay),
the engine's cached-token count and finish reason, and how the prompt was built (``reset``: first prompt;
``extend``: the previous prompt + its generated ids + the appended turns; ``rebuild``: rendered again from
the messages after an edit, a rollback or a history the chat template renders differently).

Per episode (:class:`EpisodeRecord`): which task (id, family, split, seed, difficulty), mode and skill (a
hash of the skill text), the group it belongs to (one group = the G episodes of one task), the verdict and
reward, the replayed cost in tokens and FLOPs, and why it ended.

The file format is JSONL, one episode per line, with a fixed set of keys and types per line so
``datasets`` (pyarrow) infers one schema for the whole file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ctxrl.errors import UsageError
from ctxrl.train.run_folder import json_lines

PROMPT_SOURCES = ("reset", "extend", "rebuild")

END_REASONS = ("submit", "max_steps", "max_lm_calls", "overflow", "max_model_len", "aborted")
"""Why an episode ended: the harness's reasons (``submit``, ``max_steps``, ``max_lm_calls``, ``overflow``);
``max_model_len``: the next prompt leaves no room for a new token under the engine's maximum length;
``aborted``: the engine returned an aborted generation for another reason (recorded in the last step), or
resetting, stepping or grading the episode raised (the cause is in the record's ``verdict``)."""


def skill_id(skill: str) -> str:
    """A short stable id of a skill text: the first 16 hex digits of its SHA-256.

    >>> skill_id("## Managing your context")
    '37a1857f43c02771'
    """
    return hashlib.sha256(skill.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class StepCost:
    """Cost components of one model call, from replaying the episode through a prefix cache."""

    prompt_tokens: int
    cached_tokens: int
    """Prompt tokens the replayed prefix cache serves (the model's figure; the engine's own is on the step)."""
    generated_tokens: int
    flops: float | None
    """FLOPs of the call (:func:`ctxrl.rewards.cost.step_flops`); None when the model geometry is unknown."""


@dataclass(frozen=True)
class StepRecord:
    """One step of an episode: the model call and what the harness did with its action."""

    prompt_ids: list[int]
    """Exactly the ids the engine consumed."""
    token_ids: list[int]
    """Exactly the ids the engine generated (the ending stop token included)."""
    logprobs: list[float]
    """The engine's raw-model logprob of each generated id."""
    edit_mask: list[int]
    """1 on the generated ids of the tool call(s) that targeted the context (``ctxrl.rewards.masks``)."""
    finish_reason: str
    num_cached_tokens: int
    """Prompt tokens the engine reported as served from its prefix cache."""
    prompt_source: str
    """How ``prompt_ids`` was built: ``reset``, ``extend`` or ``rebuild`` (see the module docstring)."""
    rebuild_reason: str | None
    """Why the prompt was rebuilt: ``edit`` (edit applied or rollback), ``history`` (earlier messages
    changed, e.g. merged notes), ``template`` (the chat template does not render append-only); else None."""
    text: str
    """The generated ids decoded (special tokens kept), for reading; training uses ``token_ids``."""
    tool_calls: list[str]
    """Names of the parsed tool calls, in order (``invalid_tool_call`` for a malformed one)."""
    edit_calls: list[int]
    """Indices (into ``tool_calls``) of the calls that targeted the context."""
    receipts: list[str]
    receipt_kinds: list[str]
    readout: str
    """The budget readout line shown after the step."""
    nudges: list[str]
    context_tokens: int
    """The harness's (calibrated) context size after the step."""
    edited: bool
    """The step rewrote the editable region (edit applied or rollback): the next prompt is rebuilt."""
    free_turn: bool
    cost: StepCost
    rolled_back_turns: int = 0
    """Turns the overflow rollback removed at this step (0: no rollback)."""
    events: list[str] = field(default_factory=list)
    """What the mode recorded this step (``context_op``, ``ContextManaged`` and pressure events), one JSON
    object per item (kept as text so every line of the file has one schema)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepRecord:
        values = _known(cls, {"rolled_back_turns": 0, "events": [], **data})
        values["cost"] = StepCost(**_known(StepCost, data["cost"]))
        return cls(**values)


@dataclass(frozen=True)
class EpisodeRecord:
    """One episode: the task, mode and skill, every step, the verdict, the cost and why it ended."""

    task_id: str
    family: str
    split: str
    seed: int
    difficulty: str
    mode: str
    skill_id: str
    group: int
    """Index of the task among the rollout's tasks: the G episodes of one task share it."""
    index: int
    """Index of the episode within its group (0..G-1)."""
    engine: str
    success: bool
    score: float
    reward: float
    """The task reward: 1.0 on success, else 0.0 (cost only re-ranks successes, in the advantages)."""
    end_reason: str
    answer: str | None
    verdict: str
    """The verifier's one-line detail."""
    cost_tokens: float
    """Replayed cost in computed tokens (prefilled + generated, :func:`ctxrl.rewards.cost.episode_cost`)."""
    cost_flops: float | None
    """Replayed cost in FLOPs; None when the model geometry is unknown."""
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def num_generated(self) -> int:
        return sum(len(s.token_ids) for s in self.steps)

    @property
    def num_cached(self) -> int:
        """Prompt tokens the engine served from its prefix cache, over all steps."""
        return sum(s.num_cached_tokens for s in self.steps)

    @property
    def num_prompt(self) -> int:
        return sum(len(s.prompt_ids) for s in self.steps)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EpisodeRecord:
        """From :meth:`to_dict` output, a parsed JSONL line or a ``datasets`` row."""
        values = _known(cls, {"rolled_back_turns": 0, "events": [], **data})
        values["steps"] = [StepRecord.from_dict(s) for s in data.get("steps") or []]
        return cls(**values)


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of dataclass ``cls`` from ``data``; a missing field is a clear error."""
    names = [f.name for f in fields(cls)]
    missing = [n for n in names if n not in data]
    if missing:
        raise UsageError(f"{cls.__name__} lacks {', '.join(missing)}; is this a ctxrl trajectory file?")
    return {n: data[n] for n in names}


def save_trajectories(episodes: Iterable[EpisodeRecord], path: str | Path, *, append: bool = False) -> Path:
    """Write ``episodes`` as JSONL (one episode per line); returns the path.

    Without ``append`` the file is written to a temporary name and renamed into place, so a reader never
    sees half a file.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if append:
        with out.open("a", encoding="utf-8") as handle:
            for ep in episodes:
                handle.write(json.dumps(ep.to_dict(), ensure_ascii=False) + "\n")
        return out
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for ep in episodes:
            handle.write(json.dumps(ep.to_dict(), ensure_ascii=False) + "\n")
    os.replace(tmp, out)
    return out


def iter_trajectories(path: str | Path) -> Iterator[EpisodeRecord]:
    """Read episodes back from a JSONL file written by :func:`save_trajectories`."""
    for _, data in json_lines(path):
        yield EpisodeRecord.from_dict(data)


def load_trajectories(path: str | Path) -> list[EpisodeRecord]:
    """All episodes of a JSONL trajectory file."""
    return list(iter_trajectories(path))
