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
| :func:`tools` | ``tools`` | once the context tools are offered (tool list or offer note): ``context_drop`` of every result of 300+ characters still in context, by the handle each shows (``[r<round>.<i>]``), the facts in its own message (a ``context_note`` would carry a preserved-identifier block that costs more than it frees at small budgets) |
| :func:`usage` | ``usage`` | when the usage block shows or the readout passes the threshold: ``evict_file_view`` (if file views are open) and ``archive_thread`` of every finished turn, the facts in its own message |
| :func:`file` | ``file`` | rewrites the context file with one user note holding the facts (``cat > context.md <<'EOF'``) |
"""

from __future__ import annotations

import re
from typing import Protocol

from ctxrl.env.policies.view import Call, Plan, View, facts_block, render_action, result_handle
from ctxrl.env.skills import DEFAULT_COMPACT_PERCENT, compact_percent

THRESHOLD = DEFAULT_COMPACT_PERCENT / 100
"""Fill (latest readout / limit) from which a manager compacts when the skill in view states no threshold."""
DROP_MIN_CHARS = 300
"""Results shorter than this are left alone by the tools manager: their stub (~130 characters) would save little."""
_TURN = re.compile(r"\ATurn #(\d+)\n")


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
    """Past the threshold (and once the context tools are offered): one ``context_drop`` of every result still
    in context, each named by the handle its first line shows (``[r<round>.<i>]``), the facts written in this
    message (assistant messages are never dropped). Otherwise the task action."""
    if _due(view, threshold) and "context_drop" in view.tools:
        handles = [
            handle
            for item in view.items
            if item.role == "tool"
            and len(item.text) >= DROP_MIN_CHARS
            and (handle := result_handle(item.text))
        ][-64:]
        if handles:
            return render_action([Call("context_drop", {"handles": handles})], prose=facts_block(plan.facts))
    return render_action(plan.calls)


def usage(view: View, plan: Plan, threshold: float | None = None) -> str:
    """When the usage block shows or the readout passes the threshold: evict the open file views and archive
    every finished turn, the facts written in this message (which stays). Otherwise the task action."""
    if (view.signal is not None or _past(view, threshold)) and not view.last_action_edited():
        rounds = [
            int(m.group(1)) for item in view.items if item.role == "tool" and (m := _TURN.match(item.text))
        ]
        views_open = any(
            item.name == "read_file" and not item.text.startswith("[file view evicted") for item in view.items
        )
        calls = []
        if views_open and "evict_file_view" in view.tools:
            calls.append(Call("evict_file_view"))
        if rounds and "archive_thread" in view.tools:
            calls.append(Call("archive_thread", {"ranges": [[1, max(rounds)]]}))
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
