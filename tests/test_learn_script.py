"""scripts/learn_smollm2.sh, the learning benchmark's one command, plans its stages in an order a resumed run can
follow: every comparison after the evaluations it reads, every step-MID evaluation before its run is trained past
MID (a kept run holds its latest checkpoint only), and a second pass skips every finished stage. The stages'
commands are stood in for by a recorder, so the plan is checked in a second, without a model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAKE_CTXRL = """#!/usr/bin/env bash
# records the call; gives every --out what the script copies from it
echo "$*" >> "$CALLS"
while [ $# -gt 0 ]; do
  if [ "$1" = --out ]; then mkdir -p "$2" && touch "$2/eval.json" "$2/eval.md"; fi
  shift
done
"""
FAKE_PY = """#!/usr/bin/env bash
# the script's inline readers (-c) run for real; `-m ctxrl.train.keep` is recorded
if [ "$1" = -c ]; then exec "$REAL_PY" "$@"; fi
echo "py $*" >> "$CALLS"
"""
BEFORE_GRPO = ("demos", "sft", "calib", "ei", "eval_sft", "eval_ei")


def _fixture(tmp_path: Path) -> dict[str, str]:
    """A KEEP whose stages before GRPO are done (the calibration named `small`/file, the SFT start the better
    one), an OUT with both merged starts, and the recorders; the script's environment."""
    keep, out = tmp_path / "keep", tmp_path / "out"
    (keep / "calibration").mkdir(parents=True)
    (keep / "calibration" / "calibration.json").write_text(
        json.dumps({"chosen": {"level": "small", "mode": "file"}})
    )
    for name, success in (("eval_sft", 0.6), ("eval_ei", 0.5)):
        (keep / name).mkdir()
        (keep / name / "eval.json").write_text(
            json.dumps({"summary": {"file": {"overall": {"success": success}}}})
        )
    for name in BEFORE_GRPO:
        (keep / f".{name}.done").touch()
    for model in ("sft", "sft_ei"):
        (out / model / "model").mkdir(parents=True)
        (out / model / "model" / "config.json").write_text("{}")
    for name, text in (("ctxrl", FAKE_CTXRL), ("py", FAKE_PY)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    return {
        **os.environ,
        "KEEP": str(keep),
        "CTXRL": str(tmp_path / "ctxrl"),
        "PY": str(tmp_path / "py"),
        "REAL_PY": sys.executable,
        "CALLS": str(tmp_path / "calls.txt"),
    }


def _run(env: dict[str, str]) -> tuple[list[tuple[str, str]], list[str]]:
    """The stages the script announced, ``(name, command or "done before, skipped")``, and the calls it made."""
    calls = Path(env["CALLS"])
    calls.write_text("")
    out = Path(env["KEEP"]).parent / "out"
    done = subprocess.run(
        ["bash", "scripts/learn_smollm2.sh", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    stages = [
        (m.group(1), m.group(2))
        for m in re.finditer(r"^== (\w+): (.*)$", done.stdout, re.MULTILINE)
        if m.group(1) != "done"  # the closing line
    ]
    return stages, calls.read_text().splitlines()


def test_every_stage_comes_after_what_it_reads_and_a_second_pass_skips_them_all(tmp_path: Path) -> None:
    env = _fixture(tmp_path)
    stages, calls = _run(env)
    ran = [(name, command) for name, command in stages if command != "done before, skipped"]
    names = [name for name, _ in ran]
    assert len(names) == len(set(names)) and len(names) > 40
    assert "grpo_mid" in names and names[-1] == "eval_wide_w0_s1"
    position = {name: i for i, name in enumerate(names)}
    for i, (name, command) in enumerate(ran):
        if name.startswith("compare"):
            # every folder a comparison reads was written by an evaluation stage that ran before it
            read = re.findall(r"/keep/(\w+)(?=[ ,]|$)", command.split(" --out ")[0])
            assert len(read) >= 3, command
            for folder in read:
                assert folder in BEFORE_GRPO or position[folder] < i, (
                    f"{name} reads {folder} before it exists"
                )
        mid = re.match(r"evaluate_run (\w+) (\w+) 10 ", command)
        if mid:  # a step-10 evaluation comes before its run is trained to step 20
            assert i < position[mid.group(2)], f"{name} evaluates {mid.group(2)} at step 10 after it moved on"
            assert position[f"{mid.group(2)}_mid"] < i
    # the arms pass their settings on to `ctxrl train`; the bf16 arm and its twin differ only in w_eff
    trains = {c.split(" --out ")[1].split()[0].rsplit("/", 1)[1]: c for c in calls if c.startswith("train ")}
    assert "train.mixed_precision=bf16" in trains["grpo_wide"] and "tasks.count=4" in trains["grpo_wide"]
    assert (
        trains["grpo_wide_w0"].replace(" advantages.w_eff=0", "").replace("grpo_wide_w0", "grpo_wide")
        == (trains["grpo_wide"])
    )
    # the seventh arm's replicate differs from it in its seeds only
    assert (
        trains["grpo_wide_s1"].replace(" engine.seed=1 train.seed=1", "").replace("grpo_wide_s1", "grpo_wide")
        == (trains["grpo_wide"])
    )
    assert (
        trains["grpo_wide_s2"].replace(" engine.seed=2 train.seed=2", "").replace("grpo_wide_s2", "grpo_wide")
        == (trains["grpo_wide"])
    )
    assert (
        trains["grpo_wide_w0_s1"]
        .replace(" engine.seed=1 train.seed=1", "")
        .replace("grpo_wide_w0_s1", "grpo_wide_w0")
        == (trains["grpo_wide_w0"])
    )
    # the edit-token recipe: the seventh arm without the action-token ablation, compared with the start and the twin
    assert "efficiency_tokens" not in trains["grpo_wide_edit"]
    assert (
        trains["grpo_wide"]
        .replace(" advantages.efficiency_tokens=actions", "")
        .replace("grpo_wide", "grpo_wide_edit")
        == trains["grpo_wide_edit"]
    )
    edit = dict(ran)["compare_final_wide_edit"].split(" --out ")[0].split(" ")[-3:]
    assert [p.rsplit("/", 1)[1] for p in edit] == ["final_start", "final_wide_edit", "final_wide_w0"]
    # the same at four times the efficiency weight, compared with the start and the edit-token arm
    assert trains["grpo_wide_edit_w1"] == trains["grpo_wide_edit"].replace(
        "grpo_wide_edit", "grpo_wide_edit_w1"
    ) + (" advantages.w_eff=1.0")
    w1 = dict(ran)["compare_final_wide_edit_w1"].split(" --out ")[0].split(" ")[-3:]
    assert [p.rsplit("/", 1)[1] for p in w1] == ["final_start", "final_wide_edit_w1", "final_wide_edit"]
    # the reference recipe's seeds 1 and 2 differ from its seed 0 in their seeds only; its three seeds pooled
    # against the start and the twin are the final table, KEEP/summary.json
    for seed in (1, 2):
        assert (
            trains[f"grpo_wide_edit_s{seed}"]
            .replace(f" engine.seed={seed} train.seed={seed}", "")
            .replace(f"grpo_wide_edit_s{seed}", "grpo_wide_edit")
            == (trains["grpo_wide_edit"])
        )
    edit_pool = dict(ran)["compare_final_edit_pool"]
    assert edit_pool.endswith("/keep/summary.json")
    slots = edit_pool.split(" --out ")[0].split(" ")[-3:]
    assert slots[0].endswith("/keep/final_start") and slots[2].endswith("/keep/final_wide_w0")
    assert [p.rsplit("/", 1)[1] for p in slots[1].split(",")] == [
        "final_wide_edit",
        "final_wide_edit_s1",
        "final_wide_edit_s2",
    ]
    dev_pool = dict(ran)["compare_edit_pool"].split(" --out ")[0].split(" ")[-3:]
    assert [p.rsplit("/", 1)[1] for p in dev_pool[1].split(",")] == [
        "eval_wide_edit",
        "eval_wide_edit_s1",
        "eval_wide_edit_s2",
    ]
    # the action-token recipe's pool: its three seeds in one slot, against the start and the twin
    pool = dict(ran)["compare_final_pool"].split(" --out ")[0]
    slots = pool.split(" ")[-3:]
    assert slots[0].endswith("/keep/final_start") and slots[2].endswith("/keep/final_wide_w0")
    assert [p.rsplit("/", 1)[1] for p in slots[1].split(",")] == [
        "final_wide",
        "final_wide_s1",
        "final_wide_s2",
    ]
    # the confirmatory table: the start and the three seeds on the next 128 test tasks, the seeds pooled
    confirms = [c for c in calls if c.startswith("eval ") and "/out/confirm_" in c]
    assert len(confirms) == 7 and all(
        "eval.episodes=128" in c and "eval.split=test" in c and "eval.offset=128" in c for c in confirms
    )
    confirm = dict(ran)["compare_confirm"].split(" --out ")[0].split(" ")[-2:]
    assert confirm[0].endswith("/keep/confirm_start")
    assert [p.rsplit("/", 1)[1] for p in confirm[1].split(",")] == [
        "confirm_wide",
        "confirm_wide_s1",
        "confirm_wide_s2",
    ]
    # and the reference recipe's three seeds on the same tasks, pooled against the same start
    confirm = dict(ran)["compare_confirm_edit"]
    assert confirm.endswith("/keep/summary_confirm_edit.json")
    slots = confirm.split(" --out ")[0].split(" ")[-2:]
    assert slots[0].endswith("/keep/confirm_start")
    assert [p.rsplit("/", 1)[1] for p in slots[1].split(",")] == [
        "confirm_wide_edit",
        "confirm_wide_edit_s1",
        "confirm_wide_edit_s2",
    ]
    # every policy of a final table on the first 128 test tasks; the seventh arm's seed-0 table kept apart
    finals = [c for c in calls if c.startswith("eval ") and "/out/final_" in c]
    assert len(finals) == 10 and all("eval.episodes=128" in c and "eval.split=test" in c for c in finals)
    final = dict(ran)["compare_final"]
    assert final.endswith("/keep/summary_final_wide.json") and all(
        f"/keep/final_{p} " in final for p in ("start", "wide")
    )
    again, calls_again = _run(env)
    assert [name for name, _ in again] == [name for name, _ in stages]
    assert all(command == "done before, skipped" for _, command in again)
    assert not [c for c in calls_again if c.startswith(("train ", "eval ", "compare "))]
