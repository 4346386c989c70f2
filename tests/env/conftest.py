"""Fixtures of the harness tests: a token counter on the tiny tokenizer and a harness factory.

Commands run with the sandbox's ``none`` backend (these tests are about the harness, not isolation), which
warns by design on every episode; the factory checks that it does (the warning is expected, not silenced).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ctxrl.env.config import HarnessConfig
from ctxrl.env.context import ChatTemplateCounter
from ctxrl.env.harness import Harness
from ctxrl.env.sandbox import SandboxConfig

SYSTEM = "You are an agent. Manage your context file."
TASK = "Find the key in data.txt and submit it."


@pytest.fixture(scope="session")
def counter(tiny_tokenizer: Any) -> ChatTemplateCounter:
    return ChatTemplateCounter(tiny_tokenizer)


@pytest.fixture
def make_harness(counter: ChatTemplateCounter, tmp_path: Path) -> Callable[..., Harness]:
    """``make_harness(**config_fields)`` -> a reset harness on the ``none`` sandbox in a fresh workspace."""

    def make(**fields: Any) -> Harness:
        fields.setdefault("sandbox", SandboxConfig(backend="none", timeout_s=20))
        harness = Harness(HarnessConfig(**fields), counter)
        if fields["sandbox"].backend == "none":  # the unisolated backend must say so, every episode
            with pytest.warns(RuntimeWarning, match="unisolated"):
                harness.reset(SYSTEM, TASK, tmp_path / "ws")
        else:
            harness.reset(SYSTEM, TASK, tmp_path / "ws")
        return harness

    return make
