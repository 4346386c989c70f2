"""The Gymnasium environment: Gymnasium's own checker and determinism on every family in every mode."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

from ctxrl.env import register_envs
from ctxrl.env.gym_env import ContextEnv
from ctxrl.env.modes import MODE_NAMES as MODES
from ctxrl.env.tasks.registry import FAMILIES


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _env(tokenizer: Any, tmp_path: Path, family: str, mode: str) -> ContextEnv:
    return ContextEnv(family, mode, tokenizer=tokenizer, workdir=tmp_path / f"{family}-{mode}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_check_env_and_determinism(family: str, mode: str, tiny_tokenizer: Any, tmp_path: Path) -> None:
    env = _env(tiny_tokenizer, tmp_path, family, mode)
    # Gymnasium's checker reports most contract problems as warnings: any of them fails the test
    # (library deprecations aside, which the suite ignores everywhere).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True, skip_close_check=True)
    flagged = [
        f"{w.category.__name__}: {w.message}"
        for w in caught
        if not issubclass(w.category, DeprecationWarning)
    ]
    assert flagged == []

    def run() -> list[str]:
        obs, info = env.reset(seed=7)
        tool = info["task_tools"][0]  # every family has one
        seen = [obs]
        for action in (
            "thinking",
            _call(tool),
            "<tool_call>{broken</tool_call>",
            _call("submit", answer="x"),
        ):
            obs, _, terminated, truncated, _ = env.step(action)
            seen.append(obs)
            if terminated or truncated:
                break
        return seen

    first, second = run(), run()
    assert first == second
    env.close()


def test_episode_rewards_and_info(tiny_tokenizer: Any, tmp_path: Path) -> None:
    env = _env(tiny_tokenizer, tmp_path, "retention", "file")
    obs, info = env.reset(seed=1)
    assert obs.endswith("<|im_start|>assistant\n")
    assert info["messages"][0]["role"] == "system" and info["tokens"] > 0
    task_tool = info["task_tools"][0]
    obs, reward, terminated, truncated, info = env.step(_call(task_tool))
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert "<tool_response>" in obs and info["readout"]
    obs, reward, terminated, truncated, info = env.step("<tool_call>{broken</tool_call>")
    assert "[context] rejected by rule format: the call is not valid JSON" in info["messages"][-1]["content"]
    assert info["receipt_kinds"] == ["rejected"]
    obs, reward, terminated, truncated, info = env.step(_call("submit", answer="definitely wrong"))
    assert terminated and not truncated and reward == 0.0
    assert info["success"] is False and info["verdict"]
    # token in, token out: the action's ids end with the stop token, and the next prompt extends the last
    assert info["action_ids"][-1] == tiny_tokenizer.eos_token_id
    env.close()


def test_registered_ids_make_envs(tiny_tokenizer: Any, tmp_path: Path) -> None:
    ids = register_envs()
    assert "ctxrl/Retention-v0" in ids and len(ids) == len(FAMILIES)
    env = gym.make("ctxrl/Board-v0", mode="tools", tokenizer=tiny_tokenizer, workdir=tmp_path / "g")
    obs, _ = env.reset(seed=0)
    assert isinstance(obs, str) and "context_status" in obs
    env.close()


def test_the_documented_usage_works_in_a_fresh_process() -> None:
    """``import gymnasium, ctxrl.env`` then ``gymnasium.make(...)`` — no register call (issue 24)."""
    import subprocess
    import sys

    code = (
        "import gymnasium, ctxrl.env\n"
        "env = gymnasium.make('ctxrl/Retention-v0', mode='file')\n"
        "obs, info = env.reset(seed=0)\n"
        "assert isinstance(obs, str) and obs\n"
        "env.close()\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_bad_input_errors(tiny_tokenizer: Any) -> None:
    from ctxrl.errors import ConfigError, UsageError

    with pytest.raises(UsageError, match="unknown task family"):
        ContextEnv("nope", tokenizer=tiny_tokenizer)
    with pytest.raises(ConfigError, match="unknown mode 'yolo'; modes: file, tools, usage, harness, append"):
        ContextEnv("retention", "yolo", tokenizer=tiny_tokenizer)
