"""One episode, three ways: the Gymnasium environment, the rollout loop and ``ctxrl eval`` assemble it with
the same episode factory, so for the same scripted policy, task and seed they produce the same episode —
the same prompt ids and actions at every step, the same verdict and the same replayed cost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ctxrl.commands.common import scripted_policy
from ctxrl.commands.config import load_run_config
from ctxrl.commands.eval import eval_command
from ctxrl.env.gym_env import ContextEnv
from ctxrl.env.policies import POLICY_MODES, make_policy
from ctxrl.env.tasks.registry import make_task
from ctxrl.rewards.cost import episode_cost, replay_episode
from ctxrl.train.engines import EngineConfig, SamplingConfig, make_engine
from ctxrl.train.rollout import RolloutConfig, rollout
from ctxrl.train.tiny_model import tiny_geometry
from ctxrl.train.trajectory import load_trajectories

SEED = 110_000


def _gym(
    policy: str, family: str, tokenizer: Any, tmp_path: Path
) -> tuple[list[tuple[list[int], list[int]]], bool, str]:
    env = ContextEnv(family, POLICY_MODES[policy], split="test", tokenizer=tokenizer, workdir=tmp_path)
    obs, info = env.reset(options={"task_seed": SEED})
    act = make_policy(policy)
    calls = []
    while True:
        prompt = info["prompt_ids"]
        obs, _, terminated, truncated, info = env.step(act(obs))
        calls.append((prompt, info["action_ids"]))
        if terminated or truncated:
            env.close()
            return calls, bool(info["success"]), str(info["reason"])


@pytest.mark.parametrize(("policy", "family"), [("file-manager", "offload"), ("tools-manager", "retention")])
def test_gym_rollout_and_eval_give_the_same_episode(
    policy: str, family: str, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    gym_calls, gym_success, gym_reason = _gym(policy, family, tiny_tokenizer, tmp_path / "gym")
    gym_cost = episode_cost(replay_episode(gym_calls, block_size=16), "flops", geometry=tiny_geometry())

    engine = make_engine(
        EngineConfig(name="scripted"),
        tokenizer=tiny_tokenizer,
        policy=scripted_policy(policy, tiny_tokenizer),
    )
    [ep] = rollout(
        engine,
        tiny_tokenizer,
        [make_task(family, SEED, split="test")],
        RolloutConfig(group_size=1, mode=POLICY_MODES[policy]),
        geometry=tiny_geometry(),
        sampling=SamplingConfig(max_new_tokens=8192),
    ).episodes
    assert [(s.prompt_ids, s.token_ids) for s in ep.steps] == gym_calls
    assert (ep.success, ep.end_reason) == (gym_success, gym_reason)
    assert ep.cost_flops == pytest.approx(gym_cost, rel=1e-12)
    assert any(s.receipts for s in ep.steps)  # the episode managed its context: the comparison has edits
    assert any(s.edit_calls and sum(s.edit_mask) for s in ep.steps)  # and earned edit credit for it
    if policy == "tools-manager":  # the mode's events reach the records (skill evolution's notes read them)
        kinds = {json.loads(e)["type"] for s in ep.steps for e in s.events}
        assert "context_op" in kinds

    config = load_run_config(
        None,
        [
            "engine.name=scripted",
            "sampling.max_new_tokens=8192",
            f"eval.policies=[{policy}]",
            f"eval.families=[{family}]",
            "eval.episodes=1",
        ],
    )
    table = eval_command(config, out=tmp_path / "eval")
    [again] = load_trajectories(tmp_path / "eval" / "trajectories.jsonl")
    assert [(s.prompt_ids, s.token_ids) for s in again.steps] == gym_calls
    assert (again.success, again.end_reason, again.cost_flops) == (ep.success, ep.end_reason, ep.cost_flops)
    assert table[policy][family]["success"] == float(gym_success)
    assert table[policy][family]["cost"] == pytest.approx(gym_cost, rel=1e-12)
