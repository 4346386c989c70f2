"""The cost model against hand-computed numbers (block size 16 unless a test says otherwise)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctxrl.errors import ConfigError, UsageError
from ctxrl.rewards.cost import (
    ModelGeometry,
    PrefixCache,
    Prices,
    StepTokens,
    episode_cost,
    replay_episode,
    replay_suffix_reuse,
    step_flops,
)


def _counts(steps: list[StepTokens]) -> list[tuple[int, int, int, int]]:
    return [(s.prompt, s.cached, s.prefilled, s.generated) for s in steps]


def test_append_only_episode() -> None:
    p0 = list(range(40))
    g0 = list(range(1000, 1010))
    p1 = p0 + g0 + list(range(2000, 2030))  # 80 tokens
    g1 = list(range(3000, 3005))
    p2 = p1 + g1 + list(range(4000, 4011))  # 96 tokens
    steps = replay_episode([(p0, g0), (p1, g1), (p2, 4)])
    # step 0 computes 40 + 10 - 1 = 49 tokens -> 3 full blocks (48) keyed, generated ids included;
    # step 1: cap (80-1)//16 = 4 blocks, 3 cached -> 48; computes 80 + 5 - 1 = 84 -> 5 blocks (80);
    # step 2: cap (96-1)//16 = 5 blocks, 5 cached -> 80.
    assert _counts(steps) == [(40, 0, 40, 10), (80, 48, 32, 5), (96, 80, 16, 4)]

    assert episode_cost(steps, "tokens") == 40 + 10 + 32 + 5 + 16 + 4
    geo = ModelGeometry(n_body=1000, n_layers=2, attn_width=8)
    # pairs: (50² − 0)/2 = 1250, (85² − 48²)/2 = 2460.5, (100² − 80²)/2 = 1800 -> 5510.5
    assert episode_cost(steps, "flops", geometry=geo) == 2 * 1000 * 107 + 4 * 2 * 8 * 5510.5
    # 88 uncached input + 0.1 × 128 cached + 4 × 19 generated, per million
    assert episode_cost(steps, "usd") == pytest.approx((88 + 12.8 + 76) / 1e6)
    pricey = Prices(
        input_per_mtok=3.0, output_per_mtok=15.0, cache_read_fraction=0.1, cache_write_factor=1.25
    )
    assert episode_cost(steps, "usd", prices=pricey) == pytest.approx(
        (88 * 3.0 * 1.25 + 128 * 0.3 + 19 * 15.0) / 1e6
    )


def _edit_episode() -> list[tuple[list[int], list[int]]]:
    p0 = list(range(96))
    g0 = [500]
    p1 = [*p0[:20], 600, 601, 602, *p0[40:], *g0, *range(700, 713)]  # early edit at token 20; 93 tokens
    g1 = [501, 502]
    p2 = p1 + g1 + list(range(800, 830))  # append-only; 125 tokens
    g2 = [510, 511, 512]
    full = p2 + g2 + list(range(900, 920))
    p3 = [*full[:100], 1, *full[110:]]  # late edit at token 100; 139 tokens
    return [(p0, g0), (p1, g1), (p2, g2), (p3, [520, 521])]


def test_episode_with_early_and_late_edit() -> None:
    steps = replay_episode(_edit_episode())
    # step 0: 96 computed tokens -> 6 blocks keyed. step 1: first change at 20 -> only block 0 hits (16);
    # 94 computed -> blocks 0-4 of the new prompt keyed. step 2: 5 cached blocks (80 < cap 7 blocks).
    # step 3: first change at 100 -> blocks 0-5 hit (96); without the edit it would have been 112.
    assert _counts(steps) == [(96, 0, 96, 1), (93, 16, 77, 2), (125, 80, 45, 3), (139, 96, 43, 2)]


def test_suffix_reuse_keeps_spans_that_survive_an_edit() -> None:
    steps = replay_suffix_reuse(_edit_episode())
    # step 1: tokens 40-95 of step 0 survive the early edit at offset 23: 56 tokens -> 3 whole blocks (48).
    # step 2: nothing beyond the prefix hit. step 3: tokens 110-126 of step 2 (17) survive -> 1 block.
    assert [s.cached for s in steps] == [0, 16 + 48, 80, 96 + 16]
    capped = replay_suffix_reuse(_edit_episode(), max_spans_per_step=0)
    assert [s.cached for s in capped] == [s.cached for s in replay_episode(_edit_episode())]


def test_suffix_reuse_counts_only_the_longest_spans() -> None:
    blocks = [list(range(100 * k, 100 * k + 16 * (k + 1))) for k in range(4)]  # spans of 1, 2, 3, 4 blocks
    first = [p for b in blocks for p in [*b, 9999]]
    second = [5000] + [p for b in reversed(blocks) for p in [*b, 7777]]
    steps = replay_suffix_reuse([(first, 1), (second, 1)], block_size=16, max_spans_per_step=2)
    assert steps[1].cached == 16 * (4 + 3)


def test_prompt_cap_and_generated_blocks() -> None:
    exact = list(range(32))
    cache = PrefixCache(block_size=16)
    assert cache.step(exact, 1).cached == 0
    assert cache.step(exact, 1).cached == 16  # a hit stops at prompt length − 1: the last block reruns
    # 30 prompt + 3 generated: 32 computed tokens key 2 blocks; with 2 generated only 31 -> 1 block.
    for n_gen, expected in ((3, 32), (2, 16)):
        cache.reset()
        prompt = list(range(100, 130))
        gen = list(range(200, 200 + n_gen))
        cache.step(prompt, gen)
        assert cache.step([*prompt, *gen, 1, 2, 3], 1).cached == expected
    # Generated ids given only as a count still occupy blocks but never hit.
    cache.reset()
    cache.step(list(range(30)), 3)
    assert cache.step([*range(30), 200, 201, 202, 1], 1).cached == 16


def test_batch_shares_blocks_within_one_call() -> None:
    cache = PrefixCache(block_size=16)
    shared = list(range(40))
    out = cache.batch([(shared + [1] * 5, [7, 7]), (shared + [2] * 5, [8]), (shared, 1)])
    assert [s.cached for s in out] == [0, 32, 32]


def test_eviction_under_small_capacity() -> None:
    a, b = list(range(1, 9)), list(range(11, 23))  # 2 and 3 blocks of 4
    steps = [(a, 1), (b, 1), ([*a, 99], 1), ([*b, 5], 1), ([*a, 98], 1)]
    # Unbounded: C hits a's 2 blocks, D hits b's 3, E hits a's 2 again.
    assert [s.cached for s in replay_episode(steps, block_size=4)] == [0, 0, 8, 12, 8]
    # 4 blocks. A keys a0, a1; freed tail first: LRU [a1, a0], 2 plain free.
    # B needs 3: 2 plain + evicts a1. LRU [a0, b2, b1, b0].
    # C (9 tokens, cap 2 blocks): a0 hits, a1 is gone -> 4; needs 2 more: evicts b2, b1; re-keys a1.
    #   freed: plain tail block, LRU [b0, a1, a0].
    # D (13 tokens): b0 hits, b1 is gone -> 4; needs 3: 1 plain + evicts a1, a0.
    # E: a0 is gone -> 0.
    assert [s.cached for s in replay_episode(steps, block_size=4, capacity_blocks=4)] == [0, 0, 4, 4, 0]


def test_capacity_errors_are_clear() -> None:
    with pytest.raises(UsageError, match="ran out of blocks"):
        PrefixCache(block_size=4, capacity_blocks=2).step(list(range(12)), 1)
    with pytest.raises(ConfigError):
        PrefixCache(block_size=0)
    with pytest.raises(UsageError, match="empty prompt"):
        PrefixCache().step([], 1)
    with pytest.raises(UsageError, match="geometry"):
        episode_cost([], "flops")


def test_step_flops_by_hand() -> None:
    geo = ModelGeometry(n_body=10, n_layers=3, attn_width=4)
    # linear 2·10·(6 prefilled + 3 generated) = 180; pairs ((10+3)² − 4²)/2 = 76.5; 4·3·4·76.5 = 3672
    assert step_flops(StepTokens(prompt=10, cached=4, generated=3), geo) == 180 + 3672


def test_geometry_from_config_matches_parameter_count(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    config = json.loads((tiny_model_dir / "config.json").read_text())
    from_config = ModelGeometry.from_config(config)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert from_config == ModelGeometry.from_model(model)
    assert from_config.n_layers == config["num_hidden_layers"]
    assert from_config.attn_width == config["num_attention_heads"] * config["head_dim"]
    total = sum(p.numel() for p in model.parameters())
    assert from_config.n_body == total - config["vocab_size"] * config["hidden_size"]  # tied embeddings
    with pytest.raises(ConfigError, match="mixture-of-experts"):
        ModelGeometry.from_config({**config, "num_experts": 8})
