"""Run the doctests of the trainer's pure modules (pytest's testpaths is ``tests/``)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "ctxrl.train.rows",
    "ctxrl.train.loss",
    "ctxrl.train.sft",
    "ctxrl.train.attention",
    "ctxrl.train.config",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
    assert result.attempted > 0
