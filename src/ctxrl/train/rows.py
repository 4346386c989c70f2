"""Training rows from episodes, and their packing into microbatches.

    rows = episode_rows(episode, credit.steps)               # one episode -> its rows
    batches = pack_rows(rows, max_tokens=8192)               # packed sequences (block-diagonal attention)
    batches = pad_rows(rows, max_tokens=8192, pad_id=0)      # or padded batches, the fallback
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
of similar length are batched with right padding so ``rows × longest`` stays within ``max_tokens``. A row
longer than ``max_tokens`` travels alone in its own microbatch (rows are never cut: the cut would lose the
context its loss tokens were generated from).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
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
    and prompt tokens have loss mask 0.
    """

    kind: Literal["packed", "padded"]
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

    @property
    def num_tokens(self) -> int:
        """Tokens through the model, padding included."""
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


def pad_rows(rows: Sequence[Row], max_tokens: int, pad_id: int) -> list[Microbatch]:
    """Batch ``rows`` with right padding so that ``rows × longest <= max_tokens`` per batch.

    Rows are sorted by length (longest first) and cut into consecutive runs, so rows of similar length share
    a batch and little is padding.

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
        if groups and (len(groups[-1]) + 1) * len(rows[groups[-1][0]]) <= max_tokens:
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


def forward_flops(
    batches: Sequence[Microbatch], *, linear_params: int, n_layers: int, attn_width: int
) -> float:
    """Estimated FLOPs of one forward pass over ``batches``: ``2·linear_params`` per token through the model
    (padding included) plus the attention scores of every line, ``4·n_layers·attn_width·T²`` — a packed line
    pays for the pairs across its rows too, since the block mask hides them but the kernel still computes
    them.

    >>> a = Row([1, 2, 3], [0, 0, 1], [0, 0, -0.5], [0, 0, 2.0], [0, 0, 0], [(2, 3)], 0, 0, (0,))
    >>> forward_flops(pack_rows([a, a], 8), linear_params=10, n_layers=1, attn_width=1)  # 2*10*6 + 4*36
    264.0
    >>> forward_flops(pad_rows([a, a], 8, 0), linear_params=10, n_layers=1, attn_width=1)  # 2*10*6 + 4*2*9
    192.0
    """
    total = 0.0
    for mb in batches:
        lines, width = mb.input_ids.shape
        total += lines * (2.0 * linear_params * width + 4.0 * n_layers * attn_width * width * width)
    return total


def cheaper_layout(
    rows: Sequence[Row], max_tokens: int, pad_id: int, *, linear_params: int, n_layers: int, attn_width: int
) -> list[Microbatch]:
    """The packed or the padded layout of ``rows``, whichever :func:`forward_flops` prices lower (ties:
    packed). Packing wins when rows differ in length (no padding); padding wins when they are alike, since
    a packed line also computes the attention between its rows."""
    sizes = {"linear_params": linear_params, "n_layers": n_layers, "attn_width": attn_width}
    packed, padded = pack_rows(rows, max_tokens), pad_rows(rows, max_tokens, pad_id)
    return padded if forward_flops(padded, **sizes) < forward_flops(packed, **sizes) else packed
