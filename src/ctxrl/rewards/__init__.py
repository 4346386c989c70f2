"""Success, prefix-reuse cost, the success-gated efficiency advantage, and edit masks."""

from ctxrl.rewards.advantages import (
    AdvantageConfig,
    GroupAdvantages,
    batch_advantages,
    efficiency_advantages,
    group_advantages,
    task_advantages,
    token_advantages,
)
from ctxrl.rewards.cost import (
    ModelGeometry,
    PrefixCache,
    Prices,
    Step,
    StepTokens,
    episode_cost,
    replay_episode,
    replay_suffix_reuse,
    step_flops,
)
from ctxrl.rewards.masks import edit_mask, parse_tool_calls, token_char_spans

__all__ = [
    "AdvantageConfig",
    "GroupAdvantages",
    "ModelGeometry",
    "PrefixCache",
    "Prices",
    "Step",
    "StepTokens",
    "batch_advantages",
    "edit_mask",
    "efficiency_advantages",
    "episode_cost",
    "group_advantages",
    "parse_tool_calls",
    "replay_episode",
    "replay_suffix_reuse",
    "step_flops",
    "task_advantages",
    "token_advantages",
    "token_char_spans",
]
