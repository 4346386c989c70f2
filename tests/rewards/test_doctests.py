"""Run the doctests of ``ctxrl.rewards`` (pytest's testpaths is ``tests/``, so they are collected here)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["ctxrl.rewards", "ctxrl.rewards.cost", "ctxrl.rewards.advantages", "ctxrl.rewards.masks"]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
    if name != "ctxrl.rewards":
        assert result.attempted > 0


def test_every_public_function_has_a_contract() -> None:
    import ctxrl.rewards as rewards

    for name in rewards.__all__:
        obj = getattr(rewards, name)
        assert obj.__doc__ and len(obj.__doc__.strip()) > 20, name
