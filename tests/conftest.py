"""Shared fixtures: the tiny model (built once per run) and one in-process vLLM engine per run.

Every test that can run on a CPU runs by default, vLLM ones included; ``gpu`` tests skip without CUDA.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model (seed 0), built once per test run."""
    from ctxrl.train.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def vllm_llm(tiny_model_dir: Path) -> Iterator[Any]:
    """One in-process ``vllm.LLM`` on the tiny model for the whole run (each start costs 30-110 s here)."""
    from ctxrl.train.vllm_local import make_llm

    llm = make_llm(tiny_model_dir, seed=0, max_model_len=8192)
    yield llm
    del llm
