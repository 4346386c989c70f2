"""The lineage: every skill an evolution run proposed, every graded episode, every gate decision, in SQLite.

    lineage = Lineage.open("runs/evolve1", mode="file")   # creates the run, or resumes it as it was
    inc = lineage.incumbent()                               # also in runs/evolve1/best_skill/SKILL.md
    lineage.begin_round(1)
    if not lineage.graded(inc.id, "train", 1) >= wanted: ...
    lineage.record_episode(inc.id, "train", 1, repeat=0, record=episode)   # committed before it returns
    lineage.record_proposals(1, skills, dropped)           # one transaction
    k = lineage.gate_index(candidate.id)                    # the proposal's number in the night, fixed once
    lineage.decide(candidate.id, decision)
    lineage.finish_round(1, winner_id)                      # new incumbent, then best_skill/SKILL.md

Files in the run folder: ``lineage.sqlite`` (WAL journal, ``synchronous=FULL``) and ``best_skill/SKILL.md``,
the incumbent as a skill file (:meth:`ctxrl.evolve.skill.Skill.to_markdown`), replaced atomically (temporary
file, fsync, ``os.replace``, fsync of the folder).

**Crash safety.** Every graded episode is committed as it is recorded, keyed by (skill, split, round, task,
seed, repeat): after ``kill -9`` at any point, a reopened run has every episode that was recorded, none twice
(re-recording a key is refused, :meth:`record_episode` returns False), and a round's driver asks
:meth:`graded` which episodes remain. The database is the source of truth: a ``SKILL.md`` that a crash left
behind the database is rewritten on open. The proposals of a round go in with one transaction, so a resumed
round never sees half of them, and an LLM proposer is not asked twice. A candidate's proposal number (the
``k`` of the gate's alpha spending) is assigned once and kept, so a resumed gate spends no new alpha.

Episodes are stored with their step digests (tool calls, receipts, nudges, context sizes: what
:mod:`ctxrl.evolve.notes` reads) but without the token ids and logprobs, which evolution never uses.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxrl.errors import CtxrlError
from ctxrl.evolve.gate import GateDecision
from ctxrl.evolve.skill import Dropped, Skill, SkillFormatError, parse_skill, seed_skill, split_frontmatter
from ctxrl.train.trajectory import EpisodeRecord

DB_NAME = "lineage.sqlite"
BEST = Path("best_skill") / "SKILL.md"
SPLITS = ("train", "dev", "test")
SCHEMA_VERSION = "1"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS candidates (
    id TEXT PRIMARY KEY, parent TEXT, round INTEGER NOT NULL, slot INTEGER NOT NULL, mode TEXT NOT NULL,
    text TEXT NOT NULL, status TEXT NOT NULL, proposal_k INTEGER UNIQUE, decision TEXT,
    created REAL NOT NULL, decided REAL
);
CREATE TABLE IF NOT EXISTS dropped (
    round INTEGER NOT NULL, slot INTEGER NOT NULL, text TEXT NOT NULL, reason TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (round, slot)
);
CREATE TABLE IF NOT EXISTS episodes (
    skill TEXT NOT NULL, split TEXT NOT NULL, round INTEGER NOT NULL, task_id TEXT NOT NULL, seed INTEGER NOT NULL,
    repeat INTEGER NOT NULL, success INTEGER NOT NULL, score REAL NOT NULL, cost REAL NOT NULL,
    end_reason TEXT NOT NULL, record TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (skill, split, round, task_id, seed, repeat)
);
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY, incumbent TEXT NOT NULL, proposed INTEGER NOT NULL DEFAULT 0,
    winner TEXT, started REAL NOT NULL, finished REAL
);
"""

_HEAVY_STEP_KEYS = ("prompt_ids", "token_ids", "logprobs", "edit_mask")


class LineageError(CtxrlError):
    """The run folder cannot be used as asked (another mode, an unknown skill, a round out of order)."""


@dataclass(frozen=True)
class CandidateRow:
    """One candidate as the lineage holds it."""

    skill: Skill
    round: int
    slot: int
    status: str
    """``seed``, ``pending`` (not yet decided), ``accepted``, ``rejected``."""
    proposal_k: int | None
    decision: dict[str, Any] | None
    created: float
    decided: float | None


@dataclass(frozen=True)
class CandidateSummary:
    """The read side for a report: one candidate with its dev episodes' mean score and cost."""

    id: str
    parent: str | None
    round: int
    score: float | None
    """Mean score of its dev episodes in its round (None: none graded yet)."""
    cost: float | None
    status: str
    chars: int = 0
    """Length of its body in characters (the skill-length curve)."""
    in_pool: bool = False
    """In the Pareto pool (:func:`pareto_pool`)."""


def read_candidates(path: str | Path) -> list[CandidateSummary]:
    """Every candidate of the lineage database ``path`` (opened read-only), by round; LineageError when the
    file is not such a database."""
    path = Path(path)
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise LineageError(f"{path.name}: cannot open it ({exc})") from None
    try:
        rows = con.execute(
            'SELECT c."id", c."parent", c."round", AVG(e."score"), AVG(e."cost"), c."status", c."text" '
            'FROM candidates c LEFT JOIN episodes e ON e."skill" = c."id" AND e."split" = \'dev\' '
            'AND e."round" = c."round" GROUP BY c."id" ORDER BY c."round", c.rowid'
        ).fetchall()
        incumbent = con.execute("SELECT value FROM meta WHERE key = 'incumbent'").fetchone()
        pool = dict(pareto_pool(con, None if incumbent is None else str(incumbent[0])))
    except sqlite3.Error as exc:
        raise LineageError(f"{path.name} is no lineage database ({exc})") from None
    finally:
        con.close()
    return [
        CandidateSummary(
            str(cid),
            None if parent in (None, "") else str(parent),
            int(rnd),
            None if score is None else float(score),
            None if cost is None else float(cost),
            str(status),
            _body_chars(str(text)),
            str(cid) in pool,
        )
        for cid, parent, rnd, score, cost, status, text in rows
    ]


def _body_chars(text: str) -> int:
    """Length of a stored skill's body (the whole text where it has no frontmatter)."""
    try:
        return len(split_frontmatter(text)[1])
    except SkillFormatError:
        return len(text.strip())


def pareto_pool(
    conn: sqlite3.Connection, incumbent: str | None, before_round: int | None = None
) -> list[tuple[str, int]]:
    """The Pareto pool of a lineage database (see :meth:`Lineage.pool`): ``(skill id, wins)``."""
    sql = "SELECT round, task_id, seed, skill, AVG(score) FROM episodes WHERE split = 'dev'"
    args: tuple[int, ...] = ()
    if before_round is not None:
        sql += " AND round < ?"
        args = (before_round,)
    rows = conn.execute(sql + " GROUP BY round, task_id, seed, skill", args).fetchall()
    by_task: dict[tuple[int, str, int], dict[str, float]] = defaultdict(dict)
    for rnd, task, seed, skill, score in rows:
        by_task[(rnd, task, seed)][skill] = float(score)
    wins: dict[str, int] = defaultdict(int)
    for scores in by_task.values():
        best, worst = max(scores.values()), min(scores.values())
        if best > worst:
            for skill, score in scores.items():
                if score == best:
                    wins[skill] += 1
    order = [row[0] for row in conn.execute("SELECT id FROM candidates ORDER BY round, slot, rowid")]
    return [(sid, wins.get(sid, 0)) for sid in order if sid == incumbent or wins.get(sid, 0) > 0]


def _slim(record: EpisodeRecord) -> str:
    data = record.to_dict()
    for step in data["steps"]:
        for key in _HEAVY_STEP_KEYS:
            step[key] = []
    return json.dumps(data, ensure_ascii=False, sort_keys=True)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that a reader (or a crash) sees the old file or the new, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself is durable only once the folder is synced
    finally:
        os.close(fd)


class Lineage:
    """The evolution state of one run folder. Open with :meth:`open`; one process at a time."""

    def __init__(self, run_dir: Path, conn: sqlite3.Connection) -> None:
        self.run_dir = run_dir
        self._conn = conn

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, run_dir: str | Path, *, mode: str, seed: Skill | None = None) -> Lineage:
        """Open the run in ``run_dir``, creating it with ``seed`` (default: the mode's default skill) as the
        round-0 incumbent. An existing run must be of the same ``mode``; its ``seed`` argument is ignored."""
        root = Path(run_dir)
        root.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(root / DB_NAME, isolation_level=None, timeout=30.0)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise LineageError(f"{root / DB_NAME} is not a usable lineage database ({exc})") from None
        self = cls(root, conn)
        stored_mode = self._meta("mode")
        if stored_mode is None:
            skill = seed if seed is not None else seed_skill(mode)
            if skill.mode != mode or skill.parent is not None or skill.round != 0:
                raise LineageError("a seed skill must be of the run's mode, with no parent, in round 0")
            now = time.time()
            with self._tx():
                self._put_meta("schema", SCHEMA_VERSION)
                self._put_meta("mode", mode)
                self._put_meta("seed", skill.id)
                self._put_meta("incumbent", skill.id)
                conn.execute(
                    "INSERT INTO candidates (id, parent, round, slot, mode, text, status, created) "
                    "VALUES (?, NULL, 0, 0, ?, ?, 'seed', ?)",
                    (skill.id, mode, skill.to_markdown(), now),
                )
        elif stored_mode != mode:
            raise LineageError(f"{root} is an evolution run of mode {stored_mode!r}, not {mode!r}")
        self._sync_best()
        return self

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Lineage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _meta(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _put_meta(self, key: str, value: str) -> None:
        self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def _sync_best(self) -> None:
        """Make best_skill/SKILL.md the incumbent (after a crash between commit and file write)."""
        want = self.incumbent().to_markdown()
        path = self.run_dir / BEST
        if not path.exists() or path.read_text(encoding="utf-8") != want:
            write_atomic(path, want)

    # ------------------------------------------------------------------ skills

    @property
    def mode(self) -> str:
        value = self._meta("mode")
        assert value is not None
        return value

    def skill(self, skill_id: str) -> Skill:
        row = self._conn.execute("SELECT text FROM candidates WHERE id = ?", (skill_id,)).fetchone()
        if row is None:
            raise LineageError(f"no skill {skill_id!r} in {self.run_dir}")
        return parse_skill(row[0])

    def incumbent(self) -> Skill:
        value = self._meta("incumbent")
        assert value is not None
        return self.skill(value)

    def seed(self) -> Skill:
        value = self._meta("seed")
        assert value is not None
        return self.skill(value)

    def candidates(self, round: int | None = None, status: str | None = None) -> list[CandidateRow]:
        """Candidates (in round, then slot order), optionally of one round and/or status."""
        sql = "SELECT text, round, slot, status, proposal_k, decision, created, decided FROM candidates"
        where: list[str] = []
        args: list[int | str] = []
        if round is not None:
            where.append("round = ?")
            args.append(round)
        if status is not None:
            where.append("status = ?")
            args.append(status)
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self._conn.execute(sql + " ORDER BY round, slot", args).fetchall()
        return [
            CandidateRow(
                skill=parse_skill(text),
                round=r,
                slot=slot,
                status=st,
                proposal_k=k,
                decision=None if dec is None else json.loads(dec),
                created=created,
                decided=decided,
            )
            for text, r, slot, st, k, dec, created, decided in rows
        ]

    def dropped(self, round: int | None = None) -> list[tuple[int, int, str]]:
        """(round, slot, reason) of every dropped candidate."""
        sql = "SELECT round, slot, reason FROM dropped"
        rows = (
            self._conn.execute(sql + " WHERE round = ? ORDER BY slot", (round,))
            if round is not None
            else self._conn.execute(sql + " ORDER BY round, slot")
        ).fetchall()
        return [(r, s, reason) for r, s, reason in rows]

    # ------------------------------------------------------------------ rounds

    def current_round(self) -> int:
        """The last round begun (0 before any)."""
        row = self._conn.execute("SELECT MAX(round) FROM rounds").fetchone()
        return int(row[0] or 0)

    def round_finished(self, round: int) -> bool:
        row = self._conn.execute("SELECT finished FROM rounds WHERE round = ?", (round,)).fetchone()
        return row is not None and row[0] is not None

    def round_incumbent(self, round: int) -> str | None:
        """The id of the incumbent ``round`` began with (None if it has not begun)."""
        row = self._conn.execute("SELECT incumbent FROM rounds WHERE round = ?", (round,)).fetchone()
        return None if row is None else str(row[0])

    def round_winner(self, round: int) -> str | None:
        """The id of the candidate ``round`` promoted (None: none, or the round is not finished)."""
        row = self._conn.execute("SELECT winner FROM rounds WHERE round = ?", (round,)).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    def round_parent(self, round: int) -> str | None:
        """The id of the skill that ran ``round``'s train tasks, its proposals' parent (None before any)."""
        row = self._conn.execute(
            "SELECT skill FROM episodes WHERE split = 'train' AND round = ? LIMIT 1", (round,)
        ).fetchone()
        return None if row is None else str(row[0])

    def begin_round(self, round: int) -> None:
        """Start ``round`` with the current incumbent; a no-op if it was begun already (a resumed run)."""
        with self._tx() as conn:
            row = conn.execute("SELECT round FROM rounds WHERE round = ?", (round,)).fetchone()
            if row is not None:
                return
            last = conn.execute("SELECT MAX(round), MIN(finished IS NOT NULL) FROM rounds").fetchone()
            if last[0] is not None and (round != last[0] + 1 or not last[1]):
                raise LineageError(
                    f"round {round} cannot begin: round {last[0]} is the last and must be finished"
                )
            if last[0] is None and round != 1:
                raise LineageError(f"the first round is 1, not {round}")
            conn.execute(
                "INSERT INTO rounds (round, incumbent, started) VALUES (?, ?, ?)",
                (round, self._meta("incumbent"), time.time()),
            )

    def proposed(self, round: int) -> bool:
        """Whether the proposals of ``round`` have been recorded."""
        row = self._conn.execute("SELECT proposed FROM rounds WHERE round = ?", (round,)).fetchone()
        return bool(row and row[0])

    def record_proposals(self, round: int, outcomes: Sequence[Skill | Dropped]) -> None:
        """Record a round's validated proposals, in slot order, in one transaction. A candidate whose body the
        lineage already holds is recorded as dropped (a duplicate), not evaluated again."""
        now = time.time()
        with self._tx() as conn:
            row = conn.execute("SELECT proposed FROM rounds WHERE round = ?", (round,)).fetchone()
            if row is None:
                raise LineageError(f"round {round} has not begun")
            if row[0]:
                raise LineageError(f"the proposals of round {round} are recorded already")
            for slot, item in enumerate(outcomes):
                if isinstance(item, Skill):
                    if item.round != round or item.mode != self.mode:
                        raise LineageError(
                            f"candidate of round {item.round}, mode {item.mode} in round {round}"
                        )
                    seen = conn.execute("SELECT round FROM candidates WHERE id = ?", (item.id,)).fetchone()
                    if seen is None:
                        conn.execute(
                            "INSERT INTO candidates (id, parent, round, slot, mode, text, status, created) "
                            "VALUES (?, ?, ?, ?, ?, ?, 'pending', ?)",
                            (item.id, item.parent, round, slot, item.mode, item.to_markdown(), now),
                        )
                        continue
                    item = Dropped(item.to_markdown(), f"duplicate of skill {item.id} (round {seen[0]})")
                conn.execute(
                    "INSERT INTO dropped (round, slot, text, reason, created) VALUES (?, ?, ?, ?, ?)",
                    (round, slot, item.text, item.reason, now),
                )
            conn.execute("UPDATE rounds SET proposed = 1 WHERE round = ?", (round,))

    def gate_index(self, skill_id: str) -> int:
        """The candidate's proposal number in the night (1, 2, ...), assigned at its first call and kept."""
        with self._tx() as conn:
            row = conn.execute("SELECT proposal_k FROM candidates WHERE id = ?", (skill_id,)).fetchone()
            if row is None:
                raise LineageError(f"no candidate {skill_id!r}")
            if row[0] is not None:
                return int(row[0])
            k = int(conn.execute("SELECT COALESCE(MAX(proposal_k), 0) + 1 FROM candidates").fetchone()[0])
            conn.execute("UPDATE candidates SET proposal_k = ? WHERE id = ?", (k, skill_id))
            return k

    def decide(self, skill_id: str, decision: GateDecision) -> None:
        """Store the gate's decision on a pending candidate (accepted or rejected; not yet the incumbent)."""
        with self._tx() as conn:
            row = conn.execute("SELECT status FROM candidates WHERE id = ?", (skill_id,)).fetchone()
            if row is None or row[0] != "pending":
                raise LineageError(f"candidate {skill_id!r} is not pending (status {row and row[0]})")
            conn.execute(
                "UPDATE candidates SET status = ?, decision = ?, decided = ? WHERE id = ?",
                (
                    "accepted" if decision.accept else "rejected",
                    json.dumps(decision.to_dict(), sort_keys=True),
                    time.time(),
                    skill_id,
                ),
            )

    def finish_round(self, round: int, winner: str | None) -> None:
        """End ``round``: ``winner`` (an accepted candidate of the round, or None) becomes the incumbent, in the
        same transaction; then best_skill/SKILL.md is rewritten."""
        with self._tx() as conn:
            row = conn.execute("SELECT finished FROM rounds WHERE round = ?", (round,)).fetchone()
            if row is None:
                raise LineageError(f"round {round} has not begun")
            if row[0] is not None:
                return
            pending = conn.execute(
                "SELECT COUNT(*) FROM candidates WHERE round = ? AND status = 'pending'", (round,)
            ).fetchone()[0]
            if pending:
                raise LineageError(f"round {round} still has {pending} undecided candidate(s)")
            if winner is not None:
                st = conn.execute("SELECT status, round FROM candidates WHERE id = ?", (winner,)).fetchone()
                if st is None or st[0] != "accepted" or st[1] != round:
                    raise LineageError(f"{winner!r} is not an accepted candidate of round {round}")
                self._put_meta("incumbent", winner)
            conn.execute(
                "UPDATE rounds SET winner = ?, finished = ? WHERE round = ?", (winner, time.time(), round)
            )
        self._sync_best()

    # ------------------------------------------------------------------ episodes

    def record_episode(
        self,
        skill_id: str,
        split: str,
        round: int,
        *,
        repeat: int,
        record: EpisodeRecord,
    ) -> bool:
        """Commit one graded episode; True if new, False if this (skill, split, round, task, seed, repeat) is
        recorded already (the stored one is kept: nothing is duplicated)."""
        if split not in SPLITS:
            raise LineageError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
        if record.skill_id != skill_id:
            raise LineageError(f"episode ran skill {record.skill_id}, recorded as {skill_id}")
        cur = self._conn.execute(
            "INSERT OR IGNORE INTO episodes (skill, split, round, task_id, seed, repeat, success, score, cost, "
            "end_reason, record, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                skill_id,
                split,
                round,
                record.task_id,
                record.seed,
                repeat,
                int(record.success),
                record.score,
                record.cost_tokens,
                record.end_reason,
                _slim(record),
                time.time(),
            ),
        )  # autocommit: durable when this returns
        return cur.rowcount == 1

    def graded(self, skill_id: str, split: str, round: int) -> set[tuple[str, int, int]]:
        """(task_id, seed, repeat) of the episodes recorded for this skill, split and round."""
        rows = self._conn.execute(
            "SELECT task_id, seed, repeat FROM episodes WHERE skill = ? AND split = ? AND round = ?",
            (skill_id, split, round),
        ).fetchall()
        return {(t, s, r) for t, s, r in rows}

    def scores(
        self, skill_id: str, split: str, round: int, tasks: Iterable[str] | None = None
    ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
        """Per-task lists of scores and of costs (the input of :func:`ctxrl.evolve.gate.pair`), in repeat order;
        restricted to ``tasks`` if given."""
        rows = self._conn.execute(
            "SELECT task_id, score, cost FROM episodes WHERE skill = ? AND split = ? AND round = ? "
            "ORDER BY task_id, seed, repeat",
            (skill_id, split, round),
        ).fetchall()
        keep = None if tasks is None else set(tasks)
        scores: dict[str, list[float]] = defaultdict(list)
        costs: dict[str, list[float]] = defaultdict(list)
        for task, score, cost in rows:
            if keep is None or task in keep:
                scores[task].append(score)
                costs[task].append(cost)
        return dict(scores), dict(costs)

    def pool(self, before_round: int | None = None) -> list[tuple[str, int]]:
        """The Pareto pool: ``(skill id, wins)`` of the incumbent and of every skill best on at least one dev
        task, in the order the skills entered the lineage.

        A dev task of a round counts for the skills that ran it (the round's incumbent and its candidates, on
        the same seeds): each skill whose mean score on it equals the best gets a win, when some skill that ran
        it scored lower (a task every skill solves equally picks no one). Only rounds before ``before_round``
        count (all when None), so a round's draw from the pool does not change when the round is resumed.
        """
        return pareto_pool(self._conn, self._meta("incumbent"), before_round)

    def episodes(self, skill_id: str, split: str, round: int) -> list[EpisodeRecord]:
        """The recorded episodes (without token ids and logprobs), in (task, seed, repeat) order."""
        rows = self._conn.execute(
            "SELECT record FROM episodes WHERE skill = ? AND split = ? AND round = ? ORDER BY task_id, seed, repeat",
            (skill_id, split, round),
        ).fetchall()
        return [EpisodeRecord.from_dict(json.loads(r[0])) for r in rows]

    def episode_count(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM episodes").fetchone()[0])

    def snapshot(self) -> dict[str, Any]:
        """The run's state without timestamps: equal for two runs that did the same work (for tests, reports)."""
        conn = self._conn
        return {
            "incumbent": self._meta("incumbent"),
            "rounds": conn.execute(
                "SELECT round, incumbent, proposed, winner FROM rounds ORDER BY round"
            ).fetchall(),
            "candidates": conn.execute(
                "SELECT id, parent, round, slot, status, proposal_k, decision FROM candidates ORDER BY round, slot"
            ).fetchall(),
            "dropped": conn.execute(
                "SELECT round, slot, reason FROM dropped ORDER BY round, slot"
            ).fetchall(),
            "episodes": conn.execute(
                "SELECT skill, split, round, task_id, seed, repeat, success, score, cost, end_reason FROM episodes "
                "ORDER BY skill, split, round, task_id, seed, repeat"
            ).fetchall(),
        }
