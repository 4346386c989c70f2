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

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from ctxrl.errors import UsageError

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<|endoftext|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]
# Markup the model writes and reads; atomic tokens, but not "special" (decoding keeps them).
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# ChatML with tool calls. Rendering messages[:k] is always a token prefix of rendering messages[:k+1]
# (no message is rewritten once rendered), which the rollout loop relies on for token-in/token-out.
CHAT_TEMPLATE = (
    # No literal whitespace outside expressions: newlines are written as {{ nl }}, so the template renders
    # the same whatever trim/lstrip settings the Jinja environment uses.
    "{% set nl = '\\n' %}"
    "{% if tools %}"
    "<|im_start|>system{{ nl }}"
    "{% if messages and messages[0].role == 'system' %}{{ messages[0].content }}{{ nl }}{{ nl }}{% endif %}"
    "# Tools{{ nl }}<tools>{{ nl }}"
    "{% for tool in tools %}{{ tool | tojson }}{{ nl }}{% endfor %}"
    "</tools>{{ nl }}"
    'Call a tool with <tool_call>{"name": NAME, "arguments": {...}}</tool_call>'
    "<|im_end|>{{ nl }}"
    "{% elif messages and messages[0].role == 'system' %}"
    "<|im_start|>system{{ nl }}{{ messages[0].content }}<|im_end|>{{ nl }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if loop.first and message.role == 'system' %}"
    "{% elif message.role == 'assistant' %}"
    "<|im_start|>assistant{{ nl }}{{ message.content if message.content else '' }}"
    "{% if message.tool_calls %}{% for tc in message.tool_calls %}"
    "{% set f = tc.function if tc.function is defined else tc %}"
    '<tool_call>{"name": {{ f.name | tojson }}, "arguments": '
    "{{ f.arguments if f.arguments is string else (f.arguments | tojson) }}}</tool_call>"
    "{% endfor %}{% endif %}"
    "<|im_end|>{{ nl }}"
    "{% elif message.role == 'tool' %}"
    "<|im_start|>tool{{ nl }}<tool_response>{{ nl }}{{ message.content }}{{ nl }}</tool_response><|im_end|>{{ nl }}"
    "{% else %}"
    "<|im_start|>{{ message.role }}{{ nl }}{{ message.content }}<|im_end|>{{ nl }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ nl }}{% endif %}"
)


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


_WORDS = [
    "context",
    "budget",
    "tokens",
    "limit",
    "reserve",
    "turn",
    "step",
    "action",
    "edit",
    "receipt",
    "applied",
    "rejected",
    "grew",
    "failed",
    "matched",
    "nothing",
    "pinned",
    "prefix",
    "editable",
    "region",
    "skill",
    "task",
    "submit",
    "answer",
    "key",
    "value",
    "hash",
    "number",
    "board",
    "grid",
    "row",
    "column",
    "cell",
    "event",
    "update",
    "state",
    "offload",
    "file",
    "view",
    "evict",
    "archive",
    "search",
    "read",
    "document",
    "corpus",
    "question",
    "hop",
    "repository",
    "test",
    "failing",
    "bug",
    "fix",
    "patch",
    "function",
    "return",
    "import",
    "module",
    "error",
    "assert",
    "expected",
    "actual",
    "note",
    "summary",
    "keep",
    "drop",
    "pin",
    "unpin",
    "overflow",
    "stub",
    "restore",
    "status",
    "usage",
    "share",
    "system",
    "user",
    "assistant",
    "tool",
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "it",
    "for",
    "on",
    "with",
    "as",
    "at",
    "by",
    "from",
    "this",
    "that",
]
_COMMANDS = (
    "cat",
    "ls -la",
    "grep -n",
    "sed -i",
    "head -n 20",
    "tail -n 20",
    "wc -l",
    "python3 -c",
    "find . -name",
    "echo",
    "diff -u",
    "mv",
    "cp",
    "rm -f",
    "pytest -q",
    "awk '{print $1}'",
)
_TOOLS = (
    "shell",
    "submit",
    "context_status",
    "context_pin",
    "context_unpin",
    "context_drop",
    "context_note",
    "read_overflow",
    "evict_file_view",
    "archive_thread",
    "search_archive",
    "search",
    "read",
)
_ROLES = ("user", "assistant", "tool")


def _corpus(seed: int, n_lines: int) -> list[str]:
    """Deterministic text in the environment's vocabulary, for tokenizer training."""
    rng = random.Random(seed)

    def words(k: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(k))

    def ident() -> str:
        return "".join(rng.choice("0123456789abcdef") for _ in range(rng.choice((6, 8, 12, 16))))

    lines: list[str] = []
    for i in range(n_lines):
        kind = i % 8
        if kind == 0:
            lines.append(f"[[CTX_TURN {rng.randint(0, 200)} role={rng.choice(_ROLES)}]]")
        elif kind == 1:
            lines.append(f"{rng.choice(_COMMANDS)} {words(2).replace(' ', '_')}.txt")
        elif kind == 2:
            args = {"command": f"{rng.choice(_COMMANDS)} {ident()}"}
            call = {"name": rng.choice(_TOOLS), "arguments": args}
            lines.append(f"<tool_call>{json.dumps(call)}</tool_call>")
        elif kind == 3:
            lines.append(f"key_{ident()} = {rng.randint(0, 10**9)}  # {words(4)}")
        elif kind == 4:
            lines.append(f"[context {rng.randint(0, 32000)}/{30000} tokens] receipt: {words(3)}")
        elif kind == 5:
            lines.append(words(rng.randint(6, 18)).capitalize() + ".")
        elif kind == 6:
            lines.append(f"def {words(1)}_{i}(x):\n    return x + {rng.randint(0, 99)}")
        else:
            cells = " | ".join(str(rng.randint(0, 9)) for _ in range(rng.randint(3, 8)))
            lines.append(f"| {cells} |")
    return lines


def build_tokenizer(seed: int = 0, config: TinyModelConfig | None = None) -> object:
    """Train the byte-level BPE tokenizer and wrap it as a ``PreTrainedTokenizerFast`` with the chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    cfg = config or TinyModelConfig()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size - len(MARKUP_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed, cfg.corpus_lines), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        model_max_length=cfg.max_position_embeddings,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


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
    tokenizer = build_tokenizer(seed, cfg)
    vocab = len(tokenizer)  # type: ignore[arg-type]
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
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),  # type: ignore[attr-defined]
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),  # type: ignore[attr-defined]
        bos_token_id=None,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(model_cfg)
    model.generation_config.do_sample = False
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)  # type: ignore[attr-defined]
    return out
