"""The default context-management skills and the system prompt that carries them.

A **skill** is the markdown text in the system prompt that steers how the model manages its context; skill
evolution rewrites it. The defaults below state the operating rules of the reference work (batch edits, mind
the tail, be generous in the replacement) for each mode's means; they are starting points, not tuned text.
The mode registry (:mod:`ctxrl.env.modes`) says which skill is whose; ``default_skill(mode)`` there.
"""

from __future__ import annotations

import re

BASE_PROMPT = (
    "You are an agent working in a sandboxed workspace. Use the tools to do the task, then call submit with "
    "your final answer. Your context window is limited."
)
READOUT_SENTENCE = " Every tool result shows how full it is."
"""Added to the base prompt where the mode shows the budget readout (file mode by default)."""

# The reference work's three cost rules, in each mode's own terms: every edit makes everything after it be
# re-read (batch edits), an edit near the end is cheap and one near the start costs the whole tail (mind
# the tail), and a thin replacement forces re-reading the originals (be generous in the replacement).
FILE_SKILL = (
    "## Managing your context\n"
    "Everything after the task is mirrored to the file {context_file}, one `[[CTX_TURN n role=...]]` header "
    "per turn. Edit it with ordinary shell tools (sed, python3, heredocs); the next prompt is built from "
    "it. Keep exact values verbatim.\n"
    "- Batch your edits: each edit makes everything after it be re-read, so prefer one larger edit over "
    "many small ones.\n"
    "- Mind the tail: editing near the end is cheap; editing near the top makes the whole rest be re-read, "
    "so do it rarely and only when it frees a lot.\n"
    "- Be generous in the replacement: write a detailed note with every value you will need, or you will "
    "pay to read the originals again."
)
TOOLS_SKILL = (
    "## Managing your context\n"
    "Use context_status to see what fills your window, context_drop or context_note to move old results "
    "out (they stay restorable with read_overflow), and context_pin for what must stay. Keep exact values.\n"
    "- Batch: one context_note or context_drop naming several handles costs one re-read; several calls "
    "cost several.\n"
    "- Mind the tail: dropping the newest results is cheap; dropping early ones makes everything after "
    "them be re-read, so do it rarely and for large results.\n"
    "- Be generous in the note: put every value you will need into the context_note text, or you will "
    "pay for read_overflow later."
)
USAGE_SKILL = (
    "## Managing your context\n"
    "When the Context Usage block appears, reclaim space: evict file views you can re-read, and archive "
    "finished turns with archive_thread (search_archive brings them back).\n"
    "- Batch: evict and archive in one step; each reclaim makes everything after it be re-read.\n"
    "- Mind the tail: archiving or evicting early turns makes the whole rest be re-read; reclaim rarely "
    "and a lot at a time.\n"
    "- Be generous before you reclaim: write the exact values you still need in your own message, which "
    "stays, so you do not have to search or re-read later."
)
HARNESS_SKILL = (
    "## Your context\nOld and large tool results are moved out of your context automatically; "
    "note exact values you will need in your own messages."
)
APPEND_SKILL = "## Your context\nNothing is removed from your context; it fails when full. Be brief."


COMPACT_SENTENCE = "Compact when the context reaches {percent}% of the limit."
"""The habit sentence that states a compaction threshold; skill evolution's offline proposer edits it."""
COMPACT_PATTERN = re.compile(r"Compact when the context reaches (\d{1,3})% of the limit\.")
DEFAULT_COMPACT_PERCENT = 60
"""The threshold a skill that states no compaction sentence is taken to have."""


def compact_percent(text: str) -> int | None:
    """The compaction threshold ``text`` states (percent of the limit; the first sentence counts), or None.

    >>> compact_percent("Keep values. Compact when the context reaches 45% of the limit.")
    45
    """
    match = COMPACT_PATTERN.search(text)
    return int(match.group(1)) if match else None


def system_prompt(skill: str, context_file: str = "context.md", *, readout: bool = True) -> str:
    """The system prompt for one episode: the base instructions (saying that tool results show the budget
    only where ``readout`` is on), then the skill (``{context_file}`` in the skill is replaced by the file's
    name)."""
    base = BASE_PROMPT + (READOUT_SENTENCE if readout else "")
    return f"{base}\n\n{skill.strip().replace('{context_file}', context_file)}\n"
