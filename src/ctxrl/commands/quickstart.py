"""``ctxrl quickstart``: the whole pipeline on the tiny model, end to end, as one short story.

    ctxrl quickstart [--out runs/quickstart] [--overwrite] [KEY=VALUE ...]

Stages, each in its own subfolder of the run folder (``ctxrl report`` reads them all from there):

1. ``model/``: the tiny model, built offline.
2. ``sft/``: demonstrations of the scripted file manager recorded token in / token out through the rollout
   loop, then a supervised warm start on them (``ctxrl sft``).
3. ``train/``: a few stepwise GRPO steps from the warm-started model (``ctxrl train``; the engine is vLLM
   unless ``engine.name=hf`` is given), with weight sync to the engine and a checkpoint.
4. ``export/``: the checkpoint exported as a serving folder and verified in vLLM (``ctxrl export``).
5. ``eval/``: the exported model (on vLLM, 3 steps per episode) against the scripted baselines (append-only
   and the file manager) on the same dev tasks (``ctxrl eval``).
6. ``evolve/``: one round of skill evolution with the skill-reading scripted manager and the offline
   proposer (``ctxrl evolve``).
7. ``report.html``: one static page of all of it (``ctxrl report``).

The sizes are the smallest that exercise every stage: the tiny model is random, so it solves nothing and
its numbers show the plumbing, not learning. Library output (vLLM's, transformers', warnings) goes to
``logs.txt`` in the run folder; the terminal gets one line per stage, progress bars, and the few numbers
that matter. ``KEY=VALUE`` overrides apply to the training stage (e.g. ``engine.name=hf``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from ctxrl.commands.common import ensure_tiny_model, library_logs_to, prepare_out, write_text
from ctxrl.commands.config import load_run_config
from ctxrl.env.skills import COMPACT_SENTENCE, FILE_SKILL

STAGES = 7

SFT = [
    "engine.name=scripted", "engine.policy=file-manager", "sampling.max_new_tokens=8192",
    "tasks.families=[retention]", "tasks.difficulty=easy", "tasks.count=2", "rollout.group_size=1",
    "sft.lr=2.0e-3", "sft.epochs=1", "sft.packing=padded", "sft.batch_tokens=8192",
]  # fmt: skip
TRAIN = [
    "engine.name=vllm", "engine.max_model_len=4096", "sampling.max_new_tokens=32", "tasks.families=[retention]",
    "tasks.difficulty=easy", "tasks.count=1", "rollout.group_size=2", "rollout.max_steps=3",
    "advantages.drop_zero_variance=none", "train.steps=2", "train.lr=1.0e-4", "train.save_every=1",
]  # fmt: skip
MODEL_EVAL = [
    "engine.name=vllm", "engine.max_model_len=4096", "sampling.max_new_tokens=32", "rollout.max_steps=3",
]  # fmt: skip
EVAL = ["eval.families=[retention]", "eval.difficulty=easy", "eval.split=dev", "eval.episodes=2"]
BASELINES = ["engine.name=scripted", "sampling.max_new_tokens=8192", "eval.policies=[append,file-manager]"]
EVOLVE = [
    "engine.name=scripted", "engine.policy=file-manager", "sampling.max_new_tokens=8192",
    "tasks.families=[offload,retention]", "tasks.difficulty=easy", "rollout.mode=file",
    "evolve.rounds=1", "evolve.proposals=2", "evolve.train_tasks=2", "evolve.train_repeats=2",
    "evolve.dev_tasks=4", "evolve.test_tasks=4", "evolve.policy_jitter=0.05",
]  # fmt: skip


SEED_SKILL = f"""---
mode: file
parent: none
round: 0
---
{FILE_SKILL.strip()}
{COMPACT_SENTENCE.format(percent=90)}
"""
"""The evolution stage's seed skill: the file-mode skill, compacting at 90 % of the limit (too late)."""


def advantage_report(trajectories: Path) -> list[str]:
    """One line per group of a trajectory file: successes, the task and efficiency advantages of its
    episodes, and how many generated tokens the edit mask marks."""
    from ctxrl.rewards.advantages import group_advantages
    from ctxrl.train.trajectory import load_trajectories

    groups: dict[int, list[Any]] = {}
    for ep in load_trajectories(trajectories):
        groups.setdefault(ep.group, []).append(ep)
    lines = []
    for g, eps in sorted(groups.items()):
        adv = group_advantages(
            [ep.reward for ep in eps],
            [ep.cost_flops if ep.cost_flops is not None else ep.cost_tokens for ep in eps],
            [ep.success for ep in eps],
            [[m for s in ep.steps for m in s.edit_mask] for ep in eps],
            clean=[ep.end_reason == "submit" for ep in eps],
        )
        edit_tokens = sum(sum(s.edit_mask) for ep in eps for s in ep.steps)
        lines.append(
            f"  group {g} ({eps[0].family}): {sum(ep.success for ep in eps)}/{len(eps)} solved, "
            f"task adv {[round(float(a), 2) for a in adv.task]}, "
            f"efficiency adv {[round(float(a), 2) for a in adv.efficiency]}, edit tokens {edit_tokens}"
        )
    return lines


class _Story:
    """One line per stage on ``stream`` with the stage's wall time and, when ``stream`` is a terminal (a
    TTY), a progress bar of the stages below the lines, its clock ticking while a stage runs. Call
    :meth:`close` at the end."""

    def __init__(self, stream: TextIO) -> None:
        from tqdm import tqdm

        self.stream = stream
        self.t0 = time.perf_counter()
        self.stage = 0
        self.started = self.t0
        self.bar = tqdm(
            total=STAGES,
            file=stream,
            disable=None,  # no bar where the output is not a terminal (a log, a test's capture)
            leave=False,
            bar_format="{n}/{total} stages |{bar}| {elapsed}",
        )
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, daemon=True)
        if not self.bar.disable:
            self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            self.bar.refresh()

    def _line(self, text: str) -> None:
        self.bar.write(text, file=self.stream)  # above the bar, which is drawn again below
        self.stream.flush()

    def begin(self, text: str) -> None:
        self.stage += 1
        self.started = time.perf_counter()
        self._line(f"[{self.stage}/{STAGES}] {text}")

    def end(self, text: str) -> None:
        self._line(f"      {text} ({time.perf_counter() - self.started:.0f} s)")
        self.bar.update(1)
        self.bar.refresh()  # now, not at the next tick

    def close(self) -> None:
        self._stop.set()
        if self._ticker.is_alive():
            self._ticker.join()
        self.bar.close()


def run_quickstart(args: argparse.Namespace) -> int:
    """Entry point of ``ctxrl quickstart`` (see the module docstring)."""
    from ctxrl.commands.eval import eval_command
    from ctxrl.commands.evolve import evolve_command
    from ctxrl.commands.sft import sft_command
    from ctxrl.commands.train import check_train_config, train_command
    from ctxrl.publish.export import export_run
    from ctxrl.publish.report import write_report
    from ctxrl.train.eval_table import markdown

    train_overrides = [*TRAIN, *args.overrides]
    train_config = load_run_config(None, train_overrides)  # a bad override fails before any stage runs
    check_train_config(train_config)  # so does one training cannot run with (a group of one, no weights)
    out: Path = prepare_out(args.out, overwrite=args.overwrite)
    story = _Story(sys.stdout)
    # the stages' own summaries and the libraries' output go to the log; the terminal gets the story
    with (
        contextlib.closing(story),
        library_logs_to(out / "logs.txt"),
        (out / "logs.txt").open("a", encoding="utf-8") as log,
        contextlib.redirect_stdout(log),
    ):
        story.begin(f"tiny model -> {out / 'model'}")
        model = ensure_tiny_model(out / "model")
        story.end("a random Qwen3, ~3 M parameters, built offline")

        story.begin("demonstrations of the scripted file manager + SFT warm start (ctxrl sft)")
        sft = sft_command(load_run_config(None, [f"model={model}", *SFT]), out / "sft")
        story.end(f"loss {sft['loss_before']:.2f} -> {sft['loss_after']:.2f} on {sft['loss_tokens']} tokens")

        story.begin(
            f"stepwise GRPO from the warm start on the {train_config.engine.name} engine (ctxrl train)"
        )
        train_command(
            load_run_config(None, [f"model={out / 'sft' / 'model'}", *train_overrides]), out / "train"
        )
        last = json.loads((out / "train" / "metrics.jsonl").read_text().splitlines()[-1])
        story.end(
            f"{int(last.get('step', 0))} steps; last: loss {last.get('loss/loss', float('nan')):.4f}, "
            f"success {last.get('reward/success', 0.0):.2f}, packed/naive tokens "
            f"{last.get('cost/packed_vs_naive_tokens', float('nan')):.2f}"
        )

        story.begin("export the checkpoint and verify it in vLLM (ctxrl export)")
        exported = export_run(out / "train", out / "export")
        check = exported.verification
        story.end(
            f"max |logprob diff| vLLM vs checkpoint {check.max_logprob_diff:.1e}" if check else "written"
        )

        story.begin("the exported model vs the scripted baselines on dev tasks (ctxrl eval)")
        model_eval = [f"model={out / 'export'}", "eval.modes=[file]", *MODEL_EVAL, *EVAL]
        table = eval_command(load_run_config(None, model_eval))
        table |= eval_command(load_run_config(None, [*BASELINES, *EVAL]))
        (out / "eval").mkdir(exist_ok=True)
        command = "ctxrl eval (quickstart: the exported model in file mode + append and file-manager)"
        write_text(out / "eval" / "eval.json", json.dumps({"command": command, "summary": table}, indent=1))
        write_text(out / "eval" / "eval.md", markdown(table) + "\n")
        success = {name: rows["overall"]["success"] for name, rows in table.items()}
        story.end(", ".join(f"{name} {value:.2f}" for name, value in success.items()))

        story.begin("one round of skill evolution, offline proposer and held-out gate (ctxrl evolve)")
        seed = write_text(
            out / "evolve_seed.md", SEED_SKILL
        )  # compacts late: something for the round to find
        evolved = evolve_command(
            load_run_config(None, [*EVOLVE, f"evolve.seed_skill={seed}"]), out / "evolve"
        )
        test = evolved.get("test") or {}
        story.end(
            f"{evolved['rounds_finished']} round; incumbent {evolved['incumbent']} (seed {evolved['seed']}); "
            f"test success seed {test.get('seed', {}).get('success', float('nan')):.2f} -> "
            f"final {test.get('final', {}).get('success', float('nan')):.2f}"
        )

        story.begin("the report (ctxrl report)")
        report = write_report(out)
        story.end(f"{report}")
    print(f"done in {time.perf_counter() - story.t0:.0f} s. report: {report}  logs: {out / 'logs.txt'}")
    return 0
