"""A tiny causal LM and tokenizer built offline, for tests and the CPU quickstart.

``ctxrl tiny-model --out DIR [--seed N]`` writes a folder that loads in transformers, TRL, peft and vLLM:

- a byte-level BPE tokenizer trained with ``tokenizers`` on text generated from the environment's own
  vocabulary (context-file headers, shell commands, tool calls and outputs, task text), with ChatML-style
  special tokens and a chat template that supports tool calls;
- a randomly initialised Qwen3 model (4 layers, width 256, ~3 M parameters, 32k positions).

Same seed, same bytes: the corpus, the tokenizer training and the weight initialisation are seeded, and
nothing time- or machine-dependent is written.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from ctxrl.env.tokenizer import IM_END, PAD, build_tokenizer
from ctxrl.errors import UsageError
from ctxrl.rewards.cost import ModelGeometry


@dataclass(frozen=True)
class TinyModelConfig:
    """Geometry of the tiny model. Defaults give ~3 M parameters; every field is deterministic."""

    vocab_size: int = 2048
    """Target BPE vocabulary (special and markup tokens included)."""
    hidden_size: int = 256
    """Model width."""
    intermediate_size: int = 512
    """MLP width."""
    num_hidden_layers: int = 4
    """Transformer blocks."""
    num_attention_heads: int = 4
    """Query heads."""
    num_key_value_heads: int = 2
    """Key/value heads (grouped-query attention)."""
    head_dim: int = 64
    """Per-head width."""
    max_position_embeddings: int = 32768
    """Longest context the model accepts (>= 8192 so 32k-token harness contexts fit)."""
    corpus_lines: int = 6000
    """Lines of generated text the tokenizer is trained on."""


def tiny_geometry() -> ModelGeometry:
    """The FLOPs geometry of the tiny model: the cost reference of the scripted policies."""
    return ModelGeometry.from_config({**asdict(TinyModelConfig()), "model_type": "qwen3"})


def build_tiny_model(out: str | Path, seed: int = 0, force: bool = False) -> Path:
    """Write tokenizer + randomly initialised Qwen3 model to ``out``; return the folder.

    Refuses a non-empty ``out`` unless ``force`` (then the folder is replaced). Same seed, same bytes.
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise UsageError(f"--out {out} is not empty; pass --force to replace it")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)

    cfg = TinyModelConfig()
    tokenizer = build_tokenizer(
        seed,
        vocab_size=cfg.vocab_size,
        corpus_lines=cfg.corpus_lines,
        model_max_length=cfg.max_position_embeddings,
    )
    vocab = len(tokenizer)
    model_cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        bos_token_id=None,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(model_cfg)
    model.generation_config.do_sample = False
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
