"""The cost model's cached-token counts equal what a real vLLM engine reports, step by step.

Multi-turn rollouts on the tiny model: each step's prompt is the previous prompt + the ids the engine
generated + a tool-output chunk, with one episode editing mid-context early and one late, and all episodes
sharing a system prompt (so episodes hit each other's blocks). Steps run one request at a time, then the
same episodes run as batches (step k of every episode in one ``generate`` call).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from ctxrl.rewards.cost import PrefixCache

pytestmark = pytest.mark.vllm

N_STEPS = 6


def _chunk(tokenizer: Any, rng: random.Random, n_lines: int) -> list[int]:
    words = [
        "context",
        "budget",
        "token",
        "edit",
        "receipt",
        "grep",
        "cat",
        "file",
        "row",
        "column",
        "value",
        "hash",
        "note",
        "tool",
        "the",
        "of",
    ]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))) for _ in range(n_lines)]
    return list(tokenizer.encode("\n".join(lines) + "\n", add_special_tokens=False))


def _episode_plan(tokenizer: Any, seed: int) -> dict[str, Any]:
    """Deterministic tool-output chunks and generation lengths for one episode."""
    rng = random.Random(seed)
    return {
        "task": _chunk(tokenizer, rng, 8),
        "tools": [_chunk(tokenizer, rng, rng.randint(6, 20)) for _ in range(N_STEPS)],
        "gen": [rng.randint(3, 40) for _ in range(N_STEPS)],
    }


def _next_prompt(
    prev: list[int], generated: list[int], tool: list[int], edit: tuple[int, int] | None
) -> list[int]:
    prompt = prev + generated + tool
    if edit is not None:  # replace a mid-context span [a, b) with a short note: breaks the prefix at `a`
        a, b = edit
        prompt = prompt[:a] + prompt[a : a + 5][::-1] + prompt[b:]
    return prompt


# (episode seed, {step index: (edit start, edit end)}): append-only, an early edit, a late edit.
EPISODES: list[tuple[int, dict[int, tuple[int, int]]]] = [
    (1, {}),
    (2, {1: (300, 420)}),
    (3, {4: (700, 900)}),
]


def _sampling(max_tokens: int) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.7, top_p=0.95)


def _engine_cache(llm: Any) -> tuple[int, int]:
    cache_config = llm.llm_engine.vllm_config.cache_config
    return int(cache_config.block_size), int(cache_config.num_gpu_blocks) - 1  # block 0 is vLLM's null block


def test_sequential_steps_match_vllm(vllm_llm: Any, tiny_tokenizer: Any) -> None:
    from vllm import TokensPrompt

    assert vllm_llm.reset_prefix_cache()
    block_size, capacity = _engine_cache(vllm_llm)
    sim = PrefixCache(block_size=block_size, capacity_blocks=capacity)
    system = _chunk(tiny_tokenizer, random.Random(0), 30)
    assert len(system) > 2 * block_size

    checked = 0
    hits_seen = set()
    for seed, edits in EPISODES:
        plan = _episode_plan(tiny_tokenizer, seed)
        prompt = system + plan["task"]
        generated: list[int] = []
        for k in range(N_STEPS):
            if k > 0:
                prompt = _next_prompt(prompt, generated, plan["tools"][k], edits.get(k))
            out = vllm_llm.generate(
                [TokensPrompt(prompt_token_ids=prompt)], _sampling(plan["gen"][k]), use_tqdm=False
            )[0]
            generated = list(out.outputs[0].token_ids)
            assert len(generated) == plan["gen"][k]
            simulated = sim.step(prompt, generated)
            assert simulated.cached == out.num_cached_tokens, (seed, k, len(prompt), simulated)
            if k in edits:  # the edit broke the prefix: nothing from its first changed block on hits
                assert out.num_cached_tokens <= block_size * (edits[k][0] // block_size) < len(prompt)
            hits_seen.add(out.num_cached_tokens > 0)
            checked += 1

    # A prompt of exactly two blocks, sent twice: the cap leaves the last block to recompute.
    exact = (system * 2)[: 2 * block_size]
    for _ in range(2):
        out = vllm_llm.generate([TokensPrompt(prompt_token_ids=exact)], _sampling(1), use_tqdm=False)[0]
        assert sim.step(exact, list(out.outputs[0].token_ids)).cached == out.num_cached_tokens
    assert out.num_cached_tokens == block_size
    assert checked == len(EPISODES) * N_STEPS and hits_seen == {True, False}


def test_batched_steps_match_vllm(vllm_llm: Any, tiny_tokenizer: Any) -> None:
    from vllm import TokensPrompt

    assert vllm_llm.reset_prefix_cache()
    block_size, capacity = _engine_cache(vllm_llm)
    sim = PrefixCache(block_size=block_size, capacity_blocks=capacity)
    system = _chunk(tiny_tokenizer, random.Random(10), 30)
    plans = [_episode_plan(tiny_tokenizer, 100 + seed) for seed, _ in EPISODES]
    prompts = [system + plan["task"] for plan in plans]
    generated: list[list[int]] = [[] for _ in EPISODES]
    cached_per_step = []
    for k in range(N_STEPS):
        if k > 0:
            prompts = [
                _next_prompt(prompts[i], generated[i], plans[i]["tools"][k], EPISODES[i][1].get(k))
                for i in range(len(EPISODES))
            ]
        outs = vllm_llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts],
            [_sampling(plan["gen"][k]) for plan in plans],
            use_tqdm=False,
        )
        generated = [list(o.outputs[0].token_ids) for o in outs]
        simulated = sim.batch(list(zip(prompts, generated)))
        engine = [o.num_cached_tokens for o in outs]
        assert [s.cached for s in simulated] == engine, (k, [len(p) for p in prompts])
        cached_per_step.append(engine)
    # The first batch's later episodes hit the system prompt the first one keyed in the same call.
    assert cached_per_step[0][0] == 0 and cached_per_step[0][1] > 0
