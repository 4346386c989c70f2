"""Every user mistake on the command line is one line on stderr and exit 1 (or 2 for argparse's usage
errors), found before any episode runs, and never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxrl.cli import main
from ctxrl.errors import ConfigError


def _setup(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "file.txt").write_text("user data")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("user data")
    (tmp_path / "bad.yaml").write_text("engine: [unclosed\n")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "u16.yaml").write_text("tasks:\n  count: 1\n", encoding="utf-16")  # "Unicode" in some editors
    (tmp_path / "nomodel").mkdir()
    (tmp_path / "nomodel" / "tokenizer.json").write_text("{}")
    return {
        "file": str(tmp_path / "file.txt"),
        "full": str(tmp_path / "full"),
        "new": str(tmp_path / "new"),
        "bad_yaml": str(tmp_path / "bad.yaml"),
        "list_yaml": str(tmp_path / "list.yaml"),
        "u16": str(tmp_path / "u16.yaml"),
        "nomodel": str(tmp_path / "nomodel"),
        "dir": str(tmp_path),
    }


SCRIPTED = "engine.name=scripted"
CASES: list[tuple[list[str], int, str]] = [
    # (argv with {placeholders}, exit status, a piece of the one error line)
    (["tiny-model", "--out", "/dev/null/x"], 1, "cannot write the tiny model to /dev/null/x"),
    (["tiny-model", "--out", "{full}"], 1, "not empty"),
    (["tiny-model", "--out", "{new}", "--seed", "abc"], 2, "invalid int value"),
    (
        ["tiny-model", "--out", "{new}", "--seed", "99999999999999999999"],
        1,
        "--seed must be an integer from 0",
    ),
    (
        ["rollout", "--out", "{new}", "sampling.temperature=.nan"],
        1,
        "sampling.temperature must be a finite number",
    ),
    (["rollout", "--out", "{new}", "sampling.top_p=1e999"], 1, "must be a finite number, not '1e999'"),
    (
        ["rollout", "--out", "{new}", "engine.seed=-1"],
        1,
        "engine.seed must be an integer from 0 to 2147483647",
    ),
    (
        ["train", "--out", "{new}", "train.seed=18446744073709551616"],
        1,
        "train.seed must be an integer from 0",
    ),
    (["rollout", "--out", "{file}"], 1, "exists and is not a folder"),
    (["rollout", "--out", "{full}"], 1, "is not empty; pass --overwrite"),
    (["rollout", "--out", "{new}", "tasks.count=0"], 1, "count must be >= 1"),
    (["rollout", "--out", "{new}", "rollout.mode=notes"], 1, "unknown mode 'notes'"),
    (["rollout", "--out", "{new}", "rollout.group_size=four"], 1, "rollout.group_size must be int"),
    (["rollout", "--out", "{new}", "rollout.gropu_size=4"], 1, "did you mean 'group_size'"),
    (["rollout", "--out", "{new}", "not-an-override"], 1, "must look like key=value"),
    (["rollout", "--out", "{new}", "--config", "{dir}/missing.yaml"], 1, "cannot read config file"),
    (["rollout", "--out", "{new}", "--config", "{bad_yaml}"], 1, "is not valid YAML"),
    (["rollout", "--out", "{new}", "--config", "{list_yaml}"], 1, "must hold a mapping"),
    (["rollout", "--out", "{new}", "--config", "{u16}"], 1, "u16.yaml is not UTF-8 text"),
    (
        ["rollout", "--out", "{new}", "engine.name=vllm-server", "engine.server_url=localhost:8000"],
        1,
        "must start with http://",
    ),
    (
        ["rollout", "--out", "{new}", "engine.name=vllm-server", "engine.server_url=127.0.0.1:8000"],
        1,
        "e.g. http://127.0.0.1:8000",
    ),
    (
        ["rollout", "--out", "{new}", "engine.name=vllm-server", "engine.server_url=http://[::1"],
        1,
        "is not a URL",
    ),
    (
        ["rollout", "--out", "{new}", "engine.name=vllm-server", "engine.server_url=http://h:80/v1"],
        1,
        "without /v1",
    ),
    (
        ["rollout", "--out", "{new}", "engine.name=vllm-server", "engine.server_url=http://h:port"],
        1,
        "is not a URL",
    ),
    (["rollout", "--out", "{new}", "--model", "{nomodel}", "engine.name=hf"], 1, "has no config.json"),
    (["rollout", "--out", "{new}", SCRIPTED, "engine.policy=nomodule:fn"], 1, "cannot import it"),
    (["rollout", "--out", "{new}", "tasks.families=[chess]"], 1, "unknown family 'chess'"),
    (["rollout", "--tasks", "4"], 2, "unrecognized arguments: --tasks"),
    (["eval", SCRIPTED, "--out", "{file}"], 1, "exists and is not a folder"),
    (["eval", SCRIPTED, "--json", "{dir}"], 1, "is a folder; give a file name"),
    (["eval", SCRIPTED, "--json", "{file}/x.json"], 1, "is not a folder"),
    (["eval", SCRIPTED, "eval.policies=[greedy]"], 1, "unknown policy 'greedy'"),
    (["eval", SCRIPTED, "eval.episodes=0"], 1, "episodes must be >= 1"),
    (["eval", "engine.name=llama"], 1, "engine.name must be one of"),
    (["eval", "--episodes", "3"], 2, "unrecognized arguments: --episodes"),
    (["bench", "nope"], 2, "invalid choice: 'nope'"),
    (["bench", "harness", "--json", "{dir}"], 1, "is a folder; give a file name"),
    (["quickstart", "--out", "{file}"], 1, "exists and is not a folder"),
    (["quickstart", "--out", "{full}"], 1, "is not empty; pass --overwrite"),
    (["quickstart", "--out", "{new}", "rollout.group_size=1"], 1, "group_size"),
    (["quickstart", "--out", "{new}", "engine.name=scripted"], 1, "samples from the trained weights"),
    ([], 2, "the following arguments are required: COMMAND"),
]


@pytest.mark.parametrize(("argv", "status", "message"), CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_bad_invocation_is_one_line(
    argv: list[str], status: int, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _setup(tmp_path)
    args = [a.format(**paths) for a in argv]
    try:
        rc = main(args)
    except SystemExit as exc:  # argparse's usage errors
        rc = int(exc.code or 0)
    err = capsys.readouterr().err
    assert rc == status, err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert message in err, err
    assert "Traceback" not in err
    # nothing the user had was lost, and no episode ran (no trajectories anywhere)
    assert (tmp_path / "file.txt").read_text() == "user data"
    assert (tmp_path / "full" / "keep.txt").read_text() == "user data"
    assert not list(tmp_path.rglob("trajectories.jsonl"))


def test_at_least_fifteen_cases_across_every_subcommand() -> None:
    commands = {c[0][0] for c in CASES if c[0]}
    assert len(CASES) >= 15 and commands == {"tiny-model", "rollout", "train", "eval", "bench", "quickstart"}


def test_overwrite_empties_only_a_run_folder_and_never_what_the_run_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "NOTES.md").write_text("mine")
    assert main(["rollout", "--out", str(notes), "--overwrite", SCRIPTED]) == 1
    assert "is not a ctxrl run folder" in capsys.readouterr().err
    assert (notes / "NOTES.md").read_text() == "mine"
    # a run folder whose model the new run would read from inside it
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "config.yaml").write_text("{}\n")
    (run / "model" / "config.json").write_text("{}")
    assert main(["rollout", "--out", str(run), "--overwrite", "--model", str(run / "model"), SCRIPTED]) == 1
    err = capsys.readouterr().err
    assert "--overwrite would delete" in err and "which this run reads" in err and err.count("\n") == 1, err
    assert (run / "model" / "config.json").exists()
    # a run folder on its own is replaced
    (run / "model" / "config.json").unlink()
    (run / "model").rmdir()
    assert (
        main(["rollout", "--out", str(run), "--overwrite", SCRIPTED, "tasks.count=1", "rollout.max_steps=1"])
        == 0
    )
    assert (run / "config.yaml").read_text() != "{}\n"


def test_train_resume_runs_the_stored_config_and_refuses_a_different_experiment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ctxrl.commands import train as train_cmd
    from ctxrl.commands.common import save_config
    from ctxrl.commands.config import load_run_config

    run = tmp_path / "run"
    run.mkdir()
    tiny = Path(__file__).parents[1] / "configs" / "train_tiny.yaml"
    save_config(load_run_config(tiny, ["train.lr=0.0123", "train.steps=3"]), run)
    seen = []
    monkeypatch.setattr(train_cmd, "train_command", lambda config, out, **kw: seen.append((config, kw)))
    # no --config: the stored one, not the defaults
    assert main(["train", "--out", str(run), "--resume"]) == 0
    assert seen[-1][0].train.lr == 0.0123 and seen[-1][1]["resume"]
    # a longer run is the same experiment
    assert main(["train", "--out", str(run), "--resume", "train.steps=9"]) == 0
    assert (seen[-1][0].train.steps, seen[-1][0].train.lr) == (9, 0.0123)
    # another learning rate is not
    assert main(["train", "--out", str(run), "--resume", "train.lr=0.5"]) == 1
    err = capsys.readouterr().err
    assert "--resume: train.lr was 0.0123" in err and err.count("\n") == 1, err
    assert len(seen) == 2


def test_a_folder_a_run_stopped_in_before_it_began_is_reused(tmp_path: Path) -> None:
    """A start that failed (no such model, no server) leaves only ``config.yaml``: the corrected command runs
    there without --overwrite."""
    out = tmp_path / "run"
    bad = ["rollout", "--out", str(out), "--model", str(tmp_path / "missing"), "engine.name=hf"]
    assert main(bad) == 1
    assert not out.exists() or [p.name for p in out.iterdir()] in ([], ["config.yaml"])
    assert main(["rollout", "--out", str(out), SCRIPTED, "tasks.count=1", "rollout.max_steps=1"]) == 0
    assert main(["report", str(out)]) == 0  # the rollout's own summary.json is not a comparison to refuse
    assert (out / "report.html").is_file()


def test_yaml_booleans_are_the_words_where_a_setting_takes_words(tmp_path: Path) -> None:
    from ctxrl.commands.config import load_run_config

    config = tmp_path / "c.yaml"
    config.write_text("sft:\n  mixed_precision: no\n")  # YAML 1.1 reads an unquoted no as false
    assert load_run_config(config).sft.mixed_precision == "no"
    assert load_run_config(None, ["train.mixed_precision=no"]).train.mixed_precision == "no"
    with pytest.raises(ConfigError, match="must be one of 'no', 'bf16', not True"):
        load_run_config(None, ["train.mixed_precision=yes"])
