"""Check that a folder holds a causal LM before any engine spends a minute starting on it."""

from __future__ import annotations

import json
from pathlib import Path

from ctxrl.env.tokenizer import has_tokenizer
from ctxrl.env.tokenizer import load_tokenizer_dir as load_tokenizer
from ctxrl.errors import ModelLoadError

__all__ = ["check_causal_lm_dir", "load_tokenizer"]

_WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin", "model*.bin")


def check_causal_lm_dir(model_dir: str | Path) -> Path:
    """Return ``model_dir`` as a Path if it holds a causal LM with weights and a tokenizer.

    Raises :class:`ModelLoadError` naming what is missing or wrong: not a folder, no ``config.json`` (e.g. a
    tokenizer-only folder), a config that is not JSON or that transformers cannot read, a model type that is
    not a causal LM, no weight files, no tokenizer files. Reads only small files; loads no weights.
    """
    path = Path(model_dir)
    if not path.is_dir():
        raise ModelLoadError(f"model folder {path} does not exist or is not a folder")
    config_file = path / "config.json"
    if not config_file.is_file():
        hint = " (it looks like a tokenizer-only folder)" if has_tokenizer(path) else ""
        raise ModelLoadError(
            f"{path} has no config.json, so it is not a model folder{hint}; pass a folder written by "
            "save_pretrained or `ctxrl tiny-model`"
        )
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{config_file} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise ModelLoadError(f"{config_file} has no model_type, so transformers cannot tell what model it is")

    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as exc:  # transformers raises ValueError/KeyError/OSError/...: all mean "unreadable"
        raise ModelLoadError(f"transformers cannot read {config_file}: {exc}") from None
    architectures = list(getattr(config, "architectures", None) or [])
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not any(
        a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures
    ):
        raise ModelLoadError(
            f"{path} holds a {config.model_type!r} model (architectures {architectures}), not a causal LM"
        )
    if not any(any(path.glob(pattern)) for pattern in _WEIGHT_GLOBS):
        raise ModelLoadError(f"{path} has a config but no weight files (*.safetensors or pytorch_model*.bin)")
    for weights in sorted(path.glob("*.safetensors")):
        problem = safetensors_problem(weights)
        if problem:
            raise ModelLoadError(f"{weights} {problem}")
    if not has_tokenizer(path):
        raise ModelLoadError(f"{path} has no tokenizer files (tokenizer.json, tokenizer_config.json, ...)")
    return path


def safetensors_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole safetensors file (a Git LFS pointer, a download or copy cut short), from
    its header alone; None when it looks whole. The format: an 8-byte little-endian header length, that much
    JSON naming each tensor's ``data_offsets``, then the data, which must reach the largest offset."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            head = handle.read(64)
            if head.startswith(b"version https://git-lfs"):
                return "is a Git LFS pointer, not the weights: fetch them (git lfs pull)"
            if len(head) < 8:
                return f"is {size} bytes, too short for a safetensors file"
            length = int.from_bytes(head[:8], "little")
            if length > min(size - 8, 100 * 2**20):
                return "does not start with a safetensors header (not such a file, or cut short)"
            handle.seek(8)
            header = json.loads(handle.read(length))
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "does not start with a safetensors header (not such a file, or cut short)"
    if not isinstance(header, dict):
        return "does not start with a safetensors header"
    ends = [
        int(t["data_offsets"][1])
        for name, t in header.items()
        if name != "__metadata__"
        and isinstance(t, dict)
        and isinstance(t.get("data_offsets"), list)
        and len(t["data_offsets"]) == 2
        and isinstance(t["data_offsets"][1], int)
    ]
    if ends and 8 + length + max(ends) > size:
        return f"is cut short: {size} bytes, its header needs {8 + length + max(ends)}"
    return None
