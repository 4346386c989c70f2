"""The pressure pass's ``engine`` summariser on a generation engine: prompt text in, completion text out.

    generate = engine_generate(engine, PromptBuilder(tokenizer))
    TaskEpisode(task, "harness", builder, workspace=ws, config=cfg, generate=generate)

The environment asks for a summary through a plain ``generate(prompt_text) -> str``
(:class:`ctxrl.env.modes.pressure.EngineSummariser`); this module makes one from an :class:`Engine`, so env
never imports train. The rollout loop (:func:`ctxrl.train.rollout.rollout`) builds it on the policy's own
engine when the harness config asks for ``modes.pressure.summariser: engine``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ctxrl.env.episode import PromptBuilder
from ctxrl.errors import EngineError
from ctxrl.train.engines.base import Engine, SamplingConfig

SUMMARY_MAX_NEW_TOKENS = 512
"""Most tokens of one summary (the pass cuts the text to its ``summary_chars`` anyway)."""


def engine_generate(
    engine: Engine,
    builder: PromptBuilder,
    *,
    max_new_tokens: int = SUMMARY_MAX_NEW_TOKENS,
    temperature: float = 0.0,
) -> Callable[[str], str]:
    """``generate(prompt_text) -> completion text`` on ``engine``.

    The prompt is one user message rendered with the model's chat template (generation prompt added; text
    that spells a special token stays text); the completion is decoded without special tokens. Greedy by
    default (``temperature`` 0), at most ``max_new_tokens`` tokens. Calls are serialised with a lock: the
    rollout steps episodes in several threads, and an engine serves one ``generate`` at a time. A prompt
    the engine does not run (too long for ``max_model_len``) raises :class:`EngineError`, as does any
    engine failure; the pressure pass then falls back to its extractive summary.
    """
    sampling = SamplingConfig(temperature=temperature, top_p=1.0, max_new_tokens=max_new_tokens)
    lock = threading.Lock()
    tokenizer: Any = builder.tokenizer

    def generate(prompt: str) -> str:
        ids = builder.full([{"role": "user", "content": prompt}], None)
        with lock:
            [gen] = engine.generate([ids], sampling)
        if gen.finish_reason == "abort":
            raise EngineError(f"the summary prompt was not run: {gen.extra.get('reason', 'aborted')}")
        text: str = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        return text

    return generate
