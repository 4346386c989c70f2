"""The policy tokenizer the environment counts and renders with by default: the tiny offline tokenizer.

    tokenizer = load_tokenizer(None)          # the tiny tokenizer, built in memory (about a second, cached)
    tokenizer = load_tokenizer("runs/model")  # a model folder's tokenizer

The tiny tokenizer is a byte-level BPE trained with ``tokenizers`` on text generated from the environment's
own vocabulary (context-file headers, shell commands, tool calls and outputs, task text), with ChatML special
tokens and a chat template with tool calls. ``ctxrl.train.tiny_model`` saves it beside the tiny model's
weights. It lives here, in the bottom layer, so the environment needs nothing from the training side.
"""

from __future__ import annotations

import json
import random
from functools import lru_cache
from pathlib import Path
from typing import Any

from ctxrl.errors import ModelLoadError

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


def build_tokenizer(
    seed: int = 0, *, vocab_size: int = 2048, corpus_lines: int = 6000, model_max_length: int = 32768
) -> Any:
    """Train the byte-level BPE tokenizer (``vocab_size`` tokens, markup and special tokens included) on
    ``corpus_lines`` lines of generated text, and wrap it as a ``PreTrainedTokenizerFast`` with the chat
    template. Same seed, same tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(MARKUP_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed, corpus_lines), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        model_max_length=model_max_length,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def has_tokenizer(path: Path) -> bool:
    """Whether ``path`` holds tokenizer files."""
    return any((path / name).is_file() for name in _TOKENIZER_FILES)


def load_tokenizer_dir(model_dir: str | Path) -> Any:
    """Load the tokenizer of a model folder (a tokenizer-only folder is fine).

    Raises :class:`ModelLoadError` naming the folder when there is none or transformers cannot read it.
    """
    path = Path(model_dir)
    if not path.is_dir():
        raise ModelLoadError(f"tokenizer folder {path} does not exist or is not a folder")
    if not has_tokenizer(path):
        raise ModelLoadError(f"{path} has no tokenizer files ({', '.join(_TOKENIZER_FILES)})")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # OSError/ValueError/JSON errors from tokenizers: all mean "unreadable"
        raise ModelLoadError(f"transformers cannot load the tokenizer in {path}: {exc}") from None


@lru_cache(maxsize=4)
def load_tokenizer(source: str | None) -> Any:
    """The policy tokenizer: a model folder's, or the tiny tokenizer (seed 0, built in memory) for None."""
    return build_tokenizer() if source is None else load_tokenizer_dir(source)
