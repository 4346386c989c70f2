"""The trained policy: loaded from a model folder (with a LoRA adapter when asked), its FLOPs geometry,
and the reference logprobs of the KL term."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ctxrl.errors import ConfigError
from ctxrl.rewards.cost import ModelGeometry
from ctxrl.train.config import TrainConfig
from ctxrl.train.rows import LayoutUnit
from ctxrl.train.update import layout_logprobs


def load_policy(model_dir: str | Path, config: TrainConfig) -> Any:
    """The model in ``model_dir``, in ``config.dtype``; wrapped in a peft LoRA adapter when ``lora.enabled``."""
    from transformers import AutoModelForCausalLM

    from ctxrl.errors import ModelLoadError
    from ctxrl.train.engines.model_dir import check_causal_lm_dir

    path = check_causal_lm_dir(model_dir)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, config.dtype))
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"transformers could not load the model in {path}: {exc}") from None
    if not config.lora.enabled:
        return model
    from peft import LoraConfig, get_peft_model

    lora = config.lora
    return get_peft_model(
        model,
        LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules),
            task_type="CAUSAL_LM",
        ),
    )


def geometry(model: Any) -> ModelGeometry | None:
    try:
        return ModelGeometry.from_config(model.config)
    except ConfigError:
        return None  # e.g. mixture-of-experts: cost in tokens only


def reference_logprobs(
    policy: Any, reference: Any, unit: LayoutUnit, device: Any, *, two_part: bool = False
) -> list[torch.Tensor]:
    """Logprobs under the reference: the frozen initial model, or with LoRA the base with the adapter off."""
    if reference is not None:
        return layout_logprobs(reference, [unit], device, two_part=two_part)[0]
    with policy.disable_adapter():
        return layout_logprobs(policy, [unit], device, two_part=two_part)[0]
