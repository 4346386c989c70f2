"""The GEPA baseline (``ctxrl evolve --optimizer gepa``): the adapter's scores against hand-known episodes, the
ctxrl notes and proposer behind GEPA's reflection, the episode budget, and a run end to end on a CPU."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ctxrl.cli import main
from ctxrl.env.skills import compact_percent
from ctxrl.env.tasks.base import Task
from ctxrl.evolve.config import EvolveConfig
from ctxrl.evolve.gepa_adapter import (
    COMPONENT,
    Instance,
    SkillAdapter,
    gepa_budget,
    iteration_worst_case,
    note_from_record,
    note_record,
    planned_episodes,
    run_gepa,
)
from ctxrl.evolve.lineage import BEST
from ctxrl.evolve.loop import EvolveError, split_tasks
from ctxrl.evolve.notes import build_notes
from ctxrl.evolve.proposers import OfflineProposer
from ctxrl.evolve.skill import Skill, parse_skill
from ctxrl.train.trajectory import EpisodeRecord, StepCost, StepRecord, skill_id

ROOT = Path(__file__).parents[2]
SEED_FILE = ROOT / "configs" / "skills" / "file_compact90.md"
SEED = parse_skill(SEED_FILE.read_text())
FAMILIES = ("retention", "board")
URGENT = "[context] URGENT: 100 tokens left before the limit of 2000; the next large output may overflow."
TEST_KEYS = {"tasks", "repeats", "seed", "final", "d_score"}
ARM_KEYS = {"skill", "success", "success_se", "score", "cost_tokens"}


def _step(ctx: int, nudges: list[str]) -> StepRecord:
    return StepRecord(
        prompt_ids=[], token_ids=[], logprobs=[], edit_mask=[], finish_reason="stop", num_cached_tokens=0,
        prompt_source="extend", rebuild_reason=None, text="", tool_calls=["run"], edit_calls=[], receipts=[],
        receipt_kinds=[], readout="", nudges=nudges, context_tokens=ctx, edited=False, free_turn=False,
        cost=StepCost(ctx, 0, 10, None),
    )  # fmt: skip


def _record(task: Task, body: str, repeat: int, ok: bool, score: float, cost: float) -> EpisodeRecord:
    steps = [_step(800, []), _step(900 if ok else 1900, [] if ok else [URGENT])]
    return EpisodeRecord(
        task_id=task.task_id, family=task.family, split=task.split, seed=task.seed, difficulty=task.difficulty,
        mode="file", skill_id=skill_id(body), group=0, index=repeat, engine="fake", success=ok, score=score,
        reward=float(ok), end_reason="submit" if ok else "overflow", answer=None, verdict="", cost_tokens=cost,
        cost_flops=None, steps=steps,
    )  # fmt: skip


class TableRunner:
    """Episodes read from a table (task index, repeat) -> (success, score, cost); records every batch."""

    def __init__(
        self, tasks: Sequence[Task], table: dict[tuple[int, int], tuple[bool, float, float]]
    ) -> None:
        self.index = {t.task_id: i for i, t in enumerate(tasks)}
        self.table = table
        self.batches: list[tuple[int, list[str], list[str]]] = []

    def __call__(self, tasks: Sequence[Task], skills: Sequence[str], repeat: int) -> list[EpisodeRecord]:
        self.batches.append((repeat, [t.task_id for t in tasks], list(skills)))
        out = []
        for task, body in zip(tasks, skills):
            ok, score, cost = self.table[(self.index[task.task_id], repeat)]
            out.append(_record(task, body, repeat, ok, score, cost))
        return out


def _adapter(runner: Any, proposer: Any = None, **config: Any) -> SkillAdapter:
    cfg = EvolveConfig(**{"proposals": 2, **config})
    return SkillAdapter(runner, proposer or OfflineProposer(), seed=SEED, config=cfg, log=lambda _: None)


TRAIN = split_tasks(FAMILIES, "easy", "train", 0, 2)
TABLE = {
    (0, 0): (True, 1.0, 100.0),
    (0, 1): (False, 0.5, 300.0),
    (1, 0): (False, 0.0, 200.0),
    (1, 1): (False, 0.25, 400.0),
}


def test_evaluate_scores_each_instance_with_the_mean_graded_score_of_its_episodes() -> None:
    runner = TableRunner(TRAIN, TABLE)
    adapter = _adapter(runner)
    t0, t1 = TRAIN
    res = adapter.evaluate([Instance(t0, (0, 1)), Instance(t1, (0, 1))], {COMPONENT: SEED.body})
    assert res.scores == [0.75, 0.125]  # (1.0 + 0.5) / 2, (0.0 + 0.25) / 2
    assert [o["cost_tokens"] for o in res.outputs] == [200.0, 300.0]
    assert [o["success"] for o in res.outputs] == [0.5, 0.0]
    assert res.trajectories is None and res.num_metric_calls == 4 and adapter.episodes == 4
    # one runner batch per repeat, in repeat order, every episode with the candidate's skill
    assert runner.batches == [
        (0, [t0.task_id, t1.task_id], [SEED.body] * 2),
        (1, [t0.task_id, t1.task_id], [SEED.body] * 2),
    ]
    # dev instances: one episode each; traces on request, in repeat order
    res = adapter.evaluate(
        [Instance(t0, (1,)), Instance(t1, (0,))], {COMPONENT: SEED.body}, capture_traces=True
    )
    assert res.scores == [0.5, 0.0] and res.num_metric_calls == 2 and adapter.episodes == 6
    assert runner.batches[2:] == [(0, [t1.task_id], [SEED.body]), (1, [t0.task_id], [SEED.body])]
    assert res.trajectories is not None
    assert [[(e.task_id, e.index) for e in runs] for runs in res.trajectories] == [
        [(t0.task_id, 1)],
        [(t1.task_id, 0)],
    ]


def test_a_runner_that_returns_another_task_is_an_error() -> None:
    class Wrong(TableRunner):
        def __call__(self, tasks: Sequence[Task], skills: Sequence[str], repeat: int) -> list[EpisodeRecord]:
            return super().__call__(list(reversed(tasks)), skills, repeat)

    adapter = _adapter(Wrong(TRAIN, TABLE))
    with pytest.raises(EvolveError, match="the runner returned task"):
        adapter.evaluate([Instance(t, (0,)) for t in TRAIN], {COMPONENT: SEED.body})


def test_reflection_is_the_ctxrl_notes_and_the_ctxrl_proposer() -> None:
    adapter = _adapter(TableRunner(TRAIN, TABLE))
    batch = [Instance(t, (0, 1)) for t in TRAIN]
    res = adapter.evaluate(batch, {COMPONENT: SEED.body}, capture_traces=True)
    data = adapter.make_reflective_dataset({COMPONENT: SEED.body}, res, [COMPONENT])
    episodes = [e for runs in res.trajectories for e in runs]
    notes = build_notes(episodes)
    # task 0 contrasts (a success and a failure); task 1 failed twice: one note, as the ctxrl round builds it
    assert len(notes) == 1 and notes[0].task_id == TRAIN[0].task_id
    assert data == {COMPONENT: [note_record(notes[0])]}
    assert data[COMPONENT][0]["Feedback"] == notes[0].render()
    assert note_from_record(json.loads(json.dumps(data[COMPONENT][0]))) == notes[0]
    json.dumps(data)  # GEPA stores the dataset as JSON
    # the offline proposer lowers the 90 % threshold by 10, then 20 points (proposals=2); GEPA takes one new
    # valid rewrite per call
    first = adapter.propose_new_texts({COMPONENT: SEED.body}, data, [COMPONENT])
    assert compact_percent(first[COMPONENT]) == 80 and adapter.proposed == 1 and adapter.unused == 1
    second = adapter.propose_new_texts({COMPONENT: SEED.body}, data, [COMPONENT])
    assert compact_percent(second[COMPONENT]) == 70 and adapter.duplicates == 1
    assert adapter.propose_new_texts({COMPONENT: SEED.body}, data, [COMPONENT]) == {}
    assert adapter.duplicates == 3 and adapter.calls == 3 and adapter.dropped == 0
    kept = adapter.skill(first[COMPONENT])
    assert kept.parent == SEED.id and kept.targets and kept.predicts.startswith("threshold 90% -> 80%")
    assert adapter.skill(SEED.body) == SEED
    # no notes: the proposer is not asked
    assert adapter.propose_new_texts({COMPONENT: SEED.body}, {COMPONENT: []}, [COMPONENT]) == {}
    assert adapter.calls == 3


def test_a_malformed_rewrite_is_dropped_and_the_parent_kept() -> None:
    class Bad:
        def propose(self, incumbent: Skill, notes: Any, n: int, *, round: int) -> list[str]:
            return ["Compact when the context reaches 50% of the limit."] * n

    adapter = _adapter(TableRunner(TRAIN, TABLE), Bad())
    res = adapter.evaluate([Instance(t, (0, 1)) for t in TRAIN], {COMPONENT: SEED.body}, capture_traces=True)
    data = adapter.make_reflective_dataset({COMPONENT: SEED.body}, res, [COMPONENT])
    assert adapter.propose_new_texts({COMPONENT: SEED.body}, data, [COMPONENT]) == {}
    assert adapter.dropped == 2 and adapter.proposed == 0
    assert adapter.drop_reasons[0].startswith("malformed: not a JSON object or skill document")


def test_the_budget_is_what_the_ctxrl_run_plans_unless_overridden() -> None:
    cfg = EvolveConfig(rounds=3, proposals=3, train_tasks=8, train_repeats=2, dev_tasks=20, repeats=1)
    assert planned_episodes(cfg) == 3 * (8 * 2 + 4 * 20) == 288 == gepa_budget(cfg)
    assert gepa_budget(EvolveConfig(gepa_budget=50)) == 50
    assert iteration_worst_case(cfg, n_train=24, n_val=20) == 2 * 8 * 2 + 20
    assert iteration_worst_case(cfg, n_train=3, n_val=20) == 2 * 3 * 2 + 20


class ThresholdRunner:
    """Success likelier the nearer the skill's threshold is to 60 %, drawn from (task, repeat) alone (common
    random numbers); failures hit the limit (urgent nudges), so the offline proposer lowers the threshold."""

    def __init__(self) -> None:
        self.episodes: list[tuple[str, str, int]] = []

    def __call__(self, tasks: Sequence[Task], skills: Sequence[str], repeat: int) -> list[EpisodeRecord]:
        out = []
        for task, body in zip(tasks, skills):
            self.episodes.append((task.split, skill_id(body), repeat))
            percent = compact_percent(body) or 60
            p = max(0.05, 0.95 - abs(percent - 60) / 40)
            u = (
                int.from_bytes(hashlib.sha256(f"{task.task_id}:{repeat}".encode()).digest()[:8], "big")
                / 2**64
            )
            ok = u < p
            out.append(_record(task, body, repeat, ok, float(ok), 1000.0 + 10 * percent))
        return out


def test_run_gepa_keeps_to_the_budget_and_compares_on_the_test_split(tmp_path: Path) -> None:
    cfg = EvolveConfig(
        rounds=2, proposals=2, train_tasks=2, train_repeats=2, dev_tasks=4, repeats=1, test_tasks=3
    )
    # budget 2 x (2 x 2 + 3 x 4) = 32; one iteration at most 2 x 2 x 2 + 4 = 12; the seed's dev episodes 4
    runner = ThresholdRunner()
    summary = run_gepa(
        tmp_path, cfg, mode="file", families=FAMILIES, difficulty="easy", runner=runner,
        proposer=OfflineProposer(), seed=SEED, log=lambda _: None,
    )  # fmt: skip
    spent = [e for e in runner.episodes if e[0] != "test"]
    assert summary["budget"] == 32 and summary["optimizer"] == "gepa"
    assert summary["episodes_run"] == len(spent) == summary["metric_calls"]
    assert 4 + 4 <= len(spent) <= 32  # the seed's dev episodes and at least one parent minibatch
    assert {e[0] for e in spent} == {"train", "dev"}
    # the test comparison: the same keys as a ctxrl run, 3 tasks for each of seed and best
    test = summary["test"]
    assert set(test) == TEST_KEYS and set(test["seed"]) == ARM_KEYS == set(test["final"])
    assert test["seed"]["skill"] == SEED.id and test["final"]["skill"] == summary["incumbent"]
    n_test = sum(e[0] == "test" for e in runner.episodes)
    assert n_test == (3 if summary["incumbent"] == SEED.id else 6)
    best = parse_skill((tmp_path / BEST).read_text())
    assert best.id == summary["incumbent"]
    assert best.id in {c["skill"] for c in summary["candidates"]}
    assert best == SEED or (best.parent is not None and compact_percent(best.body) in (80, 70, 60, 50))
    assert json.loads((tmp_path / "evolve.json").read_text()) == json.loads(json.dumps(summary))
    assert (tmp_path / "gepa" / "gepa_state.bin").exists()
    # a rerun resumes GEPA from its state: the budget is spent, so only GEPA's re-evaluation of the seed on
    # the dev set (gepa 0.1.4 does it before loading its state) runs, and is counted; the test is recorded
    again = ThresholdRunner()
    resumed = run_gepa(
        tmp_path, cfg, mode="file", families=FAMILIES, difficulty="easy", runner=again,
        proposer=OfflineProposer(), seed=SEED, log=lambda _: None,
    )  # fmt: skip
    assert len(again.episodes) == 4 and {e[0] for e in again.episodes} == {"dev"}
    assert resumed["episodes_run"] == summary["episodes_run"] + 4
    assert resumed["incumbent"] == summary["incumbent"] and resumed["test"] == summary["test"]


def test_a_budget_below_one_iteration_is_a_clear_error(tmp_path: Path) -> None:
    cfg = EvolveConfig(train_tasks=2, dev_tasks=4, gepa_budget=15)  # needs 4 + 2 x 2 x 2 + 4 = 16
    with pytest.raises(EvolveError, match="budget of 15 episodes is less than"):
        run_gepa(
            tmp_path, cfg, mode="file", families=FAMILIES, difficulty="easy", runner=ThresholdRunner(),
            proposer=OfflineProposer(), log=lambda _: None,
        )  # fmt: skip


# ------------------------------------------------------------------------------ the command, end to end


def _args(out: Path, *extra: str) -> list[str]:
    return [
        "evolve", "--config", str(ROOT / "configs" / "evolve_tiny.yaml"), "--out", str(out),
        f"evolve.seed_skill={SEED_FILE}", "tasks.families=[board,retention]", "evolve.rounds=2",
        "evolve.train_tasks=2", "evolve.dev_tasks=2", "evolve.test_tasks=1", "evolve.proposals=2", *extra,
    ]  # fmt: skip


@pytest.mark.slow
def test_cli_gepa_end_to_end_with_the_scripted_skill_reading_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ctxrl.evolve.loop import RolloutRunner

    ran: list[tuple[str, str]] = []
    real = RolloutRunner.__call__

    def counting(self: RolloutRunner, tasks: Sequence[Task], skills: Sequence[str], repeat: int) -> Any:
        records = real(self, tasks, skills, repeat)
        ran.extend((r.split, r.skill_id) for r in records)
        return records

    monkeypatch.setattr(RolloutRunner, "__call__", counting)
    out = tmp_path / "run"
    assert main([*_args(out), "--optimizer", "gepa"]) == 0
    summary = json.loads((out / "evolve.json").read_text())
    spent = [r for r in ran if r[0] != "test"]
    # budget: 2 rounds x (2 train tasks x 2 repeats + 3 skills x 2 dev tasks) = 20 episodes
    assert summary["budget"] == 20 and summary["optimizer"] == "gepa"
    assert summary["episodes_run"] == len(spent) <= 20
    assert len(spent) >= 2 + 4  # the seed on 2 dev tasks, then a parent on a minibatch of 2 tasks x 2
    test = summary["test"]
    assert set(test) == TEST_KEYS and set(test["seed"]) == ARM_KEYS == set(test["final"])
    skills_tested = {s for split, s in ran if split == "test"}
    assert skills_tested == {test["seed"]["skill"], test["final"]["skill"]}
    best = parse_skill((out / BEST).read_text())
    assert best.id == summary["incumbent"] == test["final"]["skill"]
    proposed = {c["skill"] for c in summary["candidates"]}
    assert best.id in proposed and SEED.id in proposed
    assert best == SEED or best.parent is not None
    assert (out / "gepa" / "gepa_state.bin").exists() and (out / "config.yaml").exists()
    # --resume continues it from GEPA's state: the budget is spent, so only GEPA's re-evaluation of the seed on
    # the 2 dev tasks runs (counted); the test episodes are recorded already. A ctxrl resume of it is refused.
    ran.clear()
    assert main([*_args(out), "--resume", "--optimizer", "gepa"]) == 0
    again = json.loads((out / "evolve.json").read_text())
    assert [split for split, _ in ran] == ["dev", "dev"]
    assert again["episodes_run"] == summary["episodes_run"] + 2 and again["test"] == summary["test"]
    capsys.readouterr()
    assert "is a run of --optimizer gepa, not ctxrl" in _fails([*_args(out), "--resume"], capsys)


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


def test_options_that_do_not_apply_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _fails([*_args(tmp_path / "a", "evolve.gate.alpha=0.5"), "--optimizer", "gepa"], capsys)
    assert "evolve.gate applies to --optimizer ctxrl only" in err
    err = _fails(_args(tmp_path / "b", "evolve.gepa_budget=30"), capsys)
    assert "evolve.gepa_budget applies to --optimizer gepa only" in err
    err = _fails([*_args(tmp_path / "c", "evolve.gepa_budget=5"), "--optimizer", "gepa"], capsys)
    assert "GEPA budget of 5 episodes is less than" in err
    # a ctxrl run folder is not resumed as a GEPA run
    from ctxrl.commands.common import save_config
    from ctxrl.commands.config import load_run_config
    from ctxrl.evolve.lineage import Lineage

    run = tmp_path / "d"
    Lineage.open(run, mode="file").close()
    save_config(load_run_config(ROOT / "configs" / "evolve_tiny.yaml", _args(run)[5:]), run)
    err = _fails(["evolve", "--out", str(run), "--resume", "--optimizer", "gepa"], capsys)
    assert "is a run of --optimizer ctxrl, not gepa" in err


def test_a_missing_gepa_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from ctxrl.evolve.gepa_adapter import require_gepa

    monkeypatch.setitem(sys.modules, "gepa", None)  # what an import of an absent package raises: ImportError
    with pytest.raises(EvolveError, match=r"needs the gepa package .*pip install gepa==0.1.4"):
        require_gepa()
