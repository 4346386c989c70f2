"""The GEPA baseline: the ``gepa`` package optimising the same skill on the same terms (``ctxrl evolve
--optimizer gepa``).

    result = run_gepa(run_dir, config.evolve, mode="file", families=[...], difficulty="easy",
                      runner=RolloutRunner(...), proposer=OfflineProposer(), engine_seed=0)

GEPA (Agrawal et al., the ``gepa`` package) evolves text components by reflective mutation: pick a parent from
the Pareto front of a validation set, run it on a minibatch of train instances, reflect on the traces, propose
a child, keep it if it beats the parent on that minibatch, then score it on the whole validation set. What this
module fixes so the comparison with :class:`ctxrl.evolve.loop.EvolveLoop` is on equal terms:

- **The component** is one text, ``skill``: the body of the context-management skill, as the ctxrl loop evolves.
- **Episodes** run through the same :class:`ctxrl.evolve.loop.Runner` (one batch per repeat, per-episode skills),
  with the same policy and engine; an instance's score is the graded episode ``score`` the ctxrl gate pairs.
- **Train instances** are the train tasks the ctxrl run would read over its rounds (``rounds * train_tasks`` of
  the train split when ``fresh_tasks``, else ``train_tasks``); one instance is a task run ``train_repeats``
  times (episodes in repeat order, score their mean), so the notes can contrast two runs of a task as the ctxrl
  round's do. The minibatch is ``train_tasks`` instances: one ctxrl round's train episodes.
- **Validation instances** are the first ``dev_tasks`` dev tasks, one instance per (task, repeat): one episode
  each, so GEPA's metric-call count is exactly the episodes it ran (GEPA re-uses its valset every iteration; the
  ctxrl gate moves to fresh dev tasks each round).
- **Reflection** is the ctxrl pipeline: :meth:`SkillAdapter.make_reflective_dataset` builds the contrastive
  notes of :mod:`ctxrl.evolve.notes` from the minibatch's episodes (one record per note, its rendering and its
  data), and :meth:`SkillAdapter.propose_new_texts` hands them to the configured ctxrl proposer, asking for
  ``proposals`` rewrites as a ctxrl round does and validating each with
  :func:`ctxrl.evolve.proposal.read_proposal`. GEPA takes one child per iteration: the first valid rewrite it
  has not tried yet. A malformed rewrite is dropped (counted); when none is left the parent is kept, which this
  adapter says by proposing nothing (GEPA then spends no episodes on a child identical to its parent).
- **Budget.** ``max_metric_calls`` is :func:`planned_episodes` (what the ctxrl run with the config plans) or
  ``evolve.gepa_budget``. GEPA checks its budget only between iterations, so it can overrun by one
  iteration; :class:`EpisodeBudget` stops it before an iteration that could (worst case: parent and child on a
  minibatch, then the child on the validation set), so an uninterrupted run never exceeds the budget and may
  leave less than one iteration of it unspent.
- **The end** is :meth:`ctxrl.evolve.loop.EvolveLoop.final_test` with GEPA's best candidate (highest mean
  validation score; the seed on a tie) as ``final``: the same test tasks and the same JSON keys as a ctxrl run.

Files in the run folder: ``gepa/`` (GEPA's own run_dir: ``gepa_state.bin``, ``run_log.txt``; a rerun in the same
folder resumes from its state), ``lineage.sqlite`` (the seed skill and the graded test episodes),
``best_skill/SKILL.md`` (GEPA's best candidate, as its proposer wrote it; the seed if none beat it) and
``evolve.json`` (``"optimizer": "gepa"``, the episodes spent, the candidates, the test comparison).

**Resume caveat** (gepa 0.1.4): a resumed GEPA evaluates the seed on the validation set again before it loads
its state, and the iteration in flight at a kill is run again; this adapter counts those episodes
(``episodes_run``, kept in GEPA's state) so the budget still bounds them, except the episodes of a killed
process after GEPA's last state save.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any, cast

from ctxrl.env.tasks.base import Task
from ctxrl.evolve.config import EvolveConfig
from ctxrl.evolve.lineage import BEST, write_atomic
from ctxrl.evolve.loop import STOP_FILE, SUMMARY_FILE, EvolveError, EvolveLoop, Runner, split_tasks
from ctxrl.evolve.notes import ContrastNote, RunDigest, StepDigest, build_notes, known_steps
from ctxrl.evolve.proposal import read_proposal
from ctxrl.evolve.proposers import Proposer
from ctxrl.evolve.skill import Dropped, Skill, parse_skill
from ctxrl.train.trajectory import EpisodeRecord, skill_id

COMPONENT = "skill"
"""The one text component GEPA evolves: the skill body."""
GEPA_DIR = "gepa"
"""GEPA's own run_dir inside the run folder."""
PERFECT_SCORE = 1.0
"""The graded score of a solved episode (scores are in [0, 1])."""


def planned_episodes(config: EvolveConfig) -> int:
    """The train and dev episodes the ctxrl loop with ``config`` plans (before the gate's early stops save
    some): ``rounds * (train_tasks * train_repeats + (proposals + 1) * dev_tasks * repeats)``."""
    per_round = (
        config.train_tasks * config.train_repeats + (config.proposals + 1) * config.dev_tasks * config.repeats
    )
    return config.rounds * per_round


def gepa_budget(config: EvolveConfig) -> int:
    """GEPA's episode budget: ``evolve.gepa_budget``, or :func:`planned_episodes`."""
    return config.gepa_budget if config.gepa_budget is not None else planned_episodes(config)


@dataclass(frozen=True)
class Instance:
    """One GEPA data instance: a task and the repeats one evaluation runs of it (its score: their mean)."""

    task: Task
    repeats: tuple[int, ...]


def train_instances(config: EvolveConfig, families: Sequence[str], difficulty: str) -> list[Instance]:
    """The train tasks the ctxrl run would read over its rounds, each run ``train_repeats`` times."""
    n = config.train_tasks * (config.rounds if config.fresh_tasks else 1)
    reps = tuple(range(config.train_repeats))
    return [Instance(t, reps) for t in split_tasks(families, difficulty, "train", 0, n)]


def dev_instances(config: EvolveConfig, families: Sequence[str], difficulty: str) -> list[Instance]:
    """The first ``dev_tasks`` dev tasks, one instance (one episode) per task and repeat."""
    tasks = split_tasks(families, difficulty, "dev", 0, config.dev_tasks)
    return [Instance(t, (r,)) for r in range(config.repeats) for t in tasks]


# ------------------------------------------------------------------------------ notes as JSON records


def note_record(note: ContrastNote) -> dict[str, Any]:
    """A contrastive note as a reflective-dataset record: GEPA's recommended keys (``Inputs``, ``Generated
    Outputs``, ``Feedback``: the note as the proposer reads it) and ``note``, its data (JSON-serialisable)."""
    return {
        "Inputs": {"task": note.task_id, "family": note.family},
        "Generated Outputs": f"run A: {note.better.end_reason}; run B: {note.worse.end_reason}",
        "Feedback": note.render(),
        "note": asdict(note),
    }


def _run(data: Mapping[str, Any]) -> RunDigest:
    steps = tuple(
        StepDigest(
            index=int(s["index"]),
            context_tokens=int(s["context_tokens"]),
            calls=tuple(s["calls"]),
            edit=bool(s["edit"]),
            receipts=tuple(s["receipts"]),
            nudges=tuple(s["nudges"]),
        )
        for s in data["steps"]
    )
    return RunDigest(**{**data, "steps": steps})


def note_from_record(record: Mapping[str, Any]) -> ContrastNote:
    """The note of a :func:`note_record` record (equal to the one it was made from)."""
    data = record["note"]
    return ContrastNote(
        label=data["label"],
        task_id=data["task_id"],
        family=data["family"],
        kind=data["kind"],
        better=_run(data["better"]),
        worse=_run(data["worse"]),
    )


# ------------------------------------------------------------------------------ the adapter


@dataclass
class EvaluationResult:
    """What :meth:`SkillAdapter.evaluate` returns: the fields of ``gepa.EvaluationBatch`` (converted there)."""

    outputs: list[dict[str, Any]]
    scores: list[float]
    trajectories: list[list[EpisodeRecord]] | None
    num_metric_calls: int


@dataclass
class SkillAdapter:
    """A GEPA adapter (``evaluate``, ``make_reflective_dataset``, ``propose_new_texts``) over a ctxrl
    :class:`~ctxrl.evolve.loop.Runner` and :class:`~ctxrl.evolve.proposers.Proposer` (see the module docstring).

    Counters (kept in GEPA's state through ``get_adapter_state``/``set_adapter_state``): ``episodes`` run,
    proposer ``calls``, rewrites ``returned`` by the proposer, ``dropped`` by validation, ``duplicates`` (valid
    but tried before), ``proposed`` (handed to GEPA as a child), ``unused`` (valid rewrites after the one taken).
    """

    runner: Runner
    proposer: Proposer
    seed: Skill
    config: EvolveConfig
    log: Callable[[str], None] = print
    episodes: int = 0
    calls: int = 0
    returned: int = 0
    dropped: int = 0
    duplicates: int = 0
    proposed: int = 0
    unused: int = 0
    skills: dict[str, str] = field(default_factory=dict)
    """Skill id -> skill file (frontmatter + body) of every text GEPA was given, the seed included."""
    drop_reasons: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.skills.setdefault(self.seed.id, self.seed.to_markdown())

    # -------------------------------------------------------------- GEPA's protocol

    def evaluate(self, batch: list[Instance], candidate: dict[str, str], capture_traces: bool = False) -> Any:
        """Run ``candidate``'s skill on every instance (one runner batch per repeat, in repeat order), score
        each instance with the mean graded score of its episodes; trajectories (the episodes, in repeat order)
        when ``capture_traces``."""
        from gepa import EvaluationBatch

        res = self.run(batch, candidate[COMPONENT])
        return EvaluationBatch(
            outputs=res.outputs,
            scores=res.scores,
            trajectories=res.trajectories if capture_traces else None,
            num_metric_calls=res.num_metric_calls,
        )

    def make_reflective_dataset(
        self, candidate: dict[str, str], eval_batch: Any, components_to_update: list[str]
    ) -> dict[str, list[dict[str, Any]]]:
        """The contrastive notes (:func:`ctxrl.evolve.notes.build_notes`, at most ``max_notes``) of the
        evaluated episodes, one :func:`note_record` each, for every component asked (only ``skill`` exists)."""
        episodes = [ep for runs in eval_batch.trajectories or [] for ep in runs]
        notes = build_notes(episodes, max_notes=self.config.max_notes)
        return {name: [note_record(n) for n in notes] for name in components_to_update}

    def propose_new_texts(
        self,
        candidate: dict[str, str],
        reflective_dataset: Mapping[str, Sequence[Mapping[str, Any]]],
        components_to_update: list[str],
    ) -> dict[str, str]:
        """One rewrite of the candidate's skill by the ctxrl proposer from the notes in the dataset: the first
        of its ``proposals`` rewrites that validates and was not tried before; ``{}`` (the parent is kept) when
        there are no notes or no such rewrite."""
        if COMPONENT not in components_to_update:
            return {}
        records = reflective_dataset.get(COMPONENT, [])
        if not records:
            return {}
        notes = [note_from_record(r) for r in records]
        self.calls += 1
        round = self.calls
        body = candidate[COMPONENT].strip()
        parent = Skill(body=body, mode=self.seed.mode, parent=None, round=0)
        texts = self.proposer.propose(parent, notes, self.config.proposals, round=round)[
            : self.config.proposals
        ]
        self.returned += len(texts)
        steps = known_steps(notes)
        for i, text in enumerate(texts):
            out = read_proposal(
                text, parent=parent, round=round, known_steps=steps, max_chars=self.config.max_chars
            )
            if isinstance(out, Dropped):
                self.dropped += 1
                self.drop_reasons.append(out.reason)
                continue
            if out.id in self.skills:
                self.duplicates += 1
                continue
            self.skills[out.id] = out.to_markdown()
            self.proposed += 1
            self.unused += len(texts) - i - 1
            self.log(f"gepa proposal {round}: {out.id} from {parent.id} ({out.predicts[:80]})")
            return {COMPONENT: out.body}
        self.log(f"gepa proposal {round}: no new valid rewrite of {parent.id} ({len(texts)} returned)")
        return {}

    def get_adapter_state(self) -> dict[str, Any]:
        return {
            "episodes": self.episodes,
            "calls": self.calls,
            "returned": self.returned,
            "dropped": self.dropped,
            "duplicates": self.duplicates,
            "proposed": self.proposed,
            "unused": self.unused,
            "skills": dict(self.skills),
            "drop_reasons": list(self.drop_reasons),
        }

    def set_adapter_state(self, state: dict[str, Any]) -> None:
        """Restore the counters of a resumed run; the episodes this process ran before (GEPA re-evaluates the
        seed before it loads its state) are added, not lost."""
        if not state:
            return
        self.episodes += int(state["episodes"])
        for name in ("calls", "returned", "dropped", "duplicates", "proposed", "unused"):
            setattr(self, name, int(state[name]))
        self.skills = {**state["skills"], **self.skills}
        self.drop_reasons = list(state["drop_reasons"])

    # -------------------------------------------------------------- episodes

    def run(self, batch: Sequence[Instance], body: str) -> EvaluationResult:
        """Grade ``body`` on ``batch`` through the runner; every instance's episodes in repeat order."""
        by_repeat: dict[int, list[int]] = {}
        for i, inst in enumerate(batch):
            for rep in inst.repeats:
                by_repeat.setdefault(rep, []).append(i)
        runs: list[list[EpisodeRecord]] = [[] for _ in batch]
        want = skill_id(body)
        for rep in sorted(by_repeat):
            idx = by_repeat[rep]
            tasks = [batch[i].task for i in idx]
            records = self.runner(tasks, [body] * len(tasks), rep)
            if len(records) != len(tasks):
                raise EvolveError(f"the runner returned {len(records)} episodes for a batch of {len(tasks)}")
            for i, task, record in zip(idx, tasks, records):
                if record.task_id != task.task_id or record.skill_id != want:
                    raise EvolveError(
                        f"the runner returned task {record.task_id} (skill {record.skill_id}) for "
                        f"{task.task_id} (skill {want})"
                    )
                runs[i].append(record)
            self.episodes += len(records)
        outputs: list[dict[str, Any]] = [
            {
                "task": inst.task.task_id,
                "repeats": list(inst.repeats),
                "success": fmean(float(e.success) for e in eps),
                "score": fmean(e.score for e in eps),
                "cost_tokens": fmean(e.cost_tokens for e in eps),
            }
            for inst, eps in zip(batch, runs)
        ]
        return EvaluationResult(
            outputs=outputs,
            scores=[o["score"] for o in outputs],
            trajectories=runs,
            num_metric_calls=sum(len(eps) for eps in runs),
        )

    def skill(self, body: str) -> Skill:
        """The skill GEPA was given as ``body`` (the seed or a validated proposal), with its frontmatter."""
        return parse_skill(self.skills[skill_id(body.strip())])


@dataclass
class EpisodeBudget:
    """A GEPA stop condition: stop before an iteration that could take the episodes past ``budget``
    (``worst``: the most one iteration can run)."""

    adapter: SkillAdapter
    budget: int
    worst: int

    def __call__(self, gepa_state: Any) -> bool:
        return self.adapter.episodes + self.worst > self.budget


def iteration_worst_case(config: EvolveConfig, n_train: int, n_val: int) -> int:
    """The most episodes one GEPA iteration runs: the parent and the child on a minibatch of
    ``min(train_tasks, n_train)`` train instances (``train_repeats`` episodes each), then the child on the
    ``n_val`` validation episodes."""
    return 2 * min(config.train_tasks, n_train) * config.train_repeats + n_val


def check_budget(config: EvolveConfig) -> tuple[int, int]:
    """GEPA's budget and the most one of its iterations runs, or :class:`~ctxrl.evolve.loop.EvolveError` when
    the budget cannot pay for the seed's dev episodes and one iteration."""
    n_train = config.train_tasks * (config.rounds if config.fresh_tasks else 1)
    n_val = config.dev_tasks * config.repeats
    budget, worst = gepa_budget(config), iteration_worst_case(config, n_train, n_val)
    if budget < n_val + worst:
        raise EvolveError(
            f"the GEPA budget of {budget} episodes is less than the seed's {n_val} dev episodes plus one "
            f"iteration ({worst}: 2 x {min(config.train_tasks, n_train)} train tasks x {config.train_repeats} "
            f"repeats + {n_val} dev episodes); raise evolve.gepa_budget"
        )
    return budget, worst


def require_gepa() -> Any:
    """The ``gepa`` module, or :class:`~ctxrl.evolve.loop.EvolveError` saying how to install it."""
    try:
        import gepa
    except ImportError:
        raise EvolveError(
            "--optimizer gepa needs the gepa package (a ctxrl dependency): pip install gepa==0.1.4"
        ) from None
    return gepa


# ------------------------------------------------------------------------------ the run


def run_gepa(
    run_dir: str | Path,
    config: EvolveConfig,
    *,
    mode: str,
    families: Sequence[str],
    difficulty: str,
    runner: Runner,
    proposer: Proposer,
    seed: Skill | None = None,
    engine_seed: int = 0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run (or resume, from ``run_dir/gepa``) GEPA on the skill, then the test comparison of its best
    candidate with the seed; return the summary (also ``evolve.json``; see the module docstring)."""
    gepa = require_gepa()
    run_dir = Path(run_dir)
    budget, worst = check_budget(config)
    trainset = train_instances(config, families, difficulty)
    valset = dev_instances(config, families, difficulty)
    # made before the lineage, so a run killed before GEPA's first save is still known as a GEPA run
    (run_dir / GEPA_DIR).mkdir(parents=True, exist_ok=True)
    loop = EvolveLoop(
        run_dir, config, mode=mode, families=families, difficulty=difficulty, runner=runner,
        proposer=proposer, seed=seed, log=log,
    )  # fmt: skip
    try:
        seed_skill = loop.lineage.seed()
        adapter = SkillAdapter(runner, proposer, seed=seed_skill, config=config, log=log)
        result: Any = gepa.optimize(
            seed_candidate={COMPONENT: seed_skill.body},
            trainset=trainset,
            valset=valset,
            # gepa's protocol declares propose_new_texts as an optional attribute, which mypy does not match
            # with a method; gepa itself only checks that it is there and not None
            adapter=cast(Any, adapter),
            candidate_selection_strategy="pareto",
            # the ctxrl loop proposes from all-success tasks too (cost notes): so does GEPA here
            skip_perfect_score=False,
            perfect_score=PERFECT_SCORE,
            reflection_minibatch_size=min(config.train_tasks, len(trainset)),
            max_metric_calls=budget,
            # the ctxrl run's STOP file ends GEPA too, between iterations (as does gepa's own gepa/gepa.stop)
            stop_callbacks=[
                EpisodeBudget(adapter, budget, worst),
                gepa.FileStopper(str(run_dir / STOP_FILE)),
            ],
            run_dir=str(run_dir / GEPA_DIR),
            track_best_outputs=False,
            seed=engine_seed,
            raise_on_exception=True,
        )
        best = adapter.skill(result.candidates[result.best_idx][COMPONENT])
        log(
            f"gepa: {adapter.episodes} of {budget} episodes; {len(result.candidates) - 1} candidates kept of "
            f"{adapter.proposed} proposed; best {best.id} (dev score "
            f"{result.val_aggregate_scores[result.best_idx]:.3f}, seed {result.val_aggregate_scores[0]:.3f})"
        )
        final = loop.final_test(final=best)
        write_atomic(run_dir / BEST, best.to_markdown())
        summary = {
            "optimizer": "gepa",
            "stopped": (run_dir / STOP_FILE).exists() or (run_dir / GEPA_DIR / "gepa.stop").exists(),
            "gepa_version": _version(),
            "budget": budget,
            "episodes_planned_by_ctxrl": planned_episodes(config),
            "episodes_run": adapter.episodes,
            "metric_calls": result.total_metric_calls,
            "iteration_worst_case": worst,
            "train_instances": len(trainset),
            "dev_episodes_per_candidate": len(valset),
            "seed": seed_skill.id,
            "incumbent": best.id,
            "candidates": [
                {
                    "skill": skill_id(c[COMPONENT]),
                    "parents": [None if p is None else skill_id(result.candidates[p][COMPONENT]) for p in ps],
                    "dev_score": score,
                    "found_at_episode": found,
                }
                for c, ps, score, found in zip(
                    result.candidates,
                    result.parents,
                    result.val_aggregate_scores,
                    result.discovery_eval_counts,
                )
            ],
            "proposer": {
                "calls": adapter.calls,
                "returned": adapter.returned,
                "dropped": adapter.dropped,
                "drop_reasons": adapter.drop_reasons,
                "duplicates": adapter.duplicates,
                "unused": adapter.unused,
                "proposed": adapter.proposed,
            },
            "accepted": len(result.candidates) - 1,
            "test": final,
        }
        write_atomic(run_dir / SUMMARY_FILE, json.dumps(summary, indent=1, sort_keys=True) + "\n")
        return summary
    finally:
        loop.close()


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gepa")
    except PackageNotFoundError:
        return None
