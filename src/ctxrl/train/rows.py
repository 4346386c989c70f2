"""Training rows from episodes, and their packing into microbatches.

    rows = episode_rows(episode, credit.steps)               # one episode -> its rows
    batches = pack_rows(rows, max_tokens=8192)               # packed sequences (block-diagonal attention)
    batches = pad_rows(rows, max_tokens=8192, pad_id=0)      # or padded batches, the fallback
    units = share_prefixes(rows, max_tokens=8192, pad_id=0)  # or each group's common prefix once
    row_stats(rows)                                          # what training will cost, in tokens

**Rows.** A step whose prompt was built by extending the previous one (``prompt_source == "extend"``) and
whose prompt ids really start with the previous step's prompt + generated ids joins the previous step's
row; any other step (``reset``, ``rebuild``, or an ``extend`` whose prefix does not hold) starts a new row.
A row is the ids of its *last* step's prompt followed by that step's generated ids; each step of the row
contributes one loss span, its generated ids, at the position where they sit in that sequence. One forward
pass over the row therefore gives the logprobs of every step in it, and the tokens through the model grow
with the tokens of the episode, not with steps × context.

Every per-token array of a row is aligned with ``input_ids``: entry ``t`` describes token ``t`` (its loss
mask, the engine's logprob of it, its advantage, whether it is an edit token). Prompt and observation
tokens have mask 0, logprob 0 and advantage 0. Position 0 is never a loss token (a prompt is never empty).

**Packing.** :func:`pack_rows` puts whole rows into sequences of at most ``max_tokens`` tokens (first fit
by decreasing length); position ids restart at 0 for each row and ``cu_seqlens`` gives the row boundaries,
i.e. attention stays block-diagonal. :func:`pad_rows` is the fallback for models that ignore packing: rows
of similar length are batched with right padding so ``rows × longest`` stays within ``max_tokens`` and a
row's padding within :data:`PAD_SLACK` of the width. A row
longer than ``max_tokens`` travels alone in its own microbatch (rows are never cut: the cut would lose the
context its loss tokens were generated from).

**Shared prefixes.** Every row of a group (all the episodes of one task) begins with the same pinned prefix
(system prompt, skill, task). :func:`share_prefixes` finds that common prefix once per group (the longest
common prefix of the group's rows, ending before the first loss token of any of them) and lays out the
rest of each row as a *suffix* in padded microbatches (``kind == "shared"``) whose position ids continue
from the prefix. The trainer runs the prefix once, lets every suffix attend to its keys and values, and
sums the suffixes' gradients back through the one copy (:mod:`ctxrl.train.update`): the same loss and
gradients as the rows laid out whole, for the prefix's tokens paid once per group instead of once per row.
Below that prefix the rows form a trie: rows that go on alike (the rows of one episode whose rebuilt prompts
keep its first turns, episodes that made the same first call) share a longer prefix in a child node, down to
where each row's first loss token forces it out. A layout is a list of :class:`LayoutUnit`: a prefix
(possibly empty) and the microbatches that follow it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from ctxrl.errors import UsageError
from ctxrl.train.trajectory import EpisodeRecord

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class Row:
    """One training sequence: a stretch of append-only steps of one episode, with one loss span per step."""

    input_ids: list[int]
    """The last step's prompt ids followed by its generated ids."""
    loss_mask: list[int]
    """1 on the generated ids of every step in the row, else 0."""
    old_logprobs: list[float]
    """The engine's logprob of each loss token (0 elsewhere)."""
    advantages: list[float]
    """The advantage of each loss token (0 elsewhere)."""
    edit_mask: list[int]
    """1 on loss tokens that are edit tokens (for metrics)."""
    spans: list[tuple[int, int]]
    """``[start, end)`` of each step's generated ids in ``input_ids``, in step order."""
    episode: int
    """Index of the episode (in the caller's list) the row comes from."""
    group: int
    """The episode's group (task) index."""
    steps: tuple[int, ...]
    """Indices of the episode's steps in the row."""

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)


def _extends(head: Sequence[int], prompt: Sequence[int]) -> bool:
    return len(prompt) > len(head) and list(prompt[: len(head)]) == list(head)


def episode_rows(
    episode: EpisodeRecord, step_advantages: Sequence[Sequence[float]], *, episode_index: int = 0
) -> list[Row]:
    """The training rows of ``episode`` (see the module docstring).

    ``step_advantages[k]`` holds one advantage per generated token of step ``k``
    (:attr:`ctxrl.train.credit.EpisodeCredit.steps`). Steps that generated nothing (an aborted call) add no
    span. Raises :class:`UsageError` when lengths disagree.
    """
    if len(step_advantages) != len(episode.steps):
        raise UsageError(
            f"{len(step_advantages)} step advantages for an episode of {len(episode.steps)} steps"
        )
    stretches: list[list[int]] = []
    head: list[int] | None = None  # prompt + generated ids of the previous step
    for k, step in enumerate(episode.steps):
        n = len(step.token_ids)
        if not (len(step.logprobs) == len(step.edit_mask) == len(step_advantages[k]) == n):
            raise UsageError(
                f"step {k} of episode {episode.task_id}#{episode.index}: {n} generated ids but "
                f"{len(step.logprobs)} logprobs, {len(step.edit_mask)} mask entries and "
                f"{len(step_advantages[k])} advantages"
            )
        if step.prompt_source == "extend" and head is not None and _extends(head, step.prompt_ids):
            stretches[-1].append(k)
        else:
            stretches.append([k])
        head = [*step.prompt_ids, *step.token_ids]
    rows = []
    for ks in stretches:
        last = episode.steps[ks[-1]]
        ids = [*last.prompt_ids, *last.token_ids]
        length = len(ids)
        mask = [0] * length
        old = [0.0] * length
        adv = [0.0] * length
        edit = [0] * length
        spans = []
        for k in ks:
            step = episode.steps[k]
            start = len(step.prompt_ids)
            end = start + len(step.token_ids)
            assert ids[start:end] == list(step.token_ids), "a joined step's ids are a prefix of the row"
            mask[start:end] = [1] * (end - start)
            old[start:end] = [float(x) for x in step.logprobs]
            adv[start:end] = [float(x) for x in step_advantages[k]]
            edit[start:end] = [int(x) for x in step.edit_mask]
            if end > start:
                spans.append((start, end))
        rows.append(
            Row(
                input_ids=ids,
                loss_mask=mask,
                old_logprobs=old,
                advantages=adv,
                edit_mask=edit,
                spans=spans,
                episode=episode_index,
                group=episode.group,
                steps=tuple(ks),
            )
        )
    return rows


@dataclass(frozen=True)
class RowStats:
    """What training on a set of rows costs, next to the naive one-row-per-step layout."""

    rows: int
    tokens: int
    """Tokens through the model: the sum of row lengths."""
    loss_tokens: int
    naive_tokens: int
    """Tokens through the model with one row per step (every step's prompt + generated ids)."""
    steps: int

    @property
    def packed_vs_naive(self) -> float:
        """``tokens / naive_tokens``: below 1 when append-only stretches share a row."""
        return self.tokens / self.naive_tokens if self.naive_tokens else 0.0

    def metrics(self, prefix: str = "cost/") -> dict[str, float]:
        return {
            f"{prefix}rows": float(self.rows),
            f"{prefix}row_tokens": float(self.tokens),
            f"{prefix}loss_tokens": float(self.loss_tokens),
            f"{prefix}naive_tokens": float(self.naive_tokens),
            f"{prefix}packed_vs_naive_tokens": self.packed_vs_naive,
        }


def row_stats(rows: Sequence[Row], episodes: Sequence[EpisodeRecord] | None = None) -> RowStats:
    """Counts over ``rows``; ``naive_tokens`` from ``episodes`` when given (else from the rows' steps' spans).

    >>> r = Row([5, 6, 7, 8, 9], [0, 0, 1, 0, 1], [0.0] * 5, [0.0] * 5, [0] * 5, [(2, 3), (4, 5)], 0, 0, (0, 1))
    >>> s = row_stats([r]); (s.rows, s.tokens, s.loss_tokens, s.naive_tokens)
    (1, 5, 2, 8)
    """
    tokens = sum(len(r) for r in rows)
    loss = sum(r.num_loss_tokens for r in rows)
    steps = sum(len(r.steps) for r in rows)
    if episodes is not None:
        naive = sum(len(s.prompt_ids) + len(s.token_ids) for ep in episodes for s in ep.steps)
    else:
        # without the records, a step's naive row is its prompt (the row up to its span's start) + its span
        naive = sum(end for r in rows for _, end in r.spans)
    return RowStats(rows=len(rows), tokens=tokens, loss_tokens=loss, naive_tokens=naive, steps=steps)


@dataclass(frozen=True)
class Microbatch:
    """Rows ready for one forward pass, as ``(B, T)`` arrays aligned token by token.

    ``kind == "packed"``: ``B == 1``, several rows back to back, ``cu_seqlens`` their boundaries
    (``[0, len(row0), len(row0)+len(row1), …]``), ``attention_mask`` None. ``kind == "padded"``: one row
    per line, right-padded; ``attention_mask`` 1 on real tokens, ``cu_seqlens`` None. In both, pad tokens
    and prompt tokens have loss mask 0. ``kind == "shared"``: the suffixes of rows whose first
    ``prefix_len`` ids are a :class:`LayoutUnit`'s prefix, right-padded like ``padded``, position ids from
    ``prefix_len``; ``attention_mask`` covers the suffix tokens only (the prefix is all real).
    """

    kind: Literal["packed", "padded", "shared"]
    input_ids: IntArray
    position_ids: IntArray
    loss_mask: FloatArray
    old_logprobs: FloatArray
    advantages: FloatArray
    edit_mask: FloatArray
    rows: tuple[int, ...]
    """Indices (into the list given to the packer) of the rows in this microbatch, in layout order."""
    cu_seqlens: IntArray | None = None
    attention_mask: IntArray | None = None
    row_lengths: tuple[int, ...] = field(default=())
    prefix_len: int = 0
    """``kind == "shared"``: the length of the prefix the suffixes continue (0 for the other kinds)."""

    @property
    def num_tokens(self) -> int:
        """Tokens through the model, padding included (for ``shared``, the suffixes only)."""
        return int(self.input_ids.size)

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())


def _bins(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """First-fit decreasing: indices grouped so each group's total length is <= max_tokens (an oversized
    item alone). Ties keep the input order, so the result is deterministic."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = lengths[i]
        for b, left in enumerate(room):
            if n <= left:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(max_tokens - n)
    return bins


def _check_budget(max_tokens: int) -> None:
    if max_tokens < 1:
        raise UsageError(f"max_tokens per microbatch must be >= 1, got {max_tokens}")


def pack_rows(rows: Sequence[Row], max_tokens: int) -> list[Microbatch]:
    """Pack ``rows`` into ``B == 1`` sequences of at most ``max_tokens`` tokens (see the module docstring).

    >>> a = Row([1, 2, 3], [0, 0, 1], [0, 0, -0.5], [0, 0, 2.0], [0, 0, 0], [(2, 3)], 0, 0, (0,))
    >>> b = Row([4, 5], [0, 1], [0, -0.1], [0, 1.0], [0, 1], [(1, 2)], 1, 0, (0,))
    >>> mb = pack_rows([a, b], 8)[0]
    >>> mb.input_ids.tolist(), mb.position_ids.tolist(), mb.cu_seqlens.tolist()
    ([[1, 2, 3, 4, 5]], [[0, 1, 2, 0, 1]], [0, 3, 5])
    """
    _check_budget(max_tokens)
    out = []
    for members in _bins([len(r) for r in rows], max_tokens):
        chosen = [rows[i] for i in members]
        lengths = [len(r) for r in chosen]
        out.append(
            Microbatch(
                kind="packed",
                input_ids=np.asarray([[t for r in chosen for t in r.input_ids]], dtype=np.int64),
                position_ids=np.asarray([[p for n in lengths for p in range(n)]], dtype=np.int64),
                loss_mask=np.asarray([[m for r in chosen for m in r.loss_mask]], dtype=np.float64),
                old_logprobs=np.asarray([[x for r in chosen for x in r.old_logprobs]], dtype=np.float64),
                advantages=np.asarray([[x for r in chosen for x in r.advantages]], dtype=np.float64),
                edit_mask=np.asarray([[x for r in chosen for x in r.edit_mask]], dtype=np.float64),
                rows=tuple(members),
                cu_seqlens=np.cumsum([0, *lengths], dtype=np.int64),
                row_lengths=tuple(lengths),
            )
        )
    return out


def _grid(values: Sequence[Sequence[float]], fill: float, dtype: type, *, width: int) -> NDArray[Any]:
    """``values`` right-padded with ``fill`` to ``width``, as one array."""
    return np.asarray([[*v, *([fill] * (width - len(v)))] for v in values], dtype=dtype)


PAD_SLACK = 0.125
"""A row joins a padded batch only when its padding is at most this share of the batch's width (or
:data:`PAD_SLACK_TOKENS`): a line of padding costs what a line of tokens does, and batching lines saves
little on a CPU. Without it, SmolLM2's SFT step on two recorded episodes padded their 300-token suffixes
beside two of 780–1,071 and took 1.42× as long (``scripts/probe_sft_step.py --demos 2``;
docs/train_throughput.md, "Tenth run")."""
PAD_SLACK_TOKENS = 64
"""Padding a row may always take, however narrow the batch: a forward pass has a fixed cost (SmolLM2's
supervised step, bfloat16 on a 2-core CPU: ~190 ms, what ~75 tokens cost)."""


def pad_rows(
    rows: Sequence[Row], max_tokens: int, pad_id: int, *, slack: float = PAD_SLACK
) -> list[Microbatch]:
    """Batch ``rows`` with right padding so that ``rows × longest <= max_tokens`` per batch.

    Rows are sorted by length (longest first) and cut into consecutive runs, so rows of similar length share
    a batch; a row that would be padded by more than ``slack`` of the width (and more than
    :data:`PAD_SLACK_TOKENS`) starts a new batch (``slack=math.inf``: batches fill up to ``max_tokens``).

    >>> a = Row([1, 2, 3], [0, 0, 1], [0, 0, -0.5], [0, 0, 2.0], [0, 0, 0], [(2, 3)], 0, 0, (0,))
    >>> b = Row([4, 5], [0, 1], [0, -0.1], [0, 1.0], [0, 1], [(1, 2)], 1, 0, (0,))
    >>> mb = pad_rows([a, b], 6, pad_id=0)[0]
    >>> mb.input_ids.tolist(), mb.attention_mask.tolist(), mb.loss_mask.tolist()
    ([[1, 2, 3], [4, 5, 0]], [[1, 1, 1], [1, 1, 0]], [[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    """
    _check_budget(max_tokens)
    order = sorted(range(len(rows)), key=lambda i: (-len(rows[i]), i))
    groups: list[list[int]] = []
    for i in order:
        # sorted longest first: the group's width is its first row's length
        width = len(rows[groups[-1][0]]) if groups else 0
        padding = width - len(rows[i])
        fits = groups and (len(groups[-1]) + 1) * width <= max_tokens
        if fits and padding <= max(slack * width, PAD_SLACK_TOKENS):
            groups[-1].append(i)
        else:
            groups.append([i])
    out = []
    for members in groups:
        chosen = [rows[i] for i in members]
        width = max(len(r) for r in chosen)
        grid = partial(_grid, width=width)

        out.append(
            Microbatch(
                kind="padded",
                input_ids=grid([list(r.input_ids) for r in chosen], pad_id, np.int64),
                position_ids=grid([list(range(len(r))) for r in chosen], 0, np.int64),
                loss_mask=grid([list(r.loss_mask) for r in chosen], 0, np.float64),
                old_logprobs=grid([list(r.old_logprobs) for r in chosen], 0.0, np.float64),
                advantages=grid([list(r.advantages) for r in chosen], 0.0, np.float64),
                edit_mask=grid([list(r.edit_mask) for r in chosen], 0, np.float64),
                rows=tuple(members),
                attention_mask=grid([[1] * len(r) for r in chosen], 0, np.int64),
                row_lengths=tuple(len(r) for r in chosen),
            )
        )
    return out


@dataclass(frozen=True)
class LayoutUnit:
    """A prefix computed once and what continues it: microbatches of suffixes, and child units whose rows share
    a longer prefix (a node of the trie over the rows' ids). An empty prefix for plain layouts."""

    prefix_ids: IntArray
    """``(1, P)`` ids shared by every row below this node, after the ancestors' prefixes; ``P == 0`` when
    nothing is shared."""
    batches: tuple[Microbatch, ...]
    group: int = -1
    """The group whose rows share the prefix (-1 for a plain unit)."""
    children: tuple[LayoutUnit, ...] = ()
    """Nodes whose rows share more than this prefix: each continues it with a prefix of its own."""
    offset: int = 0
    """Tokens of the ancestors' prefixes: this prefix's first position."""

    @property
    def prefix_len(self) -> int:
        return int(self.prefix_ids.shape[1])

    def all_batches(self) -> list[Microbatch]:
        """Every microbatch below this node, in the order the update runs them (children first)."""
        return [mb for child in self.children for mb in child.all_batches()] + list(self.batches)

    @property
    def num_tokens(self) -> int:
        """Tokens through the model: each prefix once plus every microbatch, padding included."""
        return (
            self.prefix_len
            + sum(mb.num_tokens for mb in self.batches)
            + sum(child.num_tokens for child in self.children)
        )

    @property
    def num_loss_tokens(self) -> int:
        return sum(mb.num_loss_tokens for mb in self.all_batches())


def plain_units(batches: Sequence[Microbatch]) -> list[LayoutUnit]:
    """Packed or padded microbatches as a layout with nothing shared: one unit each, empty prefix."""
    empty = np.zeros((1, 0), dtype=np.int64)
    return [LayoutUnit(prefix_ids=empty, batches=(mb,)) for mb in batches]


def first_loss_position(row: Row) -> int:
    """Index of the row's first loss token (its length when it has none)."""
    return next((t for t, m in enumerate(row.loss_mask) if m), len(row))


def common_prefix_len(rows: Sequence[Row]) -> int:
    """How many leading ids the ``rows`` can share: their longest common prefix, cut so that it ends at
    least one token before any row's first loss token (so every loss token is predicted from a suffix
    position) and leaves every row a non-empty suffix.

    >>> a = Row([1, 2, 3, 4, 9], [0, 0, 0, 0, 1], [0.0] * 5, [0.0] * 5, [0] * 5, [(4, 5)], 0, 0, (0,))
    >>> b = Row([1, 2, 3, 7, 8, 9], [0, 0, 0, 0, 1, 1], [0.0] * 6, [0.0] * 6, [0] * 6, [(4, 6)], 1, 0, (0,))
    >>> common_prefix_len([a, b])
    3
    >>> common_prefix_len([a, a])   # identical rows: cut before the token that predicts the first loss token
    3
    """
    if not rows:
        return 0
    first = rows[0].input_ids
    n = min(len(r) for r in rows) - 1
    n = min(n, *(first_loss_position(r) - 1 for r in rows))
    for r in rows[1:]:
        ids = r.input_ids
        k = 0
        while k < n and ids[k] == first[k]:
            k += 1
        n = k
    return max(n, 0)


def _suffix_batches(
    rows: Sequence[Row], members: Sequence[int], prefix: int, max_tokens: int, pad_id: int, slack: float
) -> list[Microbatch]:
    """The suffixes (from ``prefix`` on) of ``rows[members]`` as padded ``shared`` microbatches."""
    cut = {
        i: Row(
            input_ids=rows[i].input_ids[prefix:],
            loss_mask=rows[i].loss_mask[prefix:],
            old_logprobs=rows[i].old_logprobs[prefix:],
            advantages=rows[i].advantages[prefix:],
            edit_mask=rows[i].edit_mask[prefix:],
            spans=[(s - prefix, e - prefix) for s, e in rows[i].spans],
            episode=rows[i].episode,
            group=rows[i].group,
            steps=rows[i].steps,
        )
        for i in members
    }
    local = list(members)
    out = []
    for mb in pad_rows([cut[i] for i in local], max_tokens, pad_id, slack=slack):
        out.append(
            replace(
                mb,
                kind="shared",
                position_ids=mb.position_ids + prefix,
                rows=tuple(local[j] for j in mb.rows),
                prefix_len=prefix,
            )
        )
    return out


MIN_SHARED_PREFIX = 16
"""A node of the trie is kept only when it saves at least this many token passes (its rows' shared tokens
computed once instead of once per row, its own and its descendants'); a group whose rows share fewer leading
tokens than this is laid out plainly."""
MAX_TRIE_DEPTH = 16
"""Levels of nested prefixes below a group's. Each level's prefix is at least one token longer than its
parent's, so this only bounds the recursion (recorded SmolLM2 groups need 5 levels)."""


def _saved(unit: LayoutUnit) -> int:
    """Token passes that ``unit`` saves over laying the rows below it out whole: each prefix once, not once
    per row below it."""
    rows = sum(len(mb.rows) for mb in unit.all_batches())
    return (rows - 1) * unit.prefix_len + sum(_saved(child) for child in unit.children)


def _trie_node(
    rows: Sequence[Row],
    members: Sequence[int],
    offset: int,
    max_tokens: int,
    pad_id: int,
    min_prefix: int,
    group: int,
    depth: int,
    max_depth: int,
    slack: float,
) -> LayoutUnit:
    """The node for ``rows[members]``, which share ``input_ids[:offset]``: its prefix runs to their common
    prefix (:func:`common_prefix_len`). A row whose first loss token comes right after that prefix cannot
    share more, and stays here; the others are split by their next token, and each split of two or more rows
    becomes a child node (which may split again) when it saves at least ``min_prefix`` token passes. Rows left
    here run as this node's suffix microbatches."""
    chosen = [rows[i] for i in members]
    end = max(common_prefix_len(chosen) if len(chosen) > 1 else offset, offset)
    direct: list[int] = []
    clusters: dict[int, list[int]] = {}
    for i in members:
        if first_loss_position(rows[i]) - 1 > end:  # so its ids go on past ``end`` with no loss token yet
            clusters.setdefault(rows[i].input_ids[end], []).append(i)
        else:
            direct.append(i)
    children = []
    for cluster in clusters.values():
        if len(cluster) > 1 and depth < max_depth:
            child = _trie_node(
                rows, cluster, end, max_tokens, pad_id, min_prefix, group, depth + 1, max_depth, slack
            )
            if _saved(child) >= max(min_prefix, 1):
                children.append(child)
                continue
        direct.extend(cluster)
    return LayoutUnit(
        prefix_ids=np.asarray([rows[members[0]].input_ids[offset:end]], dtype=np.int64),
        batches=tuple(_suffix_batches(rows, sorted(direct), end, max_tokens, pad_id, slack))
        if direct
        else (),
        group=group,
        children=tuple(children),
        offset=offset,
    )


def share_prefixes(
    rows: Sequence[Row],
    max_tokens: int,
    pad_id: int,
    *,
    min_prefix: int = MIN_SHARED_PREFIX,
    max_depth: int = MAX_TRIE_DEPTH,
    slack: float = PAD_SLACK,
) -> list[LayoutUnit]:
    """One unit per group of ``rows``: the root of a trie over the group's rows. Its prefix is the group's
    common prefix (:func:`common_prefix_len`), computed once; below it, rows that go on alike (the rows of one
    episode, whose rebuilt prompts keep the first turns; episodes that generated the same first call) form
    child nodes with a prefix of their own, and so on down (:func:`_trie_node`); every row's remaining suffix
    is laid out in padded microbatches of at most ``max_tokens`` tokens (a longer suffix alone) under the
    deepest node it belongs to. A group whose rows share fewer than ``min_prefix`` leading tokens (short rows
    of a copy task, say, where many small nodes would cost more passes than they save), or that has a single
    row, is padded as it is (one plain unit per microbatch). ``max_depth`` bounds the levels below the
    group's (0: the group's prefix only); ``slack`` is :func:`pad_rows`'s, for every padded batch.
    ``Microbatch.rows`` index into ``rows`` as for the other layouts.

    >>> a = Row([1, 2, 3, 4, 9], [0, 0, 0, 0, 1], [0.0] * 5, [0.0] * 5, [0] * 5, [(4, 5)], 0, 0, (0,))
    >>> b = Row([1, 2, 3, 7, 8, 9], [0, 0, 0, 0, 1, 1], [0.0] * 6, [0.0] * 6, [0] * 6, [(4, 6)], 1, 0, (0,))
    >>> unit, = share_prefixes([a, b], 16, pad_id=0, min_prefix=2)
    >>> unit.prefix_ids.tolist(), unit.batches[0].input_ids.tolist(), unit.batches[0].position_ids.tolist()
    ([[1, 2, 3]], [[7, 8, 9], [4, 9, 0]], [[3, 4, 5], [3, 4, 3]])
    >>> unit.num_tokens   # 3 prefix + 2 x 3 suffix tokens, where the rows laid out whole take 11
    9
    """
    _check_budget(max_tokens)
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(r.group, []).append(i)
    units: list[LayoutUnit] = []
    for g, members in groups.items():
        chosen = [rows[i] for i in members]
        if len(chosen) > 1 and common_prefix_len(chosen) >= max(min_prefix, 1):
            units.append(_trie_node(rows, members, 0, max_tokens, pad_id, min_prefix, g, 0, max_depth, slack))
            continue
        for mb in pad_rows(chosen, max_tokens, pad_id, slack=slack):
            units.extend(plain_units([replace(mb, rows=tuple(members[j] for j in mb.rows))]))
    return units


@dataclass(frozen=True)
class LayoutSizes:
    """What a layout is priced with: the model's geometry (:func:`ctxrl.train.update.layout_sizes`)."""

    body_params: int
    """Linear parameters every token passes through (the layers, not the embedding lookup)."""
    head_params: int
    """Parameters of the LM head, paid only at the positions whose logits are taken."""
    n_layers: int
    attn_width: int
    """Query width per layer (heads × head dim)."""


def head_positions(mb: Microbatch) -> int:
    """Positions whose logits the trainer computes: those that predict a loss token, the union over the
    lines of a batched microbatch (one index set serves every line), times the lines."""
    needed = mb.loss_mask[:, 1:].any(axis=0)
    return int(needed.sum()) * int(mb.input_ids.shape[0])


def layout_flops(units: Sequence[LayoutUnit], sizes: LayoutSizes, *, two_part: bool = False) -> float:
    """Estimated FLOPs of one forward pass over a layout: ``2·body_params`` per token through the model
    (padding and each prefix once included), ``2·head_params`` per logit position (:func:`head_positions`),
    and the attention scores, ``4·n_layers·attn_width`` per query-key pair the kernel computes — a packed
    line pays for every pair of its ``T`` tokens (the block mask hides pairs across rows, SDPA still computes
    them), a padded line and a prefix for ``S²/2`` (no mask: right padding needs none under causal attention,
    and the causal kernel skips the upper triangle), a suffix line for ``S·(P + S)`` (a dense mask offsets
    its causal triangle past the prefix, and the kernel computes every pair). With ``two_part`` (the suffixes
    and nested prefixes attend to what they continue in two parts, :mod:`ctxrl.train.attention`) a suffix line
    pays ``S·P + S²/2``: its own block is causal again.

    >>> a = Row([1, 2, 3], [0, 0, 1], [0, 0, -0.5], [0, 0, 2.0], [0, 0, 0], [(2, 3)], 0, 0, (0,))
    >>> sizes = LayoutSizes(body_params=10, head_params=5, n_layers=1, attn_width=1)
    >>> layout_flops(plain_units(pack_rows([a, a], 8)), sizes)  # 2*10*6 + 2*5*2*1 + 4*36
    284.0
    >>> layout_flops(plain_units(pad_rows([a, a], 8, 0)), sizes)  # 2*10*6 + 2*5*2*1 + 4*2*9/2
    176.0
    """
    dense, attention = flop_parts(units, sizes, two_part)
    return dense + attention


def update_flops(units: Sequence[LayoutUnit], sizes: LayoutSizes, *, two_part: bool = False) -> float:
    """Model FLOPs of one update over a layout, as its kernels compute them (:func:`layout_flops`'s pairs): the
    forward and the backward to the activations. The backward repeats each matmul's FLOPs once (the input's
    gradient; the frozen weights take none, and LoRA's own at r = 16 are a rounding error) and each
    attention's twice (four products per query-key pair against the forward's two: the gradients of the
    scores, the queries, the keys and the values).

    >>> a = Row([1, 2, 3], [0, 0, 1], [0, 0, -0.5], [0, 0, 2.0], [0, 0, 0], [(2, 3)], 0, 0, (0,))
    >>> sizes = LayoutSizes(body_params=10, head_params=5, n_layers=1, attn_width=1)
    >>> update_flops(plain_units(pad_rows([a, a], 8, 0)), sizes)  # 2*(2*10*6 + 2*5*2*1) + 3*4*2*9/2
    388.0
    """
    dense, attention = flop_parts(units, sizes, two_part)
    return 2.0 * dense + 3.0 * attention


def flop_parts(units: Sequence[LayoutUnit], sizes: LayoutSizes, two_part: bool) -> tuple[float, float]:
    """:func:`layout_flops` in two parts: the matmuls of the body and the head, and the attention."""
    attn = 4.0 * sizes.n_layers * sizes.attn_width
    dense = attention = 0.0
    for unit in units:
        p, before = unit.prefix_len, unit.offset
        # a root prefix is causal without a mask; a child's attends to its ancestors' through a dense one,
        # or in two parts (the ancestors' keys whole, its own causal)
        dense += 2.0 * sizes.body_params * p
        attention += attn * (p * p / 2 + p * before if before == 0 or two_part else p * (before + p))
        d, a = flop_parts(unit.children, sizes, two_part)
        dense, attention = dense + d, attention + a
        for mb in unit.batches:
            lines, width = mb.input_ids.shape
            own = width * width / 2 if two_part else width * width
            keys = {"packed": width * width, "padded": width * width / 2}.get(
                mb.kind, width * mb.prefix_len + own
            )
            dense += lines * 2.0 * sizes.body_params * width + 2.0 * sizes.head_params * head_positions(mb)
            attention += lines * attn * keys
    return dense, attention


LayoutKind = Literal["packed", "padded", "shared"]


def build_layout(
    rows: Sequence[Row], kind: LayoutKind, max_tokens: int, pad_id: int, *, slack: float = PAD_SLACK
) -> list[LayoutUnit]:
    """``rows`` in one layout: packed lines, padded batches, or shared prefixes with padded suffixes
    (``slack``: :func:`pad_rows`'s)."""
    if kind == "packed":
        return plain_units(pack_rows(rows, max_tokens))
    if kind == "padded":
        return plain_units(pad_rows(rows, max_tokens, pad_id, slack=slack))
    return share_prefixes(rows, max_tokens, pad_id, slack=slack)


def cheapest_layout(
    rows: Sequence[Row],
    max_tokens: int,
    pad_id: int,
    sizes: LayoutSizes,
    kinds: Sequence[LayoutKind] = ("shared", "packed", "padded"),
    *,
    two_part: bool = False,
) -> list[LayoutUnit]:
    """The layout of ``rows`` among ``kinds`` that :func:`layout_flops` prices lowest (ties: the earlier
    kind; ``two_part``: shared layouts priced as the two-part attention runs them). Shared prefixes win when rows of a group begin alike (every GRPO group does); padding when they
    share little (its attention skips the pairs across rows that a packed line computes, and
    :data:`PAD_SLACK` keeps ragged rows in batches of their own); packing when short rows of different lengths
    would pad by up to :data:`PAD_SLACK_TOKENS` each, more than packing's extra attention costs."""
    best: list[LayoutUnit] | None = None
    best_flops = 0.0
    for kind in kinds:
        layout = build_layout(rows, kind, max_tokens, pad_id)
        flops = layout_flops(layout, sizes, two_part=two_part)
        if best is None or flops < best_flops:
            best, best_flops = layout, flops
    assert best is not None, "at least one layout kind"
    return best


def layout_kind(units: Sequence[LayoutUnit]) -> str:
    """``shared`` when any unit shares a prefix, else the kind of the microbatches (``packed``/``padded``)."""
    if any(u.prefix_len for u in units):
        return "shared"
    kinds = {mb.kind for u in units for mb in u.all_batches()}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def split_by_episode(rows: Sequence[Row], parts: int) -> list[list[Row]]:
    """``rows`` in ``parts`` groups of whole episodes (round-robin by episode), so each update sees whole
    episodes."""
    if parts == 1:
        return [list(rows)]
    episodes = sorted({r.episode for r in rows})
    where = {e: i % parts for i, e in enumerate(episodes)}
    out: list[list[Row]] = [[] for _ in range(parts)]
    for r in rows:
        out[where[r.episode]].append(r)
    return out
