"""``ctxrl report``: context-graph events read off real rollout records, hand-checked bands and fronts, clear
errors on bad input, and the page opened in a real headless Chromium with every plot rendered.

The run folder is built from real records: three scripted rollouts (file, harness and usage mode) whose
actions are chosen to cause one of each context event, ``ctxrl eval`` on two scripted policies, metrics rows
shaped like the trainer's, and an evolution table. The browser test keeps ``test-artifacts/report.png``
(and the page) for people to look at.
"""

from __future__ import annotations

import html
import json
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ctxrl.cli import main
from ctxrl.env.budget import readout
from ctxrl.env.tasks.registry import make_task
from ctxrl.publish.report import (
    EpisodeView,
    PolicyPoint,
    StepView,
    context_timeline,
    load_episodes,
    pareto_front,
    parse_readout,
    read_run,
    render_report,
    rollout_points,
    step_events,
    write_page,
    write_report,
)
from ctxrl.train.engines import SamplingConfig
from ctxrl.train.engines.scripted import ScriptedEngine
from ctxrl.train.rollout import RolloutConfig, rollout
from ctxrl.train.trajectory import EpisodeRecord, save_trajectories

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# One script per mode, each action chosen for the context event it causes (or none).
SCRIPTS: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "file": [
        (call("next_chunk"), ()),
        (call("shell", command="seq 1 2500"), ("rollback",)),  # ~9k tokens of output pass the limit
        ("tidy " + call("shell", command="sed -i 's/registry/REG/g' context.md"), ("edit",)),
        (call("shell", command="sed -i 's/zzzz/y/' context.md"), ("refused edit",)),  # matches nothing
        (call("submit", answer="x"), ()),
    ],
    "harness": [
        (call("next_chunk"), ()),
        # one 9,000-character result: the pressure pass spills it (over half the limit, in characters)
        (call("shell", command="printf '%9000s' | tr ' ' a"), ("harness eviction",)),
        (call("next_chunk"), ()),
        (call("submit", answer="x"), ()),
    ],
    "usage": [
        (call("shell", command="seq 1 400 > notes.txt"), ()),
        (call("read_file", path="notes.txt"), ()),
        (call("evict_file_view", path="notes.txt"), ("eviction",)),
        (call("submit", answer="x"), ()),
    ],
}


def scripted(actions: list[str]) -> Callable[[list[int]], str]:
    """The i-th call returns the i-th action (one episode per engine, so calls are turns)."""
    calls = iter(actions)
    return lambda prompt_ids: next(calls, actions[-1])


def scripted_episodes(tokenizer: Any, workdir: Path) -> list[EpisodeRecord]:
    episodes: list[EpisodeRecord] = []
    for mode, script in SCRIPTS.items():
        engine = ScriptedEngine(scripted([a for a, _ in script]), tokenizer, max_model_len=16384)
        config = RolloutConfig(group_size=1, mode=mode)
        tasks = [make_task("retention", 1, "easy")]
        sampling = SamplingConfig(max_new_tokens=128)
        episodes += rollout(
            engine, tokenizer, tasks, config, workdir=workdir / mode, sampling=sampling
        ).episodes
    return episodes


def write_metrics(path: Path) -> None:
    """Rows shaped like the trainer's: a step and namespaced numbers (one null, as a logger may write)."""
    with path.open("w") as handle:
        for step in range(30):
            row = {
                "step": step,
                "loss/policy": 2.0 / (1 + step),
                "loss/kl": 0.001 * step,
                "reward/success": step / 30,
                "cost/flops": 1e11 - 1e9 * step,
                "rollout/tokens_per_s": None if step == 3 else 500.0 + step,
            }
            handle.write(json.dumps(row) + "\n")


def write_evolution(path: Path) -> None:
    con = sqlite3.connect(path)
    con.execute(
        "CREATE TABLE candidates (id TEXT, parent TEXT, round INTEGER, score REAL, cost REAL, decision TEXT)"
    )
    con.executemany(
        "INSERT INTO candidates VALUES (?, ?, ?, ?, ?, ?)",
        [
            ("s0", None, 0, 0.40, 1e11, "seed"),
            ("s1", "s0", 1, 0.45, 1.1e11, "accepted"),
            ("s2", "s0", 1, 0.35, 0.9e11, "rejected"),
            ("s3", "s1", 2, 0.52, 1.0e11, "accepted"),
        ],
    )
    con.commit()
    con.close()


@pytest.fixture(scope="module")
def records(tiny_tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> list[EpisodeRecord]:
    return scripted_episodes(tiny_tokenizer, tmp_path_factory.mktemp("rollouts"))


@pytest.fixture(scope="module")
def run_folder(records: list[EpisodeRecord], tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("run")
    save_trajectories(records, run / "trajectories.jsonl")
    write_metrics(run / "metrics.jsonl")
    argv = [
        "eval",
        "engine.name=scripted",
        "sampling.max_new_tokens=8192",
        "eval.policies=[append,file-manager]",
    ]
    argv += ["eval.families=[retention]", "eval.split=dev", "eval.episodes=1", "eval.difficulty=easy"]
    argv += ["rollout.workers=2", "--out", str(run / "eval")]
    assert main(argv) == 0
    write_evolution(run / "evolve.sqlite")
    return run


# ------------------------------------------------------------------------------------ events and bands


def test_events_read_off_the_records_are_what_each_scripted_action_did(records: list[EpisodeRecord]) -> None:
    by_mode = {ep.mode: ep for ep in records}
    assert set(by_mode) == set(SCRIPTS)
    for mode, script in SCRIPTS.items():
        ep = by_mode[mode]
        assert ep.end_reason == "submit", (mode, ep.end_reason)
        got = [step_events(StepView.of(s)) for s in ep.steps]
        assert got == [events for _, events in script], mode


def test_parse_readout_reads_the_harness_readout_line() -> None:
    assert parse_readout(readout(1234, 5745)) == (1234, 5745)
    assert parse_readout("no readout here") is None


def _step(
    prompt: int, context: int, shown: int, *, kinds: tuple[str, ...] = (), edited: bool = False
) -> StepView:
    calls = ("shell",) if kinds else ("next_chunk",)
    return StepView(
        prompt_tokens=prompt,
        generated_tokens=10,
        context_tokens=context,
        readout=readout(shown, 1000),
        tool_calls=calls,
        edit_calls=(0,) if kinds else (),
        receipt_kinds=kinds,
        edited=edited,
        prompt_source="extend",
    )


def test_context_timeline_bands_by_hand() -> None:
    steps = (
        _step(100, 150, 148),  # +50
        _step(150, 180, 178),  # +30
        _step(180, 130, 129, kinds=("applied",), edited=True),  # the edit cuts 80 of 80, adds 30
        _step(130, 160, 400, edited=True),  # readout 400 > 160: the pressure pass freed 240
        _step(160, 120, 120, edited=True),  # readout == context: a rollback, 40 freed
    )
    ep = EpisodeView("t", "retention", "file", "s", 0, 0, False, "submit", 1.0, None, steps)
    points = context_timeline(ep)
    assert [p.step for p in points] == [0, 1, 2, 3, 4, 5]
    assert {p.pinned for p in points} == {100}
    assert [(p.kept, p.added, p.freed) for p in points] == [
        (0, 0, 0),
        (0, 50, 0),
        (50, 30, 0),
        (30, 0, 50),
        (30, 30, 240),
        (20, 0, 40),
    ]
    assert [p.events for p in points] == [(), (), (), ("edit",), ("harness eviction",), ("rollback",)]
    assert points[-1].limit == 1000 and points[0].limit is None


def test_pareto_front_by_hand() -> None:
    pts = [
        PolicyPoint("append", 4, 0.0, 0.0, 50.0),
        PolicyPoint("harness", 4, 0.0, 0.0, 800.0),  # as successful as append and dearer: beaten
        PolicyPoint("file", 4, 1.0, 0.0, 450.0),
        PolicyPoint("usage", 4, 1.0, 0.0, 520.0),  # as successful as file and dearer: beaten
        PolicyPoint("tools", 4, 0.5, 0.0, 450.0),  # as costly as file and less successful: beaten
    ]
    assert [p.label for p in pareto_front(pts)] == ["append", "file"]


def test_rollout_points_group_by_mode(records: list[EpisodeRecord]) -> None:
    views = [EpisodeView.of(ep) for ep in records]
    points, unit = rollout_points(views)
    assert unit == "FLOPs" if all(ep.cost_flops is not None for ep in records) else "computed tokens"
    assert sorted(p.label for p in points) == ["file", "harness", "usage"]
    for p in points:
        (ep,) = [e for e in records if e.mode == p.label]
        assert p.episodes == 1 and p.success == float(ep.success) and p.success_se == 0.0
        assert p.cost == (ep.cost_flops if unit == "FLOPs" else ep.cost_tokens)


# ------------------------------------------------------------------------------------------- bad input


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_bad_input_is_one_line_naming_file_and_line(
    records: list[EpisodeRecord], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "run folder" in _error(capsys, ["report", str(tmp_path / "nope")])
    assert "does not exist" in _error(capsys, ["report", str(tmp_path / "nope")])
    assert "nothing to report" in _error(capsys, ["report", str(tmp_path)])

    bad = tmp_path / "bad_json"
    save_trajectories(records[:1], bad / "trajectories.jsonl")
    with (bad / "trajectories.jsonl").open("a") as handle:
        handle.write('{"task_id": "x", \n')
    assert "trajectories.jsonl:2: not JSON" in _error(capsys, ["report", str(bad)])

    not_record = tmp_path / "not_record"
    not_record.mkdir()
    (not_record / "trajectories.jsonl").write_text('{"task_id": "x"}\n')
    assert "trajectories.jsonl:1: EpisodeRecord lacks family" in _error(capsys, ["report", str(not_record)])

    metrics = tmp_path / "metrics"
    metrics.mkdir()
    (metrics / "metrics.jsonl").write_text('{"step": 0, "loss/policy": 1}\n\n{"step": "3"}\n')
    assert "metrics.jsonl:3: 'step' must be an integer" in _error(capsys, ["report", str(metrics)])
    (metrics / "metrics.jsonl").write_text(
        '{"step": 1.0, "loss/policy": 1}\n{"step": 2.5}\n'
    )  # 1.0 is step 1
    assert "metrics.jsonl:2: 'step' must be an integer, not 2.5" in _error(capsys, ["report", str(metrics)])

    ev = tmp_path / "eval_bad"
    (ev / "eval").mkdir(parents=True)
    (ev / "eval" / "eval.json").write_text('{"summary": [1, 2]}')
    assert "eval.json: no 'summary'" in _error(capsys, ["report", str(ev)])


def test_an_evolution_table_of_another_shape_is_skipped_with_a_note(
    records: list[EpisodeRecord], tmp_path: Path
) -> None:
    save_trajectories(records, tmp_path / "trajectories.jsonl")
    con = sqlite3.connect(tmp_path / "evolve.sqlite")
    con.execute("CREATE TABLE candidates (id TEXT, score REAL)")
    con.close()
    run = read_run(tmp_path)
    assert run.candidates is None
    assert run.notes == [
        "Evolution section skipped: evolve.sqlite: table 'candidates' lacks column(s) parent, round, cost, decision."
    ]
    page = write_report(tmp_path).read_text()
    assert 'id="plot-evolve' not in page and 'id="evolution"' not in page
    assert "lacks column(s) parent, round, cost, decision" in page
    # without an eval, success vs compute comes from the rollout (one point per mode)
    assert 'id="plot-pareto-rollout"' in page and 'id="plot-pareto-eval"' not in page


def test_cli_writes_the_report_and_says_where(
    run_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sub" / "r.html"
    assert main(["report", str(run_folder), "--out", str(out), "--episodes", "1"]) == 0
    # the headline curves + 4 metric namespaces + 1 context graph + Pareto + 2 evolution plots
    assert capsys.readouterr().out.startswith(f"wrote {out} (9 plots, ")
    page = out.read_text()
    assert page.count('id="plot-context-') == 1 and page.count('class="plot"') == 9


def test_help_lists_report_without_importing_matplotlib() -> None:
    code = (
        "import sys\nfrom ctxrl.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('LOADED=' + str('matplotlib' in sys.modules))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "report" in res.stdout and res.stdout.strip().splitlines()[-1] == "LOADED=False", res.stdout


# ---------------------------------------------------------------------------------------- the browser

_CHECK = """<script>
window.addEventListener("load", () => {
  const top = (sel) => { const el = document.querySelector(sel); return el ? el.getBoundingClientRect().top : -1; };
  const grid = document.querySelector("#all-metrics");
  const screen = {answer: top("#answer"), table: top("#answer-table"), headline: top("#plot-headline"),
                  pareto: top("#answer #plot-pareto-eval"), context: top("#answer img[id^='plot-context-']"),
                  grid: top("#all-metrics"), gridOpen: grid.open,
                  folded: !grid.querySelector("img.plot").checkVisibility()};
  grid.open = true;  // then every plot, the folded ones too, must have decoded and laid out
  const plots = [...document.querySelectorAll("img.plot")].map((img) => {
    const box = img.getBoundingClientRect();
    return {id: img.id, alt: img.alt, complete: img.complete, natural: img.naturalWidth,
            width: box.width, height: box.height};
  });
  const out = document.createElement("pre");
  out.id = "render-check";
  out.textContent = JSON.stringify({plots: plots, screen: screen,
                                    height: document.documentElement.scrollHeight});
  document.body.appendChild(out);
});
</script></body>"""


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


def _browse(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
    ]
    res = subprocess.run([binary, *flags, *args], capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    return res


def test_report_renders_every_plot_in_headless_chromium(run_folder: Path, tmp_path: Path) -> None:
    run = read_run(run_folder)
    page, plots = render_report(run, max_episodes=6)
    path = write_page(page, run_folder / "report.html")
    # self-contained: nothing to fetch at view time
    for needle in ('src="http', "href=", "<script", "<link", "@import", "url("):
        assert needle not in page, needle

    ids = [p.id for p in plots]
    assert len(ids) == len(set(ids))
    expected = {
        "plot-headline",
        "plot-train-loss",
        "plot-train-reward",
        "plot-train-cost",
        "plot-train-rollout",
    }
    expected |= {"plot-pareto-eval", "plot-evolve-rounds", "plot-evolve-lineage"}
    assert expected <= set(ids)
    assert sorted(i.split("-")[-3] for i in ids if i.startswith("plot-context-")) == [
        "file",
        "harness",
        "usage",
    ]
    assert 'id="eval-table"' in page and ">file-manager</td>" in page and 'id="evolve-table"' in page
    assert len(load_episodes(run_folder / "trajectories.jsonl")) == 3

    binary = _chromium()
    if binary is None:
        pytest.skip(
            "no chromium on PATH (Debian: apt-get install chromium; scripts/setup.sh does it as root)"
        )
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", _CHECK))
    dom = _browse(binary, tmp_path / "profile1", "--virtual-time-budget=10000", "--dump-dom", probe.as_uri())
    start = dom.stdout.index('<pre id="render-check">') + len('<pre id="render-check">')
    check = json.loads(html.unescape(dom.stdout[start : dom.stdout.index("</pre>", start)]))
    # the first screen answers "did it get better, at what cost": the held-out table, the success and
    # compute-per-success curves, the Pareto plot and one context graph, all above the folded metric grid
    screen = check["screen"]
    first = 1.6 * 900  # a laptop's first screen and a half, at 1280 px wide
    for item in ("answer", "table", "headline", "pareto", "context"):
        assert 0 <= screen[item] < first, (item, screen)
    assert screen["grid"] > screen["context"] and not screen["gridOpen"] and screen["folded"]
    rendered = {p["id"]: p for p in check["plots"]}
    assert set(rendered) == set(ids)
    for plot in plots:
        got = rendered[plot.id]
        assert got["complete"] and got["natural"] > 0, got  # the browser decoded the SVG
        assert got["width"] > 200 and got["height"] > 100, got  # and laid it out at a readable size
        assert got["alt"] == plot.title

    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(path, ARTIFACTS / "report.html")
    shot = ARTIFACTS / "report.png"
    height = min(int(check["height"]) + 40, 16000)
    _browse(
        binary, tmp_path / "profile2", f"--window-size=1280,{height}", f"--screenshot={shot}", path.as_uri()
    )
    from PIL import Image

    with Image.open(shot) as image:
        assert image.size == (1280, height)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # plots, not a blank page


def test_the_report_reads_the_evolution_loops_lineage_store(tmp_path: Path) -> None:
    """``ctxrl evolve`` writes ``lineage.sqlite``: a candidate's score and cost are its dev episodes' means."""
    import sqlite3

    from ctxrl.evolve.lineage import Lineage
    from ctxrl.publish.report import load_candidates

    lineage = Lineage.open(tmp_path, mode="file")
    seed = lineage.incumbent().id
    con = sqlite3.connect(tmp_path / "lineage.sqlite")
    con.execute(
        "INSERT INTO candidates (id, parent, round, slot, mode, text, status, decision, created) "
        "VALUES ('cand1', ?, 1, 0, 'file', ?, 'decided', 'accept', 0)",
        (seed, "---\nmode: file\nparent: none\nround: 1\n---\n## Body\nten chars"),
    )
    for skill, split, task, score, cost in [
        (seed, "dev", "t1", 0.0, 100.0),  # the seed ran the same dev tasks: cand1 is best on t1
        (seed, "dev", "t2", 0.0, 100.0),
        ("cand1", "dev", "t1", 1.0, 100.0),
        ("cand1", "dev", "t2", 0.0, 300.0),
        ("cand1", "test", "t3", 0.0, 900.0),  # the test split never counts here
    ]:
        con.execute(
            "INSERT INTO episodes VALUES (?, ?, 1, ?, 0, 0, ?, ?, ?, 'submit', '{}', 0)",
            (skill, split, task, int(score), score, cost),
        )
    con.commit()
    con.close()
    candidates, why = load_candidates(tmp_path / "lineage.sqlite")
    assert why is None and candidates is not None
    [cand] = [c for c in candidates if c.id == "cand1"]
    assert (cand.parent, cand.round, cand.score, cand.cost, cand.decision) == (seed, 1, 0.5, 200.0, "decided")
    assert cand.chars == len("## Body\nten chars") and cand.in_pool
    [first] = [c for c in candidates if c.id == seed]
    assert first.in_pool and first.chars == len(lineage.seed().body)  # the incumbent: always in the pool
    lineage.close()
    # the page shows the lineage, the skill-length curve and the pool
    page, plots = render_report(read_run(tmp_path), max_episodes=0)
    assert {"plot-evolve-lineage", "plot-evolve-length"} <= {p.id for p in plots}
    table = page[page.index('id="evolve-table"') :]
    assert '<th class="">chars</th>' in table and table.count(">in the pool</td>") == 2


def test_a_pipeline_folder_is_read_from_its_stage_subfolders(tmp_path: Path) -> None:
    """The quickstart's run folder holds one stage per subfolder; of two metrics files the later stage's shows."""
    import os

    from ctxrl.publish.report import read_run

    (tmp_path / "sft").mkdir()
    (tmp_path / "train").mkdir()
    (tmp_path / "sft" / "metrics.jsonl").write_text('{"step": 1, "train_loss": 6.5}\n')
    (tmp_path / "train" / "metrics.jsonl").write_text(
        '{"step": 1, "loss/loss": 0.5}\n{"step": 2, "loss/loss": 0.25}\n'
    )
    os.utime(tmp_path / "sft" / "metrics.jsonl", ns=(1_000_000_000, 1_000_000_000))  # the earlier stage
    run = read_run(tmp_path)
    assert [row.step for row in run.metrics] == [1, 2] and "loss/loss" in run.metrics[0].values


def test_an_ablation_folder_shows_both_arms_and_the_held_out_comparison(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A learning benchmark's folder (two GRPO arms, an SFT stage and ``ctxrl compare``'s summary) opens with
    the held-out table and one figure of both arms' training success with SE bands and the held-out points."""
    for arm, successes in (("grpo", (0.25, 0.5, 0.75)), ("grpo_w0", (0.25, 0.5, 0.5))):
        (tmp_path / arm).mkdir()
        lines = [
            json.dumps({"step": s + 1, "reward/success": p, "rollout/episodes": 16.0})
            for s, p in enumerate(successes)
        ]
        (tmp_path / arm / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "sft").mkdir()  # logs no success: not an arm
    (tmp_path / "sft" / "metrics.jsonl").write_text('{"step": 1, "train_loss": 1.5}\n')
    summary = {
        "level": "small",
        "heldout_tasks": 64,
        "sft_success": 0.5,
        "grpo_success": 0.625,
        "grpo_w0_success": 0.5625,
        "sft_cost_per_success": 1100.0,
        "grpo_cost_per_success": 800.0,
        "grpo_w0_cost_per_success": 1000.0,
        "success_diff": 0.125,
        "success_diff_ci_low": 0.01,
        "success_diff_ci_high": 0.24,
        "success_diff_p": 0.04,
        "cost_per_success_ci": {"sft": [900.0, 1300.0], "grpo": [700.0, 950.0], "grpo_w0": [850.0, 1200.0]},
        "unit": "GFLOP",
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    run = read_run(tmp_path)
    assert run.arms is not None and list(run.arms) == ["grpo", "grpo_w0"]
    assert run.comparison == summary
    page, plots = render_report(run)
    answer = page.split('<section id="answer">', 1)[1].split("</section>", 1)[0]
    assert 'id="comparison-table"' in answer and 'id="plot-arms"' in answer
    assert "<td>0.62 ± 0.06</td><td>800 [700, 950]</td>" in answer  # 0.625 over 64 tasks: SE 0.061
    assert "<td>0.50 ± 0.06</td><td>1,100 [900, 1,300]</td>" in answer
    assert "grpo − sft success: +0.125, 95 % CI [+0.010, +0.240], exact McNemar p = 0.040." in answer
    assert "grpo − grpo_w0 success" not in answer  # the summary holds no comparison with the ablation
    assert (
        'id="answer-table"' not in answer and 'id="plot-headline"' not in answer
    )  # one stage's, not the arms'
    assert plots[0].id == "plot-arms"
    svg = plots[0].svg.decode()
    assert svg.count("<path") > 10  # curves, bands and error bars were drawn

    summary.update(
        {
            "grpo_vs_w0_success_diff": 0.0625,
            "grpo_vs_w0_success_diff_ci_low": -0.05,
            "grpo_vs_w0_success_diff_ci_high": 0.175,
            "grpo_vs_w0_success_diff_p": 0.3,
            "grpo_over_w0_cost_per_success": 0.8,
            "grpo_over_w0_cost_per_success_ci": [0.6, 1.1],
        }
    )
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    page, _ = render_report(read_run(tmp_path))
    assert (
        "grpo − grpo_w0 success: +0.062, 95 % CI [-0.050, +0.175], exact McNemar p = 0.300; compute per success "
        "×0.80 [0.60, 1.10]." in page
    )

    # a further summary beside it (a third arm compared with the same start and ablation) gets its own table,
    # its rows named by the evaluations it compared
    third = {
        **summary,
        "grpo_success": 0.4375,
        "compared": {"sft": "eval_sft", "grpo": "eval_act", "grpo_w0": "eval_w0"},
    }
    (tmp_path / "summary_actions.json").write_text(json.dumps(third))
    page, _ = render_report(read_run(tmp_path))
    answer = page.split('<section id="answer">', 1)[1].split("</section>", 1)[0]
    assert answer.count('id="comparison-table') == 2 and "<h3>summary_actions.json</h3>" in answer
    extra = answer.split('id="comparison-table-2"', 1)[1]
    assert '<td class="l">grpo (eval_act)</td><td>0.44 ± 0.06</td>' in extra
    assert '<td class="l">grpo</td><td>0.62 ± 0.06</td>' in answer.split('id="comparison-table-2"', 1)[0]
    # a pool of replicates: its row names every evaluation, its SE is the summary's, and the p-value names its test
    pooled = {
        **third,
        "compared": {"sft": "final_start", "grpo": ["final_a", "final_b"], "grpo_w0": "final_w0"},
        "success_se": {"sft": 0.0625, "grpo": 0.03125, "grpo_w0": 0.0625},
        "success_diff_test": "exact paired permutation",
    }
    (tmp_path / "summary_pool.json").write_text(json.dumps(pooled))
    answer = render_report(read_run(tmp_path))[0].split('<section id="answer">', 1)[1]
    pool_table = answer.split('id="comparison-table-3"', 1)[1]
    assert '<td class="l">grpo (pool of 2: final_a, final_b)</td><td>0.44 ± 0.03</td>' in pool_table
    assert "exact paired permutation p = 0.040." in pool_table
    (tmp_path / "summary_pool.json").unlink()

    (tmp_path / "summary.json").write_text('{"heldout_tasks": 64}')
    assert "summary.json: not the summary of 'ctxrl compare'" in _error(capsys, ["report", str(tmp_path)])


def test_held_out_points_go_to_the_runs_the_summary_evaluated() -> None:
    """A summary that records where each evaluated model was exported from puts its held-out points on those
    runs' curves, at the evaluated step, and on no other arm's, whatever its keys are called; an older summary
    without that record still names its arms by its keys."""
    from ctxrl.publish.report.plots import HeldOut, held_out

    summary = {
        "sft_success": 0.5, "grpo_success": 0.625, "grpo_w0_success": 0.6875,
        "exported_from": {
            "sft": None,
            "grpo": {"run": "runs/ladder/grpo_wide", "step": 20},
            "grpo_w0": {"run": "runs/ladder/grpo_wide_w0", "step": 10},
        },
    }  # fmt: skip
    assert held_out(summary, "grpo_wide") == HeldOut(0.625, 20)
    assert held_out(summary, "grpo_wide_w0") == HeldOut(0.6875, 10)
    assert held_out(summary, "grpo") is None and held_out(summary, "grpo_w0") is None
    older = {k: v for k, v in summary.items() if k != "exported_from"}
    assert held_out(older, "grpo") == HeldOut(0.625, None) and held_out(older, "grpo_wide") is None


def test_a_pooled_arm_gets_one_held_out_point_with_the_pools_standard_error() -> None:
    """A pool of seeds has one held-out success: it goes on the pool's first run only, at that run's evaluated
    step, with the SE ``ctxrl compare`` computed over the pooled per-task rates (not a binomial SE over the
    tasks), and says how many runs it pools; the single twin beside it keeps the binomial SE."""
    from ctxrl.publish.report.plots import HeldOut, held_out

    seeds = [{"run": f"runs/ladder/grpo_edit{s}", "step": 20} for s in ("", "_s1", "_s2")]
    summary = {
        "sft_success": 0.49, "grpo_success": 0.6, "grpo_w0_success": 0.57,
        "success_se": {"sft": 0.044, "grpo": 0.031, "grpo_w0": 0.044},
        "exported_from": {"sft": None, "grpo": seeds, "grpo_w0": {"run": "runs/ladder/grpo_w0", "step": 18}},
    }  # fmt: skip
    assert held_out(summary, "grpo_edit") == HeldOut(0.6, 20, 0.031, 3)
    assert held_out(summary, "grpo_edit_s1") is None and held_out(summary, "grpo_edit_s2") is None
    assert held_out(summary, "grpo_w0") == HeldOut(0.57, 18)


def test_the_arms_figure_puts_the_summarys_runs_in_front_of_the_others() -> None:
    """In a folder of many ablations the figure draws in colour the runs the summary evaluated (every seed of a
    pool and the twin) and the rest as grey context; a summary that does not name its runs keeps every arm in
    colour."""
    from ctxrl.publish.report.load import MetricRow
    from ctxrl.publish.report.plots import evaluated_runs, plot_arms

    seeds = [{"run": f"runs/ladder/grpo_edit{s}", "step": 2} for s in ("", "_s1", "_s2")]
    summary = {
        "heldout_tasks": 32, "sft_success": 0.5, "grpo_success": 0.6, "grpo_w0_success": 0.55,
        "success_se": {"sft": 0.09, "grpo": 0.05, "grpo_w0": 0.09},
        "exported_from": {"sft": None, "grpo": seeds, "grpo_w0": {"run": "runs/ladder/grpo_w0", "step": 2}},
    }  # fmt: skip
    assert evaluated_runs(summary) == ["grpo_edit", "grpo_edit_s1", "grpo_edit_s2", "grpo_w0"]
    assert evaluated_runs({"grpo_success": 0.6}) == [] and evaluated_runs(None) == []
    names = ["grpo", "grpo_edit", "grpo_edit_s1", "grpo_edit_s2", "grpo_lr", "grpo_w0"]
    arms = {
        name: [MetricRow(s, {"reward/success": 0.5, "rollout/episodes": 16.0}) for s in (1, 2)]
        for name in names
    }
    assert plot_arms(arms, summary).title.startswith("4 arms:")
    older = {k: v for k, v in summary.items() if k != "exported_from"}
    assert plot_arms(arms, older).title.startswith("6 arms:")
    assert plot_arms(arms, None).title.startswith("6 arms:")


def test_every_figure_is_drawn_under_the_report_style() -> None:
    """Each ``plot_*`` function runs under the report's matplotlib style (``_styled`` wraps it)."""
    from ctxrl.publish.report import plots

    figures = [name for name in dir(plots) if name.startswith("plot_")]
    assert "plot_arms" in figures and len(figures) >= 8
    assert [name for name in figures if not hasattr(getattr(plots, name), "__wrapped__")] == []
