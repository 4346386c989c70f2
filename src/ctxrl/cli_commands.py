"""Implementations of the ``ctxrl`` subcommands. Imported only when a subcommand runs."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from ctxrl.errors import ModelLoadError


def run_tiny_model(args: argparse.Namespace) -> int:
    from ctxrl.train.tiny_model import build_tiny_model

    t0 = time.perf_counter()
    out = build_tiny_model(args.out, seed=args.seed, force=args.force)
    size = sum(f.stat().st_size for f in out.iterdir()) / 1e6
    print(
        f"tiny model (seed {args.seed}) written to {out} ({size:.1f} MB) in {time.perf_counter() - t0:.1f} s"
    )
    return 0


def ensure_tiny_model(folder: Path, seed: int = 0) -> Path:
    """Build the tiny model into ``folder`` unless a model is already there."""
    from ctxrl.train.tiny_model import build_tiny_model

    if (folder / "config.json").is_file():
        return folder
    return build_tiny_model(folder, seed=seed, force=True)


def _quickstart_prompts(tokenizer: object, n: int) -> list[list[int]]:
    """Chat prompts with one shared system prompt and tool list, so the prefix cache has work to do."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "shell",
                "description": "Run a shell command in the workspace.",
                "parameters": {
                    "type": "object",
                    "properties": {"command": {"type": "string"}},
                    "required": ["command"],
                },
            },
        },
    ]
    system = "You manage your own context. The editable region is mirrored to context.txt. " * 8
    prompts = []
    for i in range(n):
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Task {i}: find key_{i:04d} in the logs and submit its value."},
        ]
        ids = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        prompts.append(list(ids))
    return prompts


def run_quickstart(args: argparse.Namespace) -> int:
    """Build the tiny model, then generate chat-template prompts with the chosen engine."""
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    print(f"[1/2] tiny model -> {out / 'model'}")
    model_dir = ensure_tiny_model(out / "model", seed=args.seed)

    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load the tokenizer in {model_dir}: {exc}") from exc
    prompts = _quickstart_prompts(tokenizer, 16)
    max_new = 64
    print(f"[2/2] generating {len(prompts)} x {max_new} tokens with the {args.engine} engine")
    t0 = time.perf_counter()
    if args.engine == "vllm":
        from vllm import SamplingParams, TokensPrompt

        from ctxrl.train.vllm_local import make_llm

        llm = make_llm(model_dir, seed=args.seed, max_model_len=4096)
        params = SamplingParams(temperature=0.7, top_p=0.95, max_tokens=max_new, ignore_eos=True)
        t0 = time.perf_counter()
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
        generated = sum(len(o.outputs[0].token_ids) for o in outputs)
        cached = sum(o.num_cached_tokens or 0 for o in outputs)
        sample = outputs[0].outputs[0].token_ids
    else:
        import torch
        from transformers import AutoModelForCausalLM

        model: Any = AutoModelForCausalLM.from_pretrained(model_dir)
        torch.manual_seed(args.seed)
        generated, cached, sample = 0, 0, []
        for p in prompts:
            ids = torch.tensor([p])
            res = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new,
                do_sample=True,
                temperature=0.7,
                top_p=0.95,
                min_new_tokens=max_new,
            )
            new = res[0, len(p) :].tolist()
            generated += len(new)
            sample = sample or new
        elapsed = time.perf_counter() - t0
    prompt_tokens = sum(len(p) for p in prompts)
    print(
        f"  prompt tokens {prompt_tokens}, cached by the prefix cache {cached}, generated {generated} "
        f"in {elapsed:.2f} s ({generated / elapsed:.0f} tokens/s)"
    )
    print(f"  sample (untrained model, so noise): {tokenizer.decode(sample[:24])!r}")
    print(f"done. run folder: {out}")
    return 0
