"""One context manager per mode: given the view and the solver's plan, the text of the next action.

Each manager is the function named after its mode (the registry, :mod:`ctxrl.env.modes`, names the
policy). A manager either passes the solver's task action through, or, when the latest budget readout is past
the compaction threshold, spends one step on one batched compaction that keeps the solver's facts
verbatim and removes the rest (never two compactions in a row, so a compaction that cannot get under the
threshold does not loop). Compactions print nothing, so they are free edit turns.

**The threshold comes from the skill.** The managers read it from the skill text in the system prompt they see,
the sentence "Compact when the context reaches N% of the limit." (:data:`ctxrl.env.skills.COMPACT_PATTERN`),
and use :data:`THRESHOLD` (60 %) when the skill states none, as the default skills do. So a rewritten skill
changes what a scripted policy does, as it would change what a model does: this is what lets skill evolution
be shown on a CPU with scripted policies. They read nothing else a model would not see. A caller may pass the
threshold explicitly instead (:class:`ctxrl.env.policies.ScriptedPolicy` does, to add its per-episode jitter).

| manager | mode | what it does |
|---|---|---|
| :func:`append` | ``append`` | never manages |
| :func:`harness` | ``harness`` | never manages (the harness spills and folds); restates its facts in its own message every step, as the mode's skill asks |
| :func:`tools` | ``tools`` | once the context tools are offered (tool list or offer note): one ``context_status`` (no readout in this mode); past the threshold ``context_drop`` of every result of 300+ characters still in context, by the handle each shows (``[r<round>.<i>]``), the facts in its own message (a ``context_note`` would carry a preserved-identifier block that costs more than it frees at small budgets), and restated in every later message (the pressure pass may fold the one that held them) |
| :func:`usage` | ``usage`` | when the usage block shows or the readout passes the threshold: ``evict_file_view`` of every open file view by the path the prompt shows and ``archive_thread`` of the turns up to its previous reclaim; with no view open, ``archive_thread`` of every finished turn; the facts in its own message |
| :func:`file` | ``file`` | rewrites the context file with one user note holding the facts (``cat > context.md <<'EOF'``) |
"""

from __future__ import annotations

import re
from typing import Protocol

from ctxrl.env.policies.view import (
    Call,
    Plan,
    View,
    facts_block,
    render_action,
    result_handle,
    strip_turn_header,
)
from ctxrl.env.skills import DEFAULT_COMPACT_PERCENT, compact_percent

THRESHOLD = DEFAULT_COMPACT_PERCENT / 100
"""Fill (latest readout / limit) from which a manager compacts when the skill in view states no threshold."""
DROP_MIN_CHARS = 300
"""Results shorter than this are left alone by the tools manager: their stub (~130 characters) would save little."""
_TURN = re.compile(r"\ATurn #(\d+)\n")
_RECLAIMS = ("[evict_file_view]", "[archive_thread]")
"""How the results of usage mode's reclaim calls begin."""
_TOP_VIEW = re.compile(r"^  - `([^`]+)`: [\d.]+%$", re.MULTILINE)
_VIEW_HEAD = re.compile(r"\A(?:File view: (.+)|File: (\S+?):\d+-\d+ of \d+ lines)$", re.MULTILINE)


class Manager(Protocol):
    """``manager(view, plan, threshold=None) -> action text``; ``threshold`` None: the skill's (:func:`threshold`)."""

    def __call__(self, view: View, plan: Plan, threshold: float | None = None) -> str: ...


def threshold(view: View) -> float:
    """The compaction threshold (a fill fraction) the skill in the view's system prompt states, else
    :data:`THRESHOLD`."""
    percent = compact_percent(view.system)
    return THRESHOLD if percent is None else percent / 100


def _past(view: View, limit: float | None) -> bool:
    return view.fill >= (threshold(view) if limit is None else limit)


def _due(view: View, limit: float | None) -> bool:
    return _past(view, limit) and not view.last_action_edited()


def append(view: View, plan: Plan, threshold: float | None = None) -> str:
    """The task action, nothing else."""
    return render_action(plan.calls)


def harness(view: View, plan: Plan, threshold: float | None = None) -> str:
    """The task action, with the facts restated in the message (the harness may spill the results)."""
    return render_action(plan.calls, prose=facts_block(plan.facts))


def tools(view: View, plan: Plan, threshold: float | None = None) -> str:
    """Once the context tools are offered: one ``context_status`` to read the usage (tools mode has no
    readout; later the reading is scaled by the growth of the text in view), then, past the threshold, one
    ``context_drop`` of every result still in context, each named by the handle its first line shows
    (``[r<round>.<i>]``), the facts written in this message (assistant messages are never dropped). Otherwise
    the task action, with the facts restated once the context tools are offered: the mode's pressure pass
    may fold old turns, a message holding facts among them, and the latest turns are never folded."""
    if "context_drop" not in view.tools:
        return render_action(plan.calls)
    facts = facts_block(plan.facts) if plan.facts else ""
    if view.tokens is None and not view.last_action_edited() and "context_status" not in view.last_calls():
        # tools mode shows no readout: ask once, then scale; the facts go with the call (the pressure pass may
        # spill the result just read before the next step, when the solver would have written them)
        return render_action([Call("context_status")], prose=facts)
    if _due(view, threshold):
        reading = max((i for i, item in enumerate(view.items) if item.name == "context_status"), default=-1)
        handles = [
            handle
            for i, item in enumerate(view.items)
            if item.role == "tool"
            and len(item.text) >= DROP_MIN_CHARS
            and i != reading  # the latest context_status result stays: later fills are scaled from it
            and (handle := result_handle(item.text))
        ][-64:]
        if handles:
            return render_action([Call("context_drop", {"handles": handles})], prose=facts_block(plan.facts))
    return render_action(plan.calls, prose=facts)


def open_views(view: View) -> list[str]:
    """The file views open in the prompt, by the path (or document key) ``evict_file_view`` takes: the usage
    block's Top File Views when it shows, else the heads of the results (``File view: <key>`` on a task
    tool's document read, ``File: <path>:<from>-<to> of`` on a ``read_file`` page), in order, once each."""
    if view.signal is not None and "- Top File Views:" in view.signal:
        return _TOP_VIEW.findall(view.signal.split("- Top File Views:", 1)[1])
    keys: list[str] = []
    for item in view.items:
        if item.role == "tool" and (m := _VIEW_HEAD.match(strip_turn_header(item.text))):
            key = m.group(1) or m.group(2)
            if key not in keys:
                keys.append(key)
    return keys


def usage(view: View, plan: Plan, threshold: float | None = None) -> str:
    """When the usage block shows or the readout passes the threshold: evict every open file view
    (:func:`open_views`, by the path the prompt shows; a file view can be read again) and archive the turns
    up to the previous reclaim (its kept facts are restated here); with no view open, archive every finished
    turn (by the turn numbers on the results). The facts are written in this message
    (which stays). Otherwise the task action."""
    if (view.signal is not None or _past(view, threshold)) and not view.last_action_edited():
        paths = open_views(view) if "evict_file_view" in view.tools else []
        rounds = [
            (int(m.group(1)), strip_turn_header(item.text))
            for item in view.items
            if item.role == "tool" and (m := _TURN.match(item.text))
        ]
        calls = [Call("evict_file_view", {"path": path}) for path in paths]
        if paths:  # archive what the previous reclaim left behind: its facts are restated in this message
            upto = max((r for r, text in rounds if text.startswith(_RECLAIMS)), default=0)
        else:
            upto = max((r for r, _ in rounds), default=0)
        if upto and "archive_thread" in view.tools:
            calls.append(Call("archive_thread", {"ranges": [[1, upto]]}))
        if calls:
            return render_action(calls, prose=facts_block(plan.facts))
    return render_action(plan.calls)


def file(view: View, plan: Plan, threshold: float | None = None) -> str:
    """Past the threshold: rewrite the context file as one user note holding the facts. Otherwise the task
    action."""
    if _due(view, threshold) and "shell" in view.tools:
        note = facts_block(plan.facts)
        command = f"cat > {view.context_file} <<'EOF'\n[[CTX_TURN 1 role=user]]\n{note}\nEOF"
        return render_action([Call("shell", {"command": command})])
    return render_action(plan.calls)
