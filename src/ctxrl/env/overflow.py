"""The overflow store: where dropped, spilled and folded bodies go, and the stub that replaces them.

The standard stub (one line, in place of the body)::

    [overflow id=<short id> tool=<name> bytes=<n> call_id=<id> storage=disk]

A body's full id is the SHA-256 of its UTF-8 bytes (64 hex digits), so the same body always gets the same id
and the same file. The stub shows a **short id**: the shortest prefix of the full id, at least
:data:`MIN_PREFIX` hex digits, that is not a prefix of any other id of the episode's store when the body is
stored (a 64-digit id costs about 77 tokens of context, a short one about ten). A body keeps its short id for
the episode, even if a later id shares its prefix. ``tool`` / ``call_id`` are ``-`` for a body that is not a
tool result. ``read_overflow {id}`` gives the body back, by its short id, its full id or any unique prefix of
at least 8 hex digits.

Where bodies live: ``<root>/<sha256>.txt``, with ``root`` outside the episode workspace (see
:class:`ctxrl.env.mode_config.ModesConfig`), so the model's commands can neither read a body around the
harness nor corrupt one. A file is written to a temporary name in the same folder and renamed into place,
so a reader sees the whole body or none.

Memory-only storage writes nothing anywhere: the stub says ``storage=memory-only`` followed by a note that the
body cannot be restored, and ``get`` returns None.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from ctxrl.env.mode_config import Storage

STUB = "[overflow id={id} tool={tool} bytes={bytes} call_id={call_id} storage={storage}]"
MEMORY_ONLY_NOTE = " (not saved: this body cannot be restored)"
STUB_RE = re.compile(
    r"\[overflow id=(?P<id>[0-9a-f]{8,64}) tool=(?P<tool>\S+) bytes=(?P<bytes>\d+) "
    r"call_id=(?P<call_id>\S+) storage=(?P<storage>disk|memory-only)\]"
)
MIN_PREFIX = 8
"""Shortest id prefix ``get`` accepts."""


def body_id(body: str) -> str:
    """The content address of ``body``: SHA-256 of its UTF-8 bytes, hex."""
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def is_stub(text: str) -> bool:
    """True if ``text`` is an overflow stub (it starts with one), i.e. its body is already gone."""
    match = STUB_RE.match(text.lstrip())
    return match is not None


class OverflowStore:
    """Content-addressed bodies of one episode; ``root=None`` is memory-only (nothing kept at all)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self.ids: list[str] = []
        """Ids put in this episode, in order, without repeats."""
        self._short: dict[str, str] = {}
        """Full id -> the short id its stubs show (fixed when the body is first stored)."""
        self._full: dict[str, str] = {}
        """Short id -> full id (the inverse of ``_short``)."""

    @property
    def storage(self) -> Storage:
        return "memory-only" if self.root is None else "disk"

    def put(self, body: str) -> str:
        """Store ``body`` (atomically, once per content) and return its id."""
        oid = body_id(body)
        if oid not in self.ids:
            self.ids.append(oid)
            short = _shortest_unique(oid, self.ids)
            self._short[oid] = short
            self._full[short] = oid
        if self.root is not None:
            path = self.root / f"{oid}.txt"
            if not path.exists():
                self.root.mkdir(parents=True, exist_ok=True)
                tmp = self.root / f".{oid}.{os.getpid()}.tmp"
                tmp.write_text(body, encoding="utf-8", newline="")
                os.replace(tmp, path)
        return oid

    def short(self, oid: str) -> str:
        """The short id shown for the stored full id ``oid`` (``oid`` itself if this store never put it)."""
        return self._short.get(oid, oid)

    def stub(self, body: str, tool: str | None, call_id: str | None) -> str:
        """Store ``body`` and return the stub line that replaces it (with the body's short id)."""
        oid = self.put(body)
        line = STUB.format(
            id=self.short(oid),
            tool=tool or "-",
            bytes=len(body.encode("utf-8")),
            call_id=call_id or "-",
            storage=self.storage,
        )
        return line + MEMORY_ONLY_NOTE if self.root is None else line

    def resolve(self, ref: str) -> str | None:
        """The full id named by ``ref`` (a stub's short id, a full id, or a unique prefix of >= 8 hex digits),
        else None. Ids this store put come first; then the bodies already in its folder (put by an earlier
        store on the same folder), where the prefix must name exactly one."""
        ref = ref.strip().lower()
        if len(ref) < MIN_PREFIX or not re.fullmatch(r"[0-9a-f]+", ref):
            return None
        if ref in self._full:  # a short id stays valid when a later id happens to share its prefix
            return self._full[ref]
        known = [oid for oid in self.ids if oid.startswith(ref)]
        if len(known) == 1:
            return known[0]
        if self.root is not None and not known:  # stored earlier with the same store folder (another store)
            on_disk = sorted(path.stem for path in self.root.glob(f"{ref}*.txt"))
            if len(on_disk) == 1:
                return on_disk[0]
        return None

    def get(self, ref: str) -> str | None:
        """The body named by ``ref``, or None (unknown id, or memory-only storage)."""
        oid = self.resolve(ref)
        if oid is None or self.root is None:
            return None
        try:
            return (self.root / f"{oid}.txt").read_text(encoding="utf-8")
        except OSError:
            return None


def _shortest_unique(oid: str, ids: list[str]) -> str:
    """The shortest prefix of ``oid`` (at least :data:`MIN_PREFIX` digits) that no other id in ``ids`` starts with."""
    others = [other for other in ids if other != oid]
    for n in range(MIN_PREFIX, len(oid)):
        if not any(other.startswith(oid[:n]) for other in others):
            return oid[:n]
    return oid


# Identifiers a note or fold summary must keep verbatim: compaction must not paraphrase them away.
_IDENTIFIER_PATTERNS = (
    re.compile(r"\bapproval[_ -]?id\s*[=:]\s*[\w.-]+", re.IGNORECASE),
    re.compile(r"\b\w*id\s*[=:]\s*[\w.-]{3,}", re.IGNORECASE),
    re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.IGNORECASE),
    re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,64}\b"),
    re.compile(r"(?<![\w/.])(?:\.{0,2}/)?(?:[\w.-]+/)+[\w.-]+"),
    re.compile(r"\b[\w-]+\.(?:py|md|txt|json|jsonl|yaml|yml|toml|csv|log|rs|js|ts|c|h|cpp|go|sh|cfg|ini)\b"),
)
PRESERVED_HEADER = "Preserved (compaction-safe):"
MAX_PRESERVED = 40


def extract_identifiers(texts: list[str], limit: int = MAX_PRESERVED) -> list[str]:
    """Ids, hashes, paths and approval ids found in ``texts``, in order of first appearance, at most ``limit``."""
    found: dict[str, int] = {}
    for text in texts:
        hits = sorted(
            ((m.start(), m.group(0)) for pattern in _IDENTIFIER_PATTERNS for m in pattern.finditer(text)),
            key=lambda hit: hit[0],
        )
        for _, value in hits:
            if not re.search(r"[A-Za-z]", value):
                continue  # a ratio such as 597/3952 is no identifier
            if value not in found and not any(value in kept for kept in found):
                found[value] = len(found)
    return list(found)[:limit]


def preserved_block(identifiers: list[str]) -> str:
    """The block of identifiers kept in a note or summary (empty string when there are none)."""
    if not identifiers:
        return ""
    return "\n".join([PRESERVED_HEADER, *(f"- {value}" for value in identifiers)])
