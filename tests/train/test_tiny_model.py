"""The tiny offline model: deterministic bytes, loads and generates in transformers and vLLM."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path
from typing import Any

import pytest

from ctxrl.train.tiny_model import build_tiny_model


def _digest(folder: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())}


def test_same_seed_same_bytes(tmp_path: Path, tiny_model_dir: Path) -> None:
    again = build_tiny_model(tmp_path / "again", seed=0)
    assert _digest(again) == _digest(tiny_model_dir)
    other = build_tiny_model(tmp_path / "other", seed=1)
    assert _digest(other)["model.safetensors"] != _digest(tiny_model_dir)["model.safetensors"]


def test_force_replaces_and_non_empty_refused(tmp_path: Path) -> None:
    from ctxrl.errors import UsageError

    out = tmp_path / "m"
    out.mkdir()
    (out / "stale.bin").write_bytes(b"x")
    with pytest.raises(UsageError, match="not empty"):
        build_tiny_model(out)
    build_tiny_model(out, force=True)
    assert not (out / "stale.bin").exists() and (out / "config.json").is_file()


def test_tokenizer_round_trips_any_text(tiny_tokenizer: Any) -> None:
    text = '[[CTX_TURN 3 role=tool]]\nkey_9f3a = 771 ünïcødé 🙂\n<tool_call>{"name": "shell"}</tool_call>'
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids) == text
    # markup tokens are single, non-special tokens: decoding with skip_special_tokens keeps them
    assert len(tiny_tokenizer.encode("<tool_call>", add_special_tokens=False)) == 1
    assert "<tool_call>" in tiny_tokenizer.decode(ids, skip_special_tokens=True)


def test_chat_template_renders_tools_and_is_prefix_stable(tiny_tokenizer: Any) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "shell",
                "description": "run",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "shell", "arguments": {"command": "ls"}}}
            ],
        },
        {"role": "tool", "content": "a.txt", "tool_call_id": "c1"},
        {"role": "assistant", "content": "done"},
    ]
    texts = [
        tiny_tokenizer.apply_chat_template(messages[:k], tools=tools, tokenize=False) for k in range(1, 6)
    ]
    for shorter, longer in itertools.pairwise(texts):
        assert longer.startswith(shorter)
    assert '<tool_call>{"name": "shell", "arguments": {"command": "ls"}}</tool_call>' in texts[-1]
    assert '"name": "shell"' in texts[0]  # the tool schema is in the system block
    gen = tiny_tokenizer.apply_chat_template(
        messages[:2], tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert gen.endswith("<|im_start|>assistant\n")


def test_loads_in_transformers_and_generates(tiny_model_dir: Path, tiny_tokenizer: Any) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    n_params = sum(p.numel() for p in model.parameters())
    # By hand (TinyModelConfig: vocab 2048, width 256, MLP 512, 4 layers, 4 query / 2 KV heads of 64):
    # per layer q 256*256 + k 256*128 + v 256*128 + o 256*256 + q/k norms 2*64 + two layer norms 2*256
    # + MLP 3*256*512 = 590,464; 4 layers 2,361,856; tied embedding 2048*256 = 524,288; final norm 256.
    assert n_params == 4 * 590_464 + 2048 * 256 + 256 == 2_886_400
    assert model.config.max_position_embeddings >= 8192
    ids = torch.tensor([tiny_tokenizer.encode("hello context", add_special_tokens=False)])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8, do_sample=False
    )
    assert out.shape[1] == ids.shape[1] + 8


@pytest.mark.vllm
def test_loads_in_vllm_and_matches_transformers(
    vllm_llm: Any, tiny_model_dir: Path, tiny_tokenizer: Any
) -> None:
    """vLLM's greedy tokens are transformers' argmax, and their logprobs agree (same weights, same math)."""
    import torch
    from transformers import AutoModelForCausalLM
    from vllm import SamplingParams, TokensPrompt

    prompt = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "find key_0042 and submit it"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0)
    out = vllm_llm.generate([TokensPrompt(prompt_token_ids=list(prompt))], params, use_tqdm=False)[0].outputs[
        0
    ]
    gen = list(out.token_ids)
    assert len(gen) == 12
    vllm_lp = [out.logprobs[i][t].logprob for i, t in enumerate(gen)]

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + gen])).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    for i, tok in enumerate(gen):
        assert logprobs[i, tok].item() >= logprobs[i].max().item() - 1e-4  # greedy choice is HF's argmax
        assert abs(logprobs[i, tok].item() - vllm_lp[i]) < 1e-3
