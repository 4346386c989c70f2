"""Golden learning tests: the whole training loop learns, on toy tasks a tiny model can learn in minutes.

The path is the real one: rollouts on the in-process vLLM engine, credit, rows, the loss, the optimiser step
and the weight sync back into vLLM (:func:`ctxrl.train.grpo.train`), in file mode. The toy family is
:mod:`ctxrl.env.tasks.doors`. The start is the tiny model after a short supervised warm start on the scripted
teacher's demonstrations (it learns the call format and the teacher's random choices); held-out tasks come
from the dev split, which neither the demonstrations nor GRPO touch.

1. ``bandit``: eight doors, the same one opens in every task; the start picks one at random (~1/8). GRPO must
   lift held-out success from <= 20 % to >= 80 %.
2. ``detour``: one door, and one shell command before the answer: echo the door's name, or write a note into
   the context file (an edit: a rebuilt prompt, ~10 % more prefix-reuse compute, the same success). With the
   efficiency channel (the default w_eff = 0.25) the policy moves to the cheaper strategy; with w_eff = 0
   every group is all-success with equal rewards, nothing tells the two apart, and it does not move.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

import pytest

from ctxrl.config import load_config
from ctxrl.env.tasks.doors import demonstrator
from ctxrl.env.tasks.registry import make_task
from ctxrl.env.tasks.splits import split_seeds
from ctxrl.rewards.advantages import AdvantageConfig
from ctxrl.train.config import TrainConfig
from ctxrl.train.engines.base import SamplingConfig
from ctxrl.train.engines.scripted import ScriptedEngine, text_policy
from ctxrl.train.grpo import TaskBatches, TrainResult, train
from ctxrl.train.rollout import RolloutConfig, rollout
from ctxrl.train.sft import SFTConfig, sft_examples, train_sft

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

SKILL = "Answer with the submit tool."
"""A one-line skill keeps the toy prompts short (~560 tokens)."""
MAX_STEPS = {"bandit": 1, "detour": 2}
SAMPLING = SamplingConfig(max_new_tokens=64, temperature=1.0)
HELD_OUT = 48
"""Dev tasks per evaluation (one episode each)."""


def _rollout_config(level: str, group_size: int) -> RolloutConfig:
    return RolloutConfig(group_size=group_size, mode="file", skill=SKILL, max_steps=MAX_STEPS[level])


def record(name: str, **figures: Any) -> None:
    """Append a test's figures to the JSONL file ``$CTXRL_GOLDEN_JSON`` names, when set (how the README's
    figures are produced: ``CTXRL_GOLDEN_JSON=docs/results/golden/runs.jsonl pytest tests/train/test_golden.py``)."""
    path = os.environ.get("CTXRL_GOLDEN_JSON")
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"test": name, **figures}) + "\n")


def _load(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def toy_start(tiny_model_dir: Path, tiny_tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model after SFT on the teacher's demonstrations of 64 train tasks of each level (all of them,
    failures too: the bandit teacher's random choice is what the start should copy)."""
    teacher = ScriptedEngine(text_policy(demonstrator, tiny_tokenizer), tiny_tokenizer)
    tasks = [make_task("doors", s, level) for s in split_seeds("train", 64) for level in MAX_STEPS]
    demos = rollout(teacher, tiny_tokenizer, tasks, _rollout_config("detour", 1)).episodes
    examples, _ = sft_examples(demos, max_seq_len=2048, successful_only=False)
    config = SFTConfig(lr=3e-3, max_steps=150, max_seq_len=2048, batch_tokens=8192, warmup_steps=2)
    result = train_sft(config, tiny_model_dir, examples, tmp_path_factory.mktemp("toy-sft"), progress=False)
    return result.model_dir


@pytest.fixture
def engine(vllm_llm: Any, tiny_model_dir: Path, toy_start: Path) -> Any:
    """The session's vLLM engine with the toy start's weights; the tiny model's are put back afterwards."""
    from ctxrl.train.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine.from_llm(vllm_llm)
    engine.update_weights(_load(toy_start))
    yield engine
    engine.update_weights(_load(tiny_model_dir))


def evaluate(engine: Any, tokenizer: Any, level: str) -> tuple[float, float, float]:
    """(success rate, share of episodes that edited the context, prefix-reuse cost in tokens per episode) on
    the first dev tasks of ``level``."""
    tasks = [make_task("doors", s, level, split="dev") for s in split_seeds("dev", HELD_OUT)]
    episodes = rollout(engine, tokenizer, tasks, _rollout_config(level, 1), sampling=SAMPLING).episodes
    success = statistics.mean(float(ep.success) for ep in episodes)
    edited = statistics.mean(float(any(s.edited for s in ep.steps)) for ep in episodes)
    return success, edited, statistics.mean(ep.cost_tokens for ep in episodes)


def grpo(
    engine: Any, tokenizer: Any, start: Path, out: Path, level: str, *, steps: int, w_eff: float
) -> TrainResult:
    """Stepwise GRPO from ``start``: 4 train tasks x G = 8 per step, binary success, full fine-tuning."""
    config = load_config(TrainConfig, {"steps": steps, "lr": 3e-4, "save_every": 0, "tracker": "none"})
    return train(
        config,
        model_dir=start,
        engine=engine,
        tokenizer=tokenizer,
        tasks=TaskBatches(("doors",), "train", level, count=4),
        rollout_config=_rollout_config(level, 8),
        advantages=AdvantageConfig(w_eff=w_eff),
        sampling=SAMPLING,
        out=out,
    )


def test_grpo_lifts_held_out_success_from_chance(
    engine: Any, tiny_tokenizer: Any, toy_start: Path, tmp_path: Path
) -> None:
    before, _, _ = evaluate(engine, tiny_tokenizer, "bandit")
    result = grpo(engine, tiny_tokenizer, toy_start, tmp_path / "run", "bandit", steps=25, w_eff=0.25)
    after, _, _ = evaluate(engine, tiny_tokenizer, "bandit")
    curve = [round(m["reward/success"], 2) for m in result.metrics]
    record("bandit", held_out_before=before, held_out_after=after, train_success=curve, steps=len(curve))
    assert before <= 0.2, f"the start should pick at random (~1/8), got {before:.2f}"
    assert after >= 0.8, f"held-out success {before:.2f} -> {after:.2f}; training curve {curve}"


def test_efficiency_channel_moves_the_policy_to_the_cheaper_strategy_and_w0_does_not(
    engine: Any, tiny_tokenizer: Any, toy_start: Path, tmp_path: Path
) -> None:
    start_success, start_edits, start_cost = evaluate(engine, tiny_tokenizer, "detour")
    assert start_success >= 0.8 and 0.25 <= start_edits <= 0.75, (start_success, start_edits)
    ends = {}
    for w_eff in (0.25, 0.0):
        engine.update_weights(_load(toy_start))  # both arms from the same start, same seeds, same steps
        result = grpo(
            engine, tiny_tokenizer, toy_start, tmp_path / f"w{w_eff}", "detour", steps=30, w_eff=w_eff
        )
        ends[w_eff] = (*evaluate(engine, tiny_tokenizer, "detour"), result)
    record(
        "detour",
        start={"success": start_success, "edits": start_edits, "tokens_per_episode": start_cost},
        **{
            f"w_eff={w}": {
                "success": end[0],
                "edits": end[1],
                "tokens_per_episode": end[2],
                "train_edits_per_episode": [round(m["rollout/edits_per_episode"], 3) for m in end[3].metrics],
            }
            for w, end in ends.items()
        },
    )
    success, edits, cost, _ = ends[0.25]
    seen = f"edits {start_edits:.2f} -> {edits:.2f}, tokens/episode {start_cost:.0f} -> {cost:.0f}"
    assert success >= 0.8
    assert edits <= start_edits - 0.25 and cost < start_cost, f"with the efficiency channel: {seen}"
    # w_eff = 0: an all-success group has equal rewards, so no advantage at all; only sampling noise is left
    success0, edits0, _, _ = ends[0.0]
    assert success0 >= 0.8
    assert abs(edits0 - start_edits) <= 0.2, f"edits {start_edits:.2f} -> {edits0:.2f} with w_eff = 0"
