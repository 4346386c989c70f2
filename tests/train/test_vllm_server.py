"""The ``vllm-server`` engine against a real vLLM OpenAI-compatible server on 127.0.0.1 (started once per module).

Checks token in / token out (ids and logprobs against a transformers forward pass), prefix-cache hits reported
per prompt, too-long prompts, the plain server refusing weight updates, and that the server process is gone
after the fixture stops it. An unreachable server fails fast without starting anything.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxrl.errors import EngineError
from ctxrl.train.engines import Engine, EngineConfig, SamplingConfig, make_engine
from ctxrl.train.engines.server import VLLMServer, VLLMServerEngine, free_port


def chat_prompt(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return list(ids)


def assert_matches_forward(
    model: Any, prompt: list[int], token_ids: list[int], logprobs: list[float]
) -> None:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + token_ids])).logits[0].float()
    ref = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    chosen = ref.gather(-1, torch.tensor(token_ids).unsqueeze(-1)).squeeze(-1)
    assert len(token_ids) == len(logprobs) > 0
    assert (chosen - torch.tensor(logprobs)).abs().max().item() < 1e-3


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[VLLMServer]:
    """The server, started through ``make_engine`` (so the engine owns it) and stopped by the engine's close."""
    engine = make_engine(
        EngineConfig(name="vllm-server", max_model_len=4096, startup_timeout_s=180.0), tiny_model_dir
    )
    assert isinstance(engine, VLLMServerEngine) and engine.server is not None
    srv = engine.server
    pid = srv.pid
    assert pid is not None and srv.running and srv.url.startswith("http://127.0.0.1:")
    try:
        yield srv
    finally:
        engine.close()
    assert not srv.running
    with pytest.raises(ProcessLookupError):  # the whole process group is gone, engine core included
        os.killpg(pid, 0)


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def test_unreachable_server_is_a_clear_error_fast() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    start = time.monotonic()
    with pytest.raises(EngineError, match=r"127\.0\.0\.1.*cannot be reached"):
        VLLMServerEngine(url, retries=1)
    assert time.monotonic() - start < 10


def test_silent_server_times_out_without_retrying() -> None:
    """A port that accepts connections but never answers: a bounded wait, one try, a clear error."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)  # the kernel completes connections; nobody reads or answers
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(EngineError, match="did not answer within 1 s"):
            VLLMServerEngine(url, connect_timeout=1.0, retries=3)
        assert time.monotonic() - start < 3


@pytest.mark.vllm
@pytest.mark.slow
def test_server_multi_step_token_in_token_out_with_cache_hits(
    server: VLLMServer, tiny_tokenizer: Any, hf_model: Any
) -> None:
    engine = make_engine(EngineConfig(name="vllm-server", server_url=server.url))
    assert isinstance(engine, Engine) and engine.max_model_len == 4096
    # longer than two KV blocks (128 tokens each on this CPU build), so whole blocks get cached
    prompts = [
        chat_prompt(tiny_tokenizer, f"episode {k}: find key_{k:04d} in the files " * 25) for k in range(2)
    ]
    tool = tiny_tokenizer.encode(
        "<|im_end|>\n<|im_start|>tool\nkey_0001 = 771<|im_end|>\n<|im_start|>assistant\n"
    )
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=12)
    for step in range(3):
        gens = engine.generate(prompts, sampling)
        assert len(gens) == 2
        for prompt, gen in zip(prompts, gens):
            assert gen.finish_reason in ("stop", "length") and len(gen.token_ids) <= 12
            assert_matches_forward(hf_model, prompt, gen.token_ids, gen.logprobs)
            if step > 0:  # the previous step's prompt is in the server's prefix cache
                assert 128 <= gen.num_cached_tokens < len(prompt)
        prompts = [p + g.token_ids + tool for p, g in zip(prompts, gens)]

    greedy = SamplingConfig(temperature=0.0, max_new_tokens=10, ignore_eos=True)
    [gen] = engine.generate(prompts[:1], greedy)
    assert len(gen.token_ids) == 10 and gen.finish_reason == "length"
    assert_matches_forward(hf_model, prompts[0], gen.token_ids, gen.logprobs)


@pytest.mark.vllm
@pytest.mark.slow
def test_server_too_long_prompt_is_aborted_and_bad_ids_are_errors(server: VLLMServer) -> None:
    engine = VLLMServerEngine(server.url)
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=8, ignore_eos=True)
    aborted, cut, normal = engine.generate([[7] * 4096, [7] * 4094, [7] * 10], sampling)
    assert aborted.finish_reason == "abort" and aborted.token_ids == []
    assert cut.finish_reason == "length" and 0 < len(cut.token_ids) <= 2
    assert len(normal.token_ids) == 8
    with pytest.raises(EngineError, match="answered 400"):  # the server validates the vocabulary
        engine.generate([[10**7]], sampling)


@pytest.mark.vllm
@pytest.mark.slow
def test_plain_server_refuses_weight_updates(server: VLLMServer, hf_model: Any) -> None:
    engine = VLLMServerEngine(server.url)
    with pytest.raises(EngineError, match="trl vllm-serve"):
        engine.update_weights(hf_model)
    assert not engine.supports_sleep
    engine.sleep()
    engine.wake()
    engine.close()
    assert server.running  # closing an engine that did not start the server leaves it running
