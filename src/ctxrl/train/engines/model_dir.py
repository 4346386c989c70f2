"""Check that a folder holds a causal LM before any engine spends a minute starting on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctxrl.errors import ModelLoadError

_WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin", "model*.bin")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


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
        hint = " (it looks like a tokenizer-only folder)" if _has_tokenizer(path) else ""
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
    if not _has_tokenizer(path):
        raise ModelLoadError(f"{path} has no tokenizer files ({', '.join(_TOKENIZER_FILES)})")
    return path


def _has_tokenizer(path: Path) -> bool:
    return any((path / name).is_file() for name in _TOKENIZER_FILES)


def load_tokenizer(model_dir: str | Path) -> Any:
    """Load the tokenizer of a model folder (a tokenizer-only folder is fine).

    Raises :class:`ModelLoadError` naming the folder when there is none or transformers cannot read it.
    """
    path = Path(model_dir)
    if not path.is_dir():
        raise ModelLoadError(f"tokenizer folder {path} does not exist or is not a folder")
    if not _has_tokenizer(path):
        raise ModelLoadError(f"{path} has no tokenizer files ({', '.join(_TOKENIZER_FILES)})")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # OSError/ValueError/JSON errors from tokenizers: all mean "unreadable"
        raise ModelLoadError(f"transformers cannot load the tokenizer in {path}: {exc}") from None
