"""Rows from episodes and their packing: every expected array written out by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from ctxrl.errors import UsageError
from ctxrl.train.rows import (
    PAD_SLACK,
    LayoutSizes,
    Row,
    build_layout,
    cheapest_layout,
    common_prefix_len,
    episode_rows,
    layout_flops,
    layout_kind,
    pack_rows,
    pad_rows,
    plain_units,
    row_stats,
    share_prefixes,
    update_flops,
)


def three_steps(records: SimpleNamespace) -> tuple:
    s0 = records.step([1, 2, 3], [10, 11], source="reset", logprobs=[-0.1, -0.2], edit=[0, 0])
    s1 = records.step([1, 2, 3, 10, 11, 4, 5], [12], logprobs=[-0.3], edit=[1])
    s2 = records.step([1, 2, 3, 9], [13, 14], source="rebuild", logprobs=[-0.4, -0.5], edit=[1, 0])
    return records.episode([s0, s1, s2], group=7), [[1.0, 1.0], [1.5], [-1.0, -0.5]]


def test_extend_joins_a_row_and_rebuild_starts_one(records: SimpleNamespace) -> None:
    ep, adv = three_steps(records)
    rows = episode_rows(ep, adv, episode_index=3)
    assert len(rows) == 2
    a, b = rows
    assert a.input_ids == [1, 2, 3, 10, 11, 4, 5, 12]
    assert a.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert a.old_logprobs == [0, 0, 0, -0.1, -0.2, 0, 0, -0.3]
    assert a.advantages == [0, 0, 0, 1.0, 1.0, 0, 0, 1.5]
    assert a.edit_mask == [0, 0, 0, 0, 0, 0, 0, 1]
    assert a.spans == [(3, 5), (7, 8)]
    assert (a.steps, a.episode, a.group) == ((0, 1), 3, 7)
    assert b.input_ids == [1, 2, 3, 9, 13, 14]
    assert b.loss_mask == [0, 0, 0, 0, 1, 1]
    assert b.old_logprobs == [0, 0, 0, 0, -0.4, -0.5]
    assert b.advantages == [0, 0, 0, 0, -1.0, -0.5]
    assert b.edit_mask == [0, 0, 0, 0, 1, 0]
    assert (b.spans, b.steps) == ([(4, 6)], (2,))


def test_extend_whose_prefix_does_not_hold_starts_a_new_row(records: SimpleNamespace) -> None:
    s0 = records.step([1, 2], [10], source="reset")
    s1 = records.step([1, 2, 11, 4], [12])  # says "extend" but 11 != 10
    s2 = records.step([1, 2, 11, 4, 12, 5], [13])  # a true extension of s1
    rows = episode_rows(records.episode([s0, s1, s2]), [[0.0], [0.0], [0.0]])
    assert [r.steps for r in rows] == [(0,), (1, 2)]
    assert rows[1].input_ids == [1, 2, 11, 4, 12, 5, 13]
    assert rows[1].spans == [(4, 5), (6, 7)]


def test_prompt_equal_to_head_is_not_an_extension(records: SimpleNamespace) -> None:
    # the next prompt must add at least the turn separator; equal ids would make two spans overlap
    s0 = records.step([1, 2], [10], source="reset")
    s1 = records.step([1, 2, 10], [11])
    assert [r.steps for r in episode_rows(records.episode([s0, s1]), [[0.0], [0.0]])] == [(0,), (1,)]


def test_aborted_step_adds_no_span(records: SimpleNamespace) -> None:
    s0 = records.step([1, 2], [10], source="reset")
    s1 = records.step([1, 2, 10, 3], [])
    rows = episode_rows(records.episode([s0, s1]), [[2.0], []])
    assert len(rows) == 1 and rows[0].input_ids == [1, 2, 10, 3]
    assert rows[0].spans == [(2, 3)] and rows[0].loss_mask == [0, 0, 1, 0]


def test_length_mismatch_is_a_usage_error(records: SimpleNamespace) -> None:
    ep, _ = three_steps(records)
    with pytest.raises(UsageError, match="3 steps"):
        episode_rows(ep, [[1.0, 1.0]])
    with pytest.raises(UsageError, match="2 generated ids"):
        episode_rows(ep, [[1.0], [1.5], [0.0, 0.0]])


def test_append_only_episode_costs_its_final_context_not_steps_times_context(
    records: SimpleNamespace,
) -> None:
    n, first, gen, obs = 16, 10, 3, 4
    ep = records.append_only(n, first_prompt=first, gen=gen, obs=obs)
    rows = episode_rows(ep, [[0.5] * gen for _ in range(n)])
    stats = row_stats(rows, [ep])
    final_context = first + n * gen + (n - 1) * obs  # 10 + 48 + 60 = 118
    assert len(rows) == 1 and stats.tokens == final_context == 118
    assert stats.loss_tokens == n * gen == 48
    # naive: step k's row is its prompt (10 + 7k) plus 3 generated ids: 16*13 + 7*120 = 1048
    assert stats.naive_tokens == 1048
    assert stats.packed_vs_naive == pytest.approx(118 / 1048)
    assert row_stats(rows).naive_tokens == 1048  # the same from the spans alone
    assert stats.metrics()["cost/row_tokens"] == 118.0


def row(n: int, episode: int) -> Row:
    ids = [100 * (episode + 1) + t for t in range(n)]
    mask = [0] * (n - 1) + [1]
    return Row(
        ids,
        mask,
        [0.0] * (n - 1) + [-0.5],
        [0.0] * (n - 1) + [float(episode)],
        [0] * n,
        [(n - 1, n)],
        episode,
        0,
        (0,),
    )


def test_pack_rows_first_fit_decreasing() -> None:
    rows = [row(5, 0), row(4, 1), row(3, 2), row(2, 3)]
    batches = pack_rows(rows, max_tokens=7)
    # 5 -> bin 0 (room 2); 4 -> bin 1 (room 3); 3 -> bin 1 (room 0); 2 -> bin 0 (room 0)
    assert [mb.rows for mb in batches] == [(0, 3), (1, 2)]
    first = batches[0]
    assert first.kind == "packed" and first.attention_mask is None
    assert first.input_ids.tolist() == [[100, 101, 102, 103, 104, 400, 401]]
    assert first.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1]]
    assert first.cu_seqlens is not None and first.cu_seqlens.tolist() == [0, 5, 7]
    assert first.loss_mask.tolist() == [[0, 0, 0, 0, 1, 0, 1]]
    assert first.advantages.tolist() == [[0, 0, 0, 0, 0.0, 0, 3.0]]
    assert first.old_logprobs.tolist() == [[0, 0, 0, 0, -0.5, 0, -0.5]]
    assert (first.num_tokens, first.num_loss_tokens, first.row_lengths) == (7, 2, (5, 2))


def test_oversized_row_travels_alone() -> None:
    batches = pack_rows([row(3, 0), row(10, 1), row(3, 2)], max_tokens=7)
    assert [mb.rows for mb in batches] == [(1,), (0, 2)]
    assert batches[0].num_tokens == 10
    with pytest.raises(UsageError, match="max_tokens"):
        pack_rows([row(3, 0)], max_tokens=0)


def test_pad_rows_groups_similar_lengths_within_the_budget() -> None:
    rows = [row(3, 0), row(5, 1), row(2, 2), row(4, 3)]
    batches = pad_rows(rows, max_tokens=10, pad_id=9)
    # sorted 5, 4, 3, 2: [5, 4] is 2 x 5 = 10 tokens; 3 does not fit (3 x 5); [3, 2] is 2 x 3 = 6
    assert [mb.rows for mb in batches] == [(1, 3), (0, 2)]
    mb = batches[1]
    assert mb.kind == "padded" and mb.cu_seqlens is None
    assert mb.input_ids.tolist() == [[100, 101, 102], [300, 301, 9]]
    assert mb.attention_mask is not None and mb.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert mb.position_ids.tolist() == [[0, 1, 2], [0, 1, 0]]
    assert mb.loss_mask.tolist() == [[0, 0, 1], [0, 1, 0]]
    assert mb.advantages.tolist() == [[0, 0, 0.0], [0, 2.0, 0]]
    assert (mb.num_tokens, mb.num_loss_tokens) == (6, 2)


def test_packing_keeps_every_loss_token_once(records: SimpleNamespace) -> None:
    eps = [records.append_only(n) for n in (1, 3, 6)]
    rows = [
        r for i, ep in enumerate(eps) for r in episode_rows(ep, [[1.0] * 3] * len(ep.steps), episode_index=i)
    ]
    for batches in (pack_rows(rows, 64), pad_rows(rows, 64, pad_id=0)):
        assert sum(mb.num_loss_tokens for mb in batches) == 3 * (1 + 3 + 6)
        assert sorted(i for mb in batches for i in mb.rows) == [0, 1, 2]
        for mb in batches:
            assert float(np.sum(mb.advantages * mb.loss_mask)) == mb.num_loss_tokens


# a small model's geometry: 1M linear parameters in the body, a 100k-parameter head, 4 layers, query width 128
SIZES = LayoutSizes(body_params=1_000_000, head_params=100_000, n_layers=4, attn_width=128)


def test_auto_layout_pads_rows_of_alike_length_and_ragged_ones_apart() -> None:
    # eight 200-token rows: both layouts hold 1,600 tokens, but one packed line of 1,600 computes
    # 4*4*128*1600^2 attention FLOPs against 8 * 4*4*128*200^2 padded: 8x more, so padded wins
    alike = [row(200, e) for e in range(8)]
    assert layout_kind(cheapest_layout(alike, 4096, 0, SIZES)) == "padded"
    # one 1,000-token row and seven of 10: padded beside the long row they would spend 8 x 1,000 tokens, so
    # they form a batch of their own (1,070 tokens in all, as packed), and padded attention is the cheaper
    ragged = [row(1000, 0), *(row(10, e) for e in range(1, 8))]
    chosen = cheapest_layout(ragged, 8192, 0, SIZES)
    assert layout_kind(chosen) == "padded" and sum(u.num_tokens for u in chosen) == 1070
    # a 100-token row and a 40-token one: a narrow batch may pad by up to 64 tokens (200 tokens through the
    # body), more than one packed line of 140 costs in extra attention
    assert layout_kind(cheapest_layout([row(100, 0), row(40, 1)], 4096, 0, SIZES)) == "packed"


def test_a_row_joins_a_padded_batch_only_when_its_padding_is_small() -> None:
    # an episode's suffixes after a shared prefix (recorded SmolLM2 SFT rows): 941, 780 and 300 tokens fit
    # one 4,096-token batch of width 941, but the 300 would be 68 % padding and the 780 17 %: three batches
    rows = [row(941, 0), row(780, 1), row(300, 2)]
    assert [mb.input_ids.shape for mb in pad_rows(rows, 4096, 0)] == [(1, 941), (1, 780), (1, 300)]
    # within the limit (an eighth of the width, or 64 tokens for narrow batches) rows share a batch
    rows = [row(941, 0), row(830, 1), row(60, 2), row(3, 3)]
    assert [mb.input_ids.shape for mb in pad_rows(rows, 4096, 0)] == [(2, 941), (2, 60)]


def test_the_padding_limit_is_a_parameter_of_every_padded_layout() -> None:
    # without a limit (slack=inf) rows fill a batch up to max_tokens, however much padding they take: the
    # layout before the limit, which scripts/probe_sft_step.py --demos times as "shared-unlimited"
    rows = [row(941, 0), row(780, 1), row(300, 2)]
    assert [mb.input_ids.shape for mb in pad_rows(rows, 4096, 0, slack=math.inf)] == [(3, 941)]
    # the shared layout hands it to the suffix batches under its prefix
    suffixed = shared_rows(500, [941, 780, 300])
    for slack, shapes in ((PAD_SLACK, [(1, 941), (1, 780), (1, 300)]), (math.inf, [(3, 941)])):
        (unit,) = build_layout(suffixed, "shared", 4096, 0, slack=slack)
        assert unit.prefix_len == 500 and [mb.input_ids.shape for mb in unit.batches] == shapes
    # and to a node below it: two of the rows go on alike for 100 tokens more (a child of the root prefix)
    nested = shared_rows(500, [100 + 941, 100 + 300, 200])
    for r in nested[:2]:
        r.input_ids[500:600] = [9] * 100
    for slack, shapes in ((PAD_SLACK, [(1, 941), (1, 300)]), (math.inf, [(2, 941)])):
        (root,) = build_layout(nested, "shared", 4096, 0, slack=slack)
        (child,) = root.children
        assert child.prefix_len == 100 and [mb.input_ids.shape for mb in child.batches] == shapes
    # and so does the padded layout of the whole rows (1,441, 1,280 and 800 tokens: the 800 pads by 641)
    for slack, shapes in ((PAD_SLACK, [(2, 1441), (1, 800)]), (math.inf, [(3, 1441)])):
        padded = build_layout(suffixed, "padded", 8192, 0, slack=slack)
        assert [mb.input_ids.shape for u in padded for mb in u.batches] == shapes


def shared_rows(prefix: int, suffixes: list[int], group: int = 0) -> list[Row]:
    """Rows of one group: the same ``prefix`` ids, then a suffix of its own whose last token is a loss token."""
    rows = []
    for e, n in enumerate(suffixes):
        ids = [7] * prefix + [1000 * (e + 1) + t for t in range(n)]
        length = prefix + n
        mask = [0] * (length - 1) + [1]
        rows.append(
            Row(
                ids,
                mask,
                [0.0] * length,
                [0.0] * (length - 1) + [1.0],
                [0] * length,
                [(length - 1, length)],
                e,
                group,
                (0,),
            )
        )
    return rows


def test_shared_prefix_is_laid_out_once_and_the_suffixes_continue_it() -> None:
    rows = [*shared_rows(300, [50, 80, 20], group=0), *shared_rows(200, [40, 40], group=1)]
    units = share_prefixes(rows, 4096, pad_id=0)
    assert [u.prefix_len for u in units] == [300, 200]
    # every row's loss token is in exactly one suffix line, at its own position after the prefix
    assert sorted(i for u in units for mb in u.all_batches() for i in mb.rows) == list(range(5))
    for u in units:
        assert not u.children  # the suffixes differ from their first token: nothing more to share
        for mb in u.batches:
            assert mb.kind == "shared" and mb.prefix_len == u.prefix_len
            for line, i in enumerate(mb.rows):
                suffix = rows[i].input_ids[u.prefix_len :]
                assert mb.input_ids[line, : len(suffix)].tolist() == suffix
                assert mb.position_ids[line, 0] == u.prefix_len
                assert mb.loss_mask[line].sum() == 1 and mb.loss_mask[line, len(suffix) - 1] == 1
    assert sum(u.num_loss_tokens for u in units) == 5
    # the prefix once per group instead of once per row: 300 + 3 * 80 + 200 + 2 * 40 tokens, not 1,270
    assert sum(u.num_tokens for u in units) == 300 + 240 + 200 + 80
    assert layout_flops(units, SIZES) < layout_flops(plain_units(pack_rows(rows, 4096)), SIZES)
    assert layout_kind(cheapest_layout(rows, 4096, 0, SIZES)) == "shared"


def test_two_part_attention_prices_a_suffix_lines_own_block_causal() -> None:
    # a 300-token prefix and a batch of two 40-token suffix lines; 4 * 4 layers * 128 = 2,048 FLOPs a pair
    units = share_prefixes(shared_rows(300, [40, 40]), 4096, pad_id=0)
    assert [(u.prefix_len, [mb.input_ids.shape for mb in u.batches]) for u in units] == [(300, [(2, 40)])]
    dense = 2 * 1_000_000 * (300 + 2 * 40) + 2 * 100_000 * 2  # body per token, head at each line's loss token
    masked = 300 * 300 / 2 + 2 * 40 * (300 + 40)  # the dense mask: every pair of the suffix block computed
    two_part = 300 * 300 / 2 + 2 * (40 * 300 + 40 * 40 / 2)  # its own block causal
    assert layout_flops(units, SIZES) == dense + 2048 * masked
    assert layout_flops(units, SIZES, two_part=True) == dense + 2048 * two_part
    # the update: the backward repeats the matmuls once and the attention twice
    assert update_flops(units, SIZES, two_part=True) == 2 * dense + 3 * 2048 * two_part
    assert update_flops(units, SIZES) == 2 * dense + 3 * 2048 * masked


def test_two_part_pricing_shares_a_prefix_the_mask_would_not() -> None:
    # two 300-token suffixes after 64 shared tokens: with the mask each suffix computes 300 x 364 pairs, more
    # than padding both whole rows (364^2 / 2 each) saves by computing the prefix once; in two parts sharing
    # is never dearer than padding
    rows = shared_rows(64, [300, 300])
    assert layout_kind(cheapest_layout(rows, 4096, 0, SIZES)) == "padded"
    assert layout_kind(cheapest_layout(rows, 4096, 0, SIZES, two_part=True)) == "shared"


def test_the_shared_prefix_stops_before_any_loss_token() -> None:
    rows = shared_rows(30, [5, 5])
    # a loss token inside the common ids: the prefix ends one token before it, so its logit comes from a suffix
    early = Row([7] * 40, [0] * 20 + [1] * 20, [0.0] * 40, [1.0] * 40, [0] * 40, [(20, 40)], 2, 0, (0,))
    assert common_prefix_len([*rows, early]) == 19
    # identical rows keep a suffix of their own
    assert common_prefix_len([rows[0], rows[0]]) == len(rows[0]) - 2
    # a group whose rows share too little is padded as it is
    units = share_prefixes([row(50, 0), row(60, 1)], 4096, pad_id=0)
    assert all(u.prefix_len == 0 for u in units) and layout_kind(units) == "padded"
