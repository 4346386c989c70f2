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


NEEDS_A_TOKENIZER = {"edit_mask", "token_char_spans"}
"""Public functions whose examples need a tokenizer: their contracts are tested in ``test_masks.py``."""


def test_every_public_function_has_a_contract() -> None:
    """Every public name is documented, and every public function shows a doctest example (run above)."""
    import inspect

    import ctxrl.rewards as rewards

    finder = doctest.DocTestFinder(recurse=False)
    for name in rewards.__all__:
        obj = getattr(rewards, name)
        assert obj.__doc__ and obj.__doc__.strip(), f"{name} has no docstring"
        if inspect.isfunction(obj) and name not in NEEDS_A_TOKENIZER:
            examples = [e for test in finder.find(obj, name) for e in test.examples]
            assert examples, f"{name} has no doctest example"
