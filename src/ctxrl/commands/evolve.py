"""``ctxrl evolve``: overnight skill evolution, resumable (see :mod:`ctxrl.evolve.loop` for one round).

    ctxrl evolve --config configs/evolve_tiny.yaml --out runs/evolve            # a new run (empty --out)
    ctxrl evolve --config configs/evolve_tiny.yaml --out runs/evolve --resume   # continue it after a crash
    ctxrl evolve --out runs/evolve --resume evolve.rounds=6                      # extend it, stored config
    touch runs/evolve/STOP                                                      # end it after the current batch
    ctxrl evolve --config configs/evolve_tiny.yaml --out runs/evolve_gepa --optimizer gepa   # the GEPA baseline
    ctxrl evolve --config configs/evolve/overnight.yaml --out runs/night --hours 10 --resume  # a night

``--hours H`` ends the rounds H hours after the run's first start (kept in ``night.json``, so a restart after a
crash does not extend the night; a rerun with another H moves the end, still counted from that first start),
after the batch in flight, as a STOP file does; the test comparison then runs (``--optimizer ctxrl`` only).

Writes into ``--out``: ``lineage.sqlite`` (every skill, graded episode and gate decision), ``best_skill/SKILL.md``
(always the incumbent), ``config.yaml`` (the resolved run config), ``rounds/<r>/notes.md`` (what the proposer
read), ``report.md`` (rewritten after every round) and ``evolve.json`` (the summary with the test comparison).

``--resume`` continues the run in ``--out``; a folder that does not exist, or holds nothing of a run, is an
error naming it (a typo'd ``--out`` must not start a night). Start a run without ``--resume``;
``scripts/evolve_overnight.sh`` does so on its first try and resumes after. Without
``--config`` and overrides it uses the stored ``config.yaml``; with them, the config must equal the stored one
except ``evolve.rounds``, ``rollout.workers`` and the proposer's endpoint settings.

``--optimizer gepa`` runs the GEPA baseline instead (:mod:`ctxrl.evolve.gepa_adapter`): the same tasks, policy,
proposer and episode budget through the ``gepa`` package, the same test comparison; ``evolve.gate`` does not
apply to it and ``evolve.gepa_budget`` applies only to it. Its run folder holds ``gepa/`` (GEPA's state) and a
run is resumed with ``--resume --optimizer gepa``.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Any

from ctxrl.commands.common import (
    build_engine,
    prepare_out,
    resolve_model,
    resumed_run_config,
    run_config,
    save_config,
)
from ctxrl.commands.config import RunConfig
from ctxrl.errors import UsageError
from ctxrl.train.engines import engine_spec

RESUMABLE_CHANGES = (
    "evolve.rounds",
    "rollout.workers",
    "evolve.proposer_url",
    "evolve.proposer_timeout_s",
    "evolve.proposer_retries",
)
"""Keys a resumed run may change (a longer night, other workers, a moved endpoint); any other change would mix
two experiments in one lineage."""


def resume_config(args: argparse.Namespace, out: Path) -> RunConfig:
    """The config of a resumed run: the stored one, or the given one if it differs only in
    :data:`RESUMABLE_CHANGES`."""
    return resumed_run_config(args, out, RESUMABLE_CHANGES)


def run_evolve(args: argparse.Namespace) -> int:
    """Entry point of ``ctxrl evolve`` (see the module docstring)."""
    out: Path = args.out
    optimizer: str = getattr(args, "optimizer", "ctxrl")
    existing = (out / "lineage.sqlite").exists() and (out / "config.yaml").exists()
    if args.resume and existing:
        from ctxrl.evolve.gepa_adapter import GEPA_DIR

        found = "gepa" if (out / GEPA_DIR).is_dir() else "ctxrl"
        if found != optimizer:
            raise UsageError(f"--resume: {out} is a run of --optimizer {found}, not {optimizer}")
        config = resume_config(args, out)
    elif args.resume and not out.is_dir():
        raise UsageError(
            f"--resume: {out} does not exist; check --out, or start a new run there without --resume"
        )
    elif args.resume:
        # a run killed before its lineage store was made leaves only these; anything else is not ours
        names = {p.name for p in out.iterdir()}
        if not names & {"config.yaml", "night.json"} or names - {"config.yaml", "night.json", "workspaces"}:
            raise UsageError(f"--resume: {out} holds no evolution run (no lineage.sqlite and config.yaml)")
        config = run_config(args)
    else:
        config = run_config(args)
        prepare_out(out, overwrite=args.overwrite)
    hours = getattr(args, "hours", None)
    if hours is not None and optimizer != "ctxrl":
        raise UsageError("--hours bounds the ctxrl loop's rounds; GEPA's bound is its episode budget")
    deadline = None if hours is None else night_deadline(out, hours)
    evolve_command(config, out, optimizer=optimizer, deadline=deadline)
    return 0


def night_deadline(out: Path, hours: float) -> float:
    """The Unix time ``hours`` after the night's first start, recorded in ``out/night.json`` on first use."""
    import json
    import time

    from ctxrl.evolve.lineage import write_atomic

    if not hours > 0:
        raise UsageError(f"--hours must be > 0, got {hours}")
    path = out / "night.json"
    try:
        started = float(json.loads(path.read_text(encoding="utf-8"))["started"])
    except FileNotFoundError:
        started = time.time()
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"started": started}) + "\n")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path} is unreadable ({exc}); delete it to start the night's clock anew") from None
    return started + hours * 3600.0


def _check_optimizer(config: RunConfig, optimizer: str) -> None:
    from ctxrl.evolve.gate import CtxrlGate

    if optimizer not in ("ctxrl", "gepa"):
        raise UsageError(f"--optimizer must be ctxrl or gepa, not {optimizer!r}")
    if optimizer == "ctxrl" and config.evolve.gepa_budget is not None:
        raise UsageError("evolve.gepa_budget applies to --optimizer gepa only")
    if optimizer == "gepa" and config.evolve.gate != CtxrlGate():
        raise UsageError(
            "evolve.gate applies to --optimizer ctxrl only (GEPA keeps a child that beats its parent on a train "
            "minibatch); leave the evolve.gate settings at their defaults"
        )
    if optimizer == "gepa":
        from ctxrl.evolve.gepa_adapter import check_budget, require_gepa

        require_gepa()  # before an engine starts
        check_budget(config.evolve)


def _check(config: RunConfig) -> None:
    from ctxrl.env.policies import POLICY_MODES

    mode, engine = config.rollout.mode, config.engine
    if engine_spec(engine.name).needs_policy:
        if engine.policy is None:
            raise UsageError(
                "engine.policy: evolution needs a policy that acts on the skill; give a scripted reference policy "
                f"({', '.join(POLICY_MODES)}) or MODULE:FUNCTION"
            )
        if engine.policy in POLICY_MODES and POLICY_MODES[engine.policy] != mode:
            raise UsageError(
                f"engine.policy={engine.policy} acts in mode {POLICY_MODES[engine.policy]}, but rollout.mode={mode}"
            )
        if config.evolve.proposer == "self":
            raise UsageError(
                "evolve.proposer=self needs a model engine; a scripted policy cannot write skills"
            )
    elif config.evolve.policy_jitter:
        raise UsageError(
            "evolve.policy_jitter applies to the scripted engine only; a model samples by itself"
        )


def _seed_skill(config: RunConfig) -> Any:
    from ctxrl.evolve.skill import Skill, SkillFormatError, parse_skill

    path = config.evolve.seed_skill
    if path is None:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"evolve.seed_skill: cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"evolve.seed_skill: {path} is not UTF-8 text") from None
    if text.lstrip().startswith("---"):
        try:
            skill = parse_skill(text.lstrip())
        except SkillFormatError as exc:
            raise UsageError(f"evolve.seed_skill {path}: {exc}") from None
    else:
        skill = Skill(body=text.strip(), mode=config.rollout.mode, parent=None, round=0)
    if skill.mode != config.rollout.mode or skill.parent is not None or skill.round != 0 or not skill.body:
        raise UsageError(
            f"evolve.seed_skill {path}: a seed skill is of mode {config.rollout.mode}, parent none, round 0"
        )
    return skill


def _proposer(config: RunConfig, engine: Any, tokenizer: Any) -> Any:
    from ctxrl.evolve.proposers import ChatProposer, OfflineProposer, OpenAIProposer, engine_complete
    from ctxrl.train.engines import engine_spec
    from ctxrl.train.engines.base import SamplingConfig

    ev = config.evolve
    if ev.proposer == "offline":
        return OfflineProposer(ev.proposal_style)
    if ev.proposer == "openai":
        return OpenAIProposer.from_config(ev, api_key=os.environ.get(ev.proposer_api_key_env) or None)
    sampling = SamplingConfig(temperature=ev.proposer_temperature, max_new_tokens=ev.proposer_max_tokens)
    structured = engine_spec(config.engine.name).structured_outputs
    complete = engine_complete(engine, tokenizer, sampling, structured=structured)
    return ChatProposer(complete, ev.proposal_style, ev.max_chars, ev.max_edits, fits=complete.fits)


def evolve_command(
    config: RunConfig, out: Path, optimizer: str = "ctxrl", *, deadline: float | None = None
) -> dict[str, Any]:
    """Run (or resume) the evolution ``config`` describes in ``out`` with ``optimizer`` (``ctxrl``: the
    gated loop; ``gepa``: the GEPA baseline); return the summary. No new batch of the ctxrl loop starts after
    the Unix time ``deadline`` (None: no limit)."""
    from dataclasses import replace

    from ctxrl.env.policies import POLICY_MODES, make_policy
    from ctxrl.env.tasks.registry import FAMILIES
    from ctxrl.evolve.loop import EvolveLoop, RolloutRunner
    from ctxrl.train.engines import make_engine
    from ctxrl.train.engines.scripted import text_policy

    _check(config)
    _check_optimizer(config, optimizer)
    seed = _seed_skill(config)
    out.mkdir(parents=True, exist_ok=True)
    save_config(config, out)
    shutil.rmtree(out / "workspaces", ignore_errors=True)  # a killed run's half-built episode folders
    folder, tokenizer, price = resolve_model(config, out)
    engine = config.engine
    base = build_engine(config, folder, tokenizer)
    engines: dict[int, Any] = {}

    def engine_for(repeat: int) -> Any:
        # a scripted reference policy with jitter draws per repeat (seed engine.seed + repeat), the same draw
        # for every skill; any other engine serves every repeat
        if (
            not engine_spec(engine.name).needs_policy
            or engine.policy not in POLICY_MODES
            or not config.evolve.policy_jitter
        ):
            return base
        if repeat not in engines:
            assert engine.policy is not None
            policy = make_policy(engine.policy, jitter=config.evolve.policy_jitter, seed=engine.seed + repeat)
            engines[repeat] = make_engine(
                engine, folder, tokenizer=tokenizer, policy=text_policy(policy, tokenizer)
            )
        return engines[repeat]

    runner = RolloutRunner(
        engine_for,
        tokenizer,
        replace(config.rollout, group_size=1),
        harness=config.harness,
        sampling=config.sampling,
        geometry=price,
        workdir=out / "workspaces",
    )
    shared = {
        "mode": config.rollout.mode,
        "families": list(config.tasks.families) or list(FAMILIES),
        "difficulty": config.tasks.difficulty,
        "runner": runner,
        "proposer": _proposer(config, base, tokenizer),
        "seed": seed,
    }  # what both optimisers get: the same tasks, policy, proposer and seed skill
    try:
        if optimizer == "gepa":
            return _gepa(config, out, shared)
        loop = EvolveLoop(out, config.evolve, deadline=deadline, **shared)
        try:
            summary = loop.run()
        finally:
            loop.close()
    finally:
        base.close()
        if (out / "workspaces").is_dir() and not any((out / "workspaces").iterdir()):
            (out / "workspaces").rmdir()
    saved = summary["dev_episodes_planned"] - summary["dev_episodes_run"]
    state = f"stopped ({summary['stop_reason']})" if summary["stopped"] else "done"
    print(
        f"evolve {state}: {summary['rounds_finished']} rounds finished; incumbent {summary['incumbent']} "
        f"(seed {summary['seed']}); dev episodes run {summary['dev_episodes_run']} of "
        f"{summary['dev_episodes_planned']} planned ({saved} saved by early stops)"
    )
    print(f"  best skill  {out / 'best_skill' / 'SKILL.md'}")
    print(f"  report      {out / 'report.md'}")
    return summary


def _gepa(config: RunConfig, out: Path, shared: dict[str, Any]) -> dict[str, Any]:
    """``--optimizer gepa``: :func:`ctxrl.evolve.gepa_adapter.run_gepa` with the tasks, runner, proposer and seed
    skill (``shared``) the ctxrl loop would use."""
    from ctxrl.evolve.gepa_adapter import run_gepa

    summary = run_gepa(out, config.evolve, engine_seed=config.engine.seed, **shared)
    t = summary["test"]
    print(
        f"evolve (gepa) done: {summary['episodes_run']} of {summary['budget']} episodes; "
        f"{summary['accepted']} candidates kept of {summary['proposer']['proposed']} proposed; best "
        f"{summary['incumbent']} (seed {summary['seed']}); test success {t['seed']['success']:.1%} -> "
        f"{t['final']['success']:.1%}"
    )
    print(f"  best skill  {out / 'best_skill' / 'SKILL.md'}")
    print(f"  summary     {out / 'evolve.json'}")
    return summary
