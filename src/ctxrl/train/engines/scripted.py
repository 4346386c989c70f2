"""``scripted`` engine: a Python policy behind the engine protocol, for tests, baselines and demonstrations.

The policy maps a prompt's token ids to the action text; the engine tokenises it as text a model wrote (no
special tokens added; a special-token spelling in it stays text) and ends it with the tokenizer's EOS (:meth:`PromptBuilder.action_ids`, the rule the
Gymnasium environment applies to a text action too), so the rollout loop sees the same shape of output as
from a model. :func:`text_policy` adapts a policy of the prompt *text* (a scripted reference policy): it is
given the decoded prompt ids and nothing else, so what it does is exactly a token-in/token-out
demonstration of acting on what a model would see. Every
logprob is 0.0 (the policy is deterministic). An action longer than the token budget is cut and ends with
``length``; a prompt that fills ``max_model_len`` is aborted, as in every engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ctxrl.env.episode import PromptBuilder
from ctxrl.errors import EngineError
from ctxrl.train.engines.base import (
    FinishReason,
    Generation,
    SamplingConfig,
    Weights,
    new_token_budgets,
    refuse_json_schema,
    too_long,
)

Policy = Callable[[list[int]], str]


def text_policy(policy: Callable[[str], str], tokenizer: Any) -> Policy:
    """A policy of the prompt text as a policy of the prompt ids: it sees the ids decoded, special tokens
    kept (exactly the text the model is given), and nothing else."""
    builder = PromptBuilder(tokenizer)
    return lambda prompt_ids: policy(builder.decode(prompt_ids))


class ScriptedEngine:
    """Runs ``policy(prompt_ids) -> action text`` for every prompt."""

    name = "scripted"
    supports_sleep = False
    cache_block_size: int | None = None

    def __init__(self, policy: Policy, tokenizer: Any, *, max_model_len: int | None = None) -> None:
        if tokenizer.eos_token_id is None:
            raise EngineError("the scripted engine needs a tokenizer with an EOS token")
        self.policy = policy
        self.tokenizer = tokenizer
        self._builder = PromptBuilder(tokenizer)
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.max_model_len: int = int(max_model_len or tokenizer.model_max_length)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[Generation]:
        """Ask the policy once per prompt; sampling settings other than the token budget are ignored."""
        refuse_json_schema(sampling, "scripted")
        budgets = new_token_budgets(prompts, sampling, self.max_model_len, vocab_size=len(self.tokenizer))
        results = []
        for prompt, budget in zip(prompts, budgets):
            if budget == 0:
                results.append(too_long(len(prompt), self.max_model_len))
                continue
            text = self.policy(list(prompt))
            ids = self._builder.action_ids(text)
            reason: FinishReason = "stop" if len(ids) <= budget else "length"
            ids = ids[:budget]
            results.append(Generation(ids, [0.0] * len(ids), reason, 0))
        return results

    def update_weights(self, weights: Weights) -> None:
        """Refused: a scripted policy has no weights."""
        raise EngineError("the scripted engine has no weights to update")

    def sleep(self) -> None:
        """No-op: nothing to free."""

    def wake(self) -> None:
        """No-op: nothing to restore."""

    def close(self) -> None:
        """No-op: nothing owned."""
