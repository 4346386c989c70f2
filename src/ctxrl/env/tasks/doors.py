"""Toy family ``doors``: the golden learning tasks, small enough that the tiny model learns them in minutes.

Not a benchmark family (it is not among the built-in families that "all families" means): it exists to show
that the whole training loop learns, the way CartPole shows it for a classic RL library. Two levels:

- ``bandit``: eight doors are listed in a random order; the same door (:data:`OPEN_DOOR`) opens in every task,
  and nothing in the prompt says which. A policy that picks a listed door at random succeeds one time in
  eight; only reward can teach it the right one.
- ``detour``: only the open door is listed, and the task asks for one shell command before the answer:
  either echo the door's name, or write a note into the context file. Both then succeed; the note is an
  edit (a rebuilt prompt: more prefix-reuse compute for the same success). Only the efficiency channel can
  tell the two apart, and the choice is one token after ``echo``, so a tiny model can make it.

:func:`demonstrator` is the scripted teacher of the supervised start: it sees only the prompt text, picks a
listed door uniformly (by a hash of the task text), and on ``detour`` writes the note (rather than echoing the
door) in about half the tasks, by the same hash.
"""

from __future__ import annotations

import hashlib
import json
import re

from ctxrl.env.tasks import _gen
from ctxrl.env.tasks.base import Task, VerifierSpec
from ctxrl.env.tasks.splits import split_of

FAMILY = "doors"
DOORS = ("amber", "cobalt", "crimson", "ivory", "jade", "onyx", "scarlet", "violet")
OPEN_DOOR = "amber"
"""The door that opens in every ``bandit`` task."""
PRESETS = {"bandit": len(DOORS), "detour": 1}
"""Level -> doors listed."""
NOTE = "note:"
"""How the demonstrator's context note begins (``detour``)."""

_ASSISTANT = "<|im_start|>assistant"
_LISTED = re.compile(r"^Doors: (.+)$", re.MULTILINE)


def generate(seed: int, difficulty: str = "bandit") -> Task:
    """The ``doors`` task for ``seed`` at ``difficulty`` (``bandit`` / ``detour``)."""
    n = _gen.pick_preset(PRESETS, FAMILY, difficulty)
    r = _gen.rng(FAMILY, seed, difficulty)
    doors = list(DOORS)
    r.shuffle(doors)
    listed = doors if n == len(DOORS) else [OPEN_DOOR]
    hall = f"hall-{r.randint(100, 999)}"
    prompt = f"You stand in {hall}.\nDoors: {', '.join(listed)}\n" + (
        "Exactly one of these doors opens. Call submit with its name as the answer."
        if n > 1
        else "First run one shell command: echo the door's name, or write a note into your context. Then call "
        "submit with the door's name."
    )
    return Task(
        task_id=f"{FAMILY}:{difficulty}:{seed}",
        family=FAMILY,
        split=split_of(seed),
        seed=seed,
        difficulty=difficulty,
        prompt=prompt,
        files={},
        tools=[],
        verifier=VerifierSpec(kind="exact", expected=OPEN_DOOR),
        budget_tokens=3000,
        max_steps=3,
        metadata={"doors": listed, "oracle_answer": OPEN_DOOR},
    )


def _call(name: str, arguments: dict[str, str]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def demonstrator(prompt: str, *, context_file: str = "context.md") -> str:
    """The next action of the scripted teacher for the ``doors`` task in ``prompt`` (a file-mode prompt text).

    It reads the listed doors (the last ``Doors:`` line of the prompt) and picks one by a hash of the hall and
    that line. On a one-door task its first action is ``echo X``, or, when the same hash says so, the note
    ``echo note: X >> context.md`` (an edit); once it has acted, it submits. Nothing but the prompt text
    reaches it.
    """
    found = _LISTED.findall(prompt)
    if not found:
        return "I see no doors here."
    doors = [d.strip() for d in found[-1].split(",") if d.strip()]
    hall = re.findall(r"You stand in (\S+)\.", prompt)
    digest = hashlib.sha256(f"{hall[-1] if hall else ''}\n{found[-1]}".encode()).digest()
    door = doors[digest[0] % len(doors)]
    if len(doors) == 1 and prompt.count(_ASSISTANT) < 2:  # the one-door task's shell command comes first
        command = f"echo {NOTE} {door} >> {context_file}" if digest[1] % 2 == 0 else f"echo {door}"
        return _call("shell", {"command": command})
    return _call("submit", {"answer": door})
