"""What the subcommands share: run folders, the run config, the model folder, engines and scripted policies.

Every user mistake found here is a :class:`~ctxrl.errors.UsageError` (or another ``CtxrlError``) with one
line naming what is wrong; the CLI prints it and exits 1. Checks run before any episode does.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from ctxrl.commands.config import RunConfig, dump_run_config, load_run_config, to_dict
from ctxrl.errors import ConfigError, UsageError

SHORTCUTS = {"model": "model", "engine": "engine.name", "mode": "rollout.mode"}
"""Flags that stand for one config key each (``--engine vllm`` is ``engine.name=vllm``); they apply after the
``key=value`` overrides, so the flag wins."""


def cli_overrides(args: argparse.Namespace) -> list[str]:
    """A subcommand's ``key=value`` overrides followed by those its shortcut flags stand for (:data:`SHORTCUTS`)."""
    overrides = list(getattr(args, "overrides", None) or ())
    for flag, key in SHORTCUTS.items():
        value = getattr(args, flag, None)
        if value is not None:
            overrides.append(f"{key}={value}")
    return overrides


def run_config(args: argparse.Namespace) -> RunConfig:
    """The run config of a subcommand: ``--config`` (or the defaults) plus :func:`cli_overrides`."""
    return load_run_config(getattr(args, "config", None), cli_overrides(args))


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): data}


def resumed_run_config(args: argparse.Namespace, out: Path, resumable: Sequence[str]) -> RunConfig:
    """The config a ``--resume`` of the run in ``out`` runs with: the stored ``config.yaml``; with a
    ``--config`` or overrides given, the given config, which may differ from the stored one only in
    ``resumable`` keys (``section.key``) — anything else would mix two experiments in one run."""
    stored = load_run_config(out / "config.yaml")
    overrides = cli_overrides(args)  # the shortcut flags (--model ...) count as overrides
    if getattr(args, "config", None) is None and not overrides:
        return stored
    given = run_config(args)
    if getattr(args, "config", None) is None:  # overrides alone apply to the stored config
        given = load_run_config(out / "config.yaml", overrides)
    old, new = _flat(to_dict(stored)), _flat(to_dict(given))
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key) and key not in resumable:
            raise UsageError(
                f"--resume: {key} was {old.get(key)!r} in {out / 'config.yaml'}, now {new.get(key)!r}; "
                f"a resumed run may change only {', '.join(resumable)}"
            )
    return given


RUN_MARKERS = ("config.yaml", "summary.json", "logs.txt", "metrics.jsonl")
"""Files one of ctxrl's commands leaves at the top of a run folder: ``--overwrite`` empties only such a folder."""


def prepare_out(out: Path, *, overwrite: bool = False, inputs: Sequence[Path | str | None] = ()) -> Path:
    """Make ``out`` an empty run folder: refuse a file, and a non-empty folder unless ``overwrite`` (then it
    is emptied). ``overwrite`` never deletes what is not a run: a folder with none of :data:`RUN_MARKERS`
    (a parent of runs, a folder of notes), or one holding any of ``inputs`` (files or folders the run will
    read: demonstrations recorded into an earlier run there, a model). A folder holding only ``config.yaml``
    is a run that stopped before it began, and is reused without ``overwrite``. File-system errors come out
    as one line naming the folder."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder")
    try:
        if out.is_dir() and {p.name for p in out.iterdir()} == {"config.yaml"}:
            (out / "config.yaml").unlink()  # a run that stopped before it began (a bad model, no server)
        if out.is_dir() and any(out.iterdir()):
            if not overwrite:
                raise UsageError(f"--out {out} is not empty; pass --overwrite to replace what is there")
            _check_overwrite(out, inputs)
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot use {out} as the run folder: {exc.strerror or exc}") from None
    return out


def _check_overwrite(out: Path, inputs: Sequence[Path | str | None]) -> None:
    if not any((out / name).exists() for name in RUN_MARKERS):
        raise UsageError(
            f"--out {out} is not a ctxrl run folder (none of {', '.join(RUN_MARKERS)} in it), so --overwrite "
            "will not delete it; pick a new --out or empty it yourself"
        )
    root = out.resolve()
    for item in inputs:
        if item is None or not Path(item).exists():
            continue  # a registry name, or nothing given
        path = Path(item).resolve()
        if path == root or root in path.parents:
            raise UsageError(
                f"--overwrite would delete {item}, which this run reads, inside --out {out}; copy it "
                "elsewhere first or pick a new --out"
            )


def check_writable_file(path: Path) -> Path:
    """Refuse, before any work, an output file that cannot be written: a folder, or under a non-folder."""
    if path.is_dir():
        raise UsageError(f"{path} is a folder; give a file name")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"cannot write {path}: {parent} is not a folder")
    return path


def write_text(path: Path, text: str) -> Path:
    """Write ``path`` (parents created); a file-system error is one line naming the file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def save_config(config: RunConfig, out: Path) -> Path:
    """Write the resolved config into the run folder (``config.yaml``)."""
    return write_text(out / "config.yaml", dump_run_config(config))


def ensure_tiny_model(folder: Path, seed: int = 0) -> Path:
    """Build the tiny model into ``folder`` unless a model is already there."""
    from ctxrl.train.tiny_model import build_tiny_model

    if (folder / "config.json").is_file():
        return folder
    return build_tiny_model(folder, seed=seed, force=True)


def model_dir(config: RunConfig, out: Path) -> Path:
    """The run's model folder: ``config.model`` (a folder, or a registry name such as
    ``smollm2-135m-instruct``, see ``ctxrl model list``), or the tiny model built into ``out/model``. An engine that
    loads the weights gets it checked for a causal LM here, before its tokenizer loads or anything starts."""
    if config.model is None:
        return ensure_tiny_model(out / "model", seed=config.engine.seed)
    from ctxrl.train.models import MODELS, get_model

    folder = Path(config.model)
    if not folder.exists() and config.model in MODELS:  # a registry name: fetched once, then cached
        folder = get_model(config.model)
    from ctxrl.train.engines import engine_spec

    if engine_spec(config.engine.name).loads_weights(config.engine):  # else only the tokenizer is read
        from ctxrl.train.engines.model_dir import check_causal_lm_dir

        check_causal_lm_dir(folder)
    return folder


def resolve_model(config: RunConfig, out: Path | None) -> tuple[Path | None, Any, Any]:
    """The run's policy model: ``(folder, tokenizer, FLOPs geometry)``.

    A scripted engine without ``config.model`` needs no weights: the tiny tokenizer (built in memory) and
    the tiny model's geometry price its episodes. A model engine without ``config.model`` gets the tiny
    model built into ``out/model``.
    """
    from ctxrl.env.tokenizer import load_tokenizer, load_tokenizer_dir
    from ctxrl.train.engines import engine_spec
    from ctxrl.train.tiny_model import tiny_geometry

    if config.model is None and not engine_spec(config.engine.name).has_model:
        return None, load_tokenizer(None), tiny_geometry()
    if config.model is None and out is None:
        raise UsageError(
            "give the model (--model DIR) or a run folder (--out DIR) to build the tiny model in"
        )
    folder = model_dir(config, out or Path("."))
    return folder, load_tokenizer_dir(folder), geometry(folder)


def geometry(folder: Path) -> Any:
    """The FLOPs geometry of the model in ``folder``; None (FLOPs not priced, tokens still are) when its
    config cannot be read."""
    from ctxrl.rewards.cost import ModelGeometry

    try:
        return ModelGeometry.from_config(json.loads((folder / "config.json").read_text(encoding="utf-8")))
    except (OSError, ValueError, ConfigError):
        return None


_TOOL_NAME = re.compile(r'"function": \{"name": "([^"]+)"')


def probe_policy(tokenizer: Any, calls_before_submit: int = 3) -> Callable[[list[int]], str]:
    """The ``scripted`` engine's default policy: a probe that exercises the environment without a model.

    On its k-th turn it calls the k-th tool listed in the prompt (round robin, submit excluded) with no
    arguments; after ``calls_before_submit`` turns it submits an empty answer. It never succeeds; it shows
    that tasks, tools, sandbox, receipts and records work end to end.
    """

    def policy(prompt_ids: list[int]) -> str:
        text = tokenizer.decode(prompt_ids)
        turn = text.count("<|im_start|>assistant") - 1
        names = [n for n in dict.fromkeys(_TOOL_NAME.findall(text)) if n != "submit"]
        if turn >= calls_before_submit or not names:
            name, arguments = "submit", {"answer": ""}
        else:
            name, arguments = names[turn % len(names)], {}
        return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"

    return policy


def scripted_policy(spec: str | None, tokenizer: Any) -> Callable[[list[int]], str]:
    """The scripted engine's policy named by ``engine.policy``: a scripted reference policy's name (it sees
    the decoded prompt only), ``MODULE:FUNCTION`` of a factory ``f(tokenizer)``, or the probe for None."""
    from ctxrl.env.policies import POLICY_MODES, make_policy
    from ctxrl.train.engines.scripted import text_policy

    if spec is None:
        return probe_policy(tokenizer)
    if spec in POLICY_MODES:
        return text_policy(make_policy(spec), tokenizer)
    module, sep, name = spec.partition(":")
    if not sep:
        raise UsageError(
            f"engine.policy={spec}: not a scripted policy ({', '.join(POLICY_MODES)}) nor MODULE:FUNCTION"
        )
    try:
        factory = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise UsageError(f"engine.policy={spec}: cannot import it ({exc}); give MODULE:FUNCTION") from None
    policy: Callable[[list[int]], str] = factory(tokenizer)
    return policy


def build_engine(config: RunConfig, folder: Path | None, tokenizer: Any) -> Any:
    """The engine of ``config.engine`` on the model in ``folder`` (checked first, before any start-up)."""
    from ctxrl.train.engines import engine_spec, make_engine
    from ctxrl.train.engines.model_dir import check_causal_lm_dir

    cfg = config.engine
    spec = engine_spec(cfg.name)
    if spec.needs_policy:
        return make_engine(cfg, folder, tokenizer=tokenizer, policy=scripted_policy(cfg.policy, tokenizer))
    if not spec.loads_weights(cfg):  # a running server
        return make_engine(cfg)
    assert folder is not None
    check_causal_lm_dir(folder)  # before a minute of engine start-up
    return make_engine(cfg, folder)


def summary_engine(config: RunConfig, folder: Path | None, tokenizer: Any) -> tuple[Any, Any]:
    """``(generate, engine)`` for ``harness.modes.pressure.summariser: engine`` under the scripted engine.

    A model engine summarises with itself (the rollout loop builds that): ``(None, None)``, as for any other
    summariser. A scripted policy has no model, so the summaries come from the run's model (``--model``)
    through the ``hf`` engine, which the caller closes; without a model it is a ConfigError naming the fix.
    """
    from ctxrl.train.engines import engine_spec

    if config.harness.modes.pressure.summariser != "engine" or engine_spec(config.engine.name).has_model:
        return None, None
    from ctxrl.train.rollout import SCRIPTED_SUMMARISER

    if folder is None:
        raise ConfigError(SCRIPTED_SUMMARISER)
    from ctxrl.env.episode import PromptBuilder
    from ctxrl.train.engines import EngineConfig, make_engine
    from ctxrl.train.engines.model_dir import check_causal_lm_dir
    from ctxrl.train.summarise import engine_generate

    check_causal_lm_dir(folder)
    engine = make_engine(EngineConfig(name="hf", seed=config.engine.seed, dtype=config.engine.dtype), folder)
    return engine_generate(engine, PromptBuilder(tokenizer)), engine


@contextlib.contextmanager
def library_logs_to(path: Path) -> Iterator[TextIO]:
    """Send everything the libraries print (vLLM's, transformers', torch's warnings and logs, C-level
    output included) to ``path`` while the block runs; yield a stream on the terminal's stderr for the
    command's own progress bars. The command's ``print`` (stdout) is untouched."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    terminal = os.fdopen(os.dup(saved), "w", buffering=1)
    with path.open("a", encoding="utf-8") as log:
        os.dup2(log.fileno(), 2)
        handler = logging.StreamHandler(log)
        root = logging.getLogger()
        root.addHandler(handler)
        logging.captureWarnings(True)  # Python warnings go through logging to the file too
        try:
            yield terminal
        finally:
            logging.captureWarnings(False)
            root.removeHandler(handler)
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            terminal.close()
