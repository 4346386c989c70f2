"""Engines: token in / token out against a transformers forward pass, weight updates, bad input.

The vLLM tests share the session's one in-process engine (``vllm_llm``); the weight-update test restores the
original weights before it returns, so later tests see the original tiny model.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ctxrl.errors import ConfigError, EngineError, ModelLoadError
from ctxrl.train.engines import Engine, EngineConfig, Generation, SamplingConfig, make_engine

SAMPLED = SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=24)
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=16, ignore_eos=True)


def chat_prompt(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return list(ids)


def prompts_of(tokenizer: Any) -> list[list[int]]:
    """Three prompts of different lengths (exercises left padding in the transformers engine)."""
    return [
        chat_prompt(tokenizer, "find key_0042 and submit it"),
        chat_prompt(tokenizer, "hi"),
        chat_prompt(tokenizer, "read the file view, evict what is stale, then answer the question " * 6),
    ]


def forward_logprobs(model: Any, prompt: list[int], generated: list[int]) -> tuple[Any, Any]:
    """Per generated position: the logprob of the generated token and the best logprob (one forward pass)."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    chosen = logprobs.gather(-1, torch.tensor(generated).unsqueeze(-1)).squeeze(-1)
    return chosen, logprobs.max(dim=-1).values


def assert_matches_forward(model: Any, prompt: list[int], gen: Generation, greedy: bool = False) -> None:
    assert len(gen.token_ids) == len(gen.logprobs) > 0
    chosen, best = forward_logprobs(model, prompt, gen.token_ids)
    for i, lp in enumerate(gen.logprobs):
        assert abs(chosen[i].item() - lp) < 1e-3, (i, chosen[i].item(), lp)
        if greedy:  # the engine's pick is the forward pass's argmax (up to near-ties of a random model)
            assert chosen[i].item() >= best[i].item() - 1e-4


def perturbed_state_dict(state: dict[str, Any], seed: int, scale: float = 0.05) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in state.items()}


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


# ---------------------------------------------------------------------------------------------- config


def test_sampling_config_checks_its_fields() -> None:
    with pytest.raises(ConfigError, match="temperature"):
        SamplingConfig(temperature=-1.0)
    with pytest.raises(ConfigError, match="top_p"):
        SamplingConfig(top_p=0.0)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        SamplingConfig(max_new_tokens=0)
    assert SamplingConfig().temperature == 0.7 and SamplingConfig().top_p == 0.95


def test_make_engine_unknown_name_lists_the_names() -> None:
    with pytest.raises(ConfigError, match="vllm-server"):
        make_engine("llama.cpp", "x")


def test_the_registry_names_each_engine_class_and_its_capabilities() -> None:
    from ctxrl.train.engines import ENGINES, EngineConfig, engine_spec
    from ctxrl.train.engines.hf import HFEngine
    from ctxrl.train.engines.scripted import ScriptedEngine
    from ctxrl.train.engines.server import VLLMServerEngine
    from ctxrl.train.engines.vllm_engine import VLLMEngine

    assert {cls.name for cls in (HFEngine, ScriptedEngine, VLLMServerEngine, VLLMEngine)} == set(ENGINES)
    assert all(spec.token_io for spec in ENGINES.values())
    scripted, server = engine_spec("scripted"), engine_spec("vllm-server")
    assert not scripted.has_model and scripted.needs_policy and scripted.weight_sync == "none"
    assert not scripted.loads_weights(EngineConfig(name="scripted"))
    assert server.loads_weights(EngineConfig(name="vllm-server"))  # it starts a server on the folder
    assert not server.loads_weights(EngineConfig(name="vllm-server", server_url="http://127.0.0.1:1"))
    assert engine_spec("vllm").cached_tokens and not engine_spec("hf").cached_tokens
    assert [name for name, spec in ENGINES.items() if spec.structured_outputs] == ["vllm", "vllm-server"]
    with pytest.raises(ConfigError, match=r"unknown engine 'llama\.cpp'; choose one of vllm, vllm-server"):
        engine_spec("llama.cpp")


def test_no_engine_name_is_compared_as_a_string_outside_the_registry() -> None:
    """Callers ask ``ENGINES[name]``'s capabilities; a literal ``name == "scripted"`` elsewhere is how a new
    engine ends up half supported."""
    import ast

    import ctxrl
    from ctxrl.train.engines import ENGINE_NAMES

    root = Path(ctxrl.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.parent.name == "engines":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            for side in (node.left, *node.comparators):
                items = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
                if any(isinstance(i, ast.Constant) and i.value in ENGINE_NAMES for i in items):
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not found, f"engine names compared as strings: {found}"


# ---------------------------------------------------------------------------------------------- transformers


def test_hf_engine_token_in_token_out(tiny_model_dir: Path, tiny_tokenizer: Any, hf_model: Any) -> None:
    engine = make_engine(EngineConfig(name="hf", seed=3), tiny_model_dir)
    assert isinstance(engine, Engine)
    prompts = prompts_of(tiny_tokenizer)
    gens = engine.generate(prompts, SAMPLED)
    assert len(gens) == 3
    for prompt, gen in zip(prompts, gens):
        assert gen.num_cached_tokens == 0
        assert gen.finish_reason in ("stop", "length")
        assert len(gen.token_ids) <= SAMPLED.max_new_tokens
        assert_matches_forward(hf_model, prompt, gen)
    # seeded once at construction: a second engine with the same seed samples the same tokens
    again = make_engine(EngineConfig(name="hf", seed=3), tiny_model_dir).generate(prompts, SAMPLED)
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]

    greedy = engine.generate(prompts, GREEDY)
    for prompt, gen in zip(prompts, greedy):
        assert len(gen.token_ids) == GREEDY.max_new_tokens and gen.finish_reason == "length"
        assert_matches_forward(hf_model, prompt, gen, greedy=True)


def test_hf_engine_keeps_the_stop_token(tiny_model_dir: Path, tiny_tokenizer: Any) -> None:
    engine = make_engine("hf", tiny_model_dir)
    _check_stop_token_kept(engine, chat_prompt(tiny_tokenizer, "find key_0042 and submit it"))


def _check_stop_token_kept(engine: Engine, prompt: list[int]) -> None:
    """Greedy with a stop id taken from the greedy output: the output ends right after that id, which is kept."""
    free = engine.generate([prompt], SamplingConfig(temperature=0.0, max_new_tokens=12, ignore_eos=True))[0]
    stop = free.token_ids[5]
    first = free.token_ids.index(stop)
    stopped = engine.generate(
        [prompt], SamplingConfig(temperature=0.0, max_new_tokens=12, stop_token_ids=(stop,))
    )[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert stopped.logprobs == pytest.approx(free.logprobs[: first + 1], abs=1e-4)


def test_hf_engine_weight_update_from_state_dict_and_peft(tiny_model_dir: Path, tiny_tokenizer: Any) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    engine = make_engine("hf", tiny_model_dir)
    prompt = chat_prompt(tiny_tokenizer, "find key_0042 and submit it")
    before = engine.generate([prompt], GREEDY)[0]

    noisy = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    noisy.load_state_dict(perturbed_state_dict(noisy.state_dict(), seed=1))
    engine.update_weights(noisy.state_dict())
    after = engine.generate([prompt], GREEDY)[0]
    assert after.token_ids != before.token_ids
    assert_matches_forward(noisy, prompt, after, greedy=True)

    # a LoRA model: the engine gets the merged weights under the base model's names
    lora = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    ).eval()
    engine.update_weights(lora)
    lora_gen = engine.generate([prompt], GREEDY)[0]
    assert lora_gen.token_ids != before.token_ids
    merged = lora.merge_and_unload()
    assert_matches_forward(merged, prompt, lora_gen, greedy=True)

    with pytest.raises(EngineError, match="no parameter named"):
        engine.update_weights({"not.a.weight": torch.zeros(1)})


# ---------------------------------------------------------------------------------------------- scripted


def test_scripted_engine_tokenises_the_action_and_ends_with_eos(tiny_tokenizer: Any) -> None:
    seen: list[list[int]] = []

    def policy(prompt_ids: list[int]) -> str:
        seen.append(prompt_ids)
        return '<tool_call>{"name": "submit", "arguments": {"answer": "42"}}</tool_call>'

    engine = make_engine("scripted", policy=policy, tokenizer=tiny_tokenizer)
    assert isinstance(engine, Engine)
    prompt = chat_prompt(tiny_tokenizer, "submit 42")
    [gen] = engine.generate([prompt], SamplingConfig())
    assert seen == [prompt]
    assert gen.token_ids[-1] == tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tiny_tokenizer.decode(gen.token_ids[:-1]) == policy(prompt)
    assert gen.logprobs == [0.0] * len(gen.token_ids) and gen.finish_reason == "stop"
    [cut] = engine.generate([prompt], SamplingConfig(max_new_tokens=3))
    assert cut.token_ids == gen.token_ids[:3] and cut.finish_reason == "length"
    with pytest.raises(EngineError, match="scripted engine cannot constrain output to a JSON schema"):
        engine.generate([prompt], SamplingConfig(json_schema='{"type": "object"}'))
    with pytest.raises(EngineError, match="no weights"):
        engine.update_weights({})


# ---------------------------------------------------------------------------------------------- bad input


def test_folder_that_is_not_a_causal_lm_is_refused_before_any_engine_starts(
    tmp_path: Path, tiny_tokenizer: Any, tiny_model_dir: Path
) -> None:
    from transformers import ViTConfig

    tokenizer_only = tmp_path / "tokenizer_only"
    tiny_tokenizer.save_pretrained(tokenizer_only)
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "config.json").write_text("{not json")
    vision = tmp_path / "vision"
    ViTConfig().save_pretrained(vision)
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))

    cases = {
        tmp_path / "missing": "does not exist",
        tokenizer_only: "tokenizer-only",
        garbage: "not valid JSON",
        vision: "not a causal LM",
        no_weights: "no weight files",
        unknown: "cannot read",
    }
    for folder, message in cases.items():
        for name in ("hf", "vllm", "vllm-server"):
            with pytest.raises(ModelLoadError, match=message):
                make_engine(name, folder)

    # the scripted engine only needs a tokenizer, which a tokenizer-only folder has
    scripted = make_engine("scripted", tokenizer_only, policy=lambda ids: "ok")
    assert scripted.generate([[5, 6]], SamplingConfig())[0].finish_reason == "stop"
    with pytest.raises(ModelLoadError, match="no tokenizer files"):
        make_engine("scripted", garbage, policy=lambda ids: "ok")


def test_hf_engine_too_long_prompt_is_aborted_and_the_batch_runs(hf_model: Any) -> None:
    from ctxrl.train.engines.hf import HFEngine

    engine = HFEngine.from_model(hf_model, max_model_len=64)
    _check_too_long(engine)


def test_scripted_engine_too_long_prompt_is_aborted(tiny_tokenizer: Any) -> None:
    from ctxrl.train.engines.scripted import ScriptedEngine

    engine = ScriptedEngine(lambda ids: "a b c d e f g h i j", tiny_tokenizer, max_model_len=64)
    _check_too_long(engine)


def _check_too_long(engine: Engine) -> None:
    """A full-length prompt is aborted, a nearly full one is cut to the room left, the others run."""
    n = engine.max_model_len
    full, nearly, short = [7] * n, [7] * (n - 2), [7] * 10
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=8, ignore_eos=True)
    aborted, cut, normal = engine.generate([full, nearly, short], sampling)
    assert (
        aborted.finish_reason == "abort"
        and aborted.token_ids == []
        and "max_model_len" in aborted.extra["reason"]
    )
    assert cut.finish_reason == "length" and 0 < len(cut.token_ids) <= 2
    assert len(normal.token_ids) > 2
    with pytest.raises(EngineError, match="empty"):
        engine.generate([[]], sampling)
    with pytest.raises(EngineError, match="vocabulary"):
        engine.generate([[10**7]], sampling)


# ---------------------------------------------------------------------------------------------- vLLM in-process


@pytest.fixture(scope="module")
def vllm_engine(vllm_llm: Any) -> Any:
    from ctxrl.train.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine.from_llm(vllm_llm)
    assert isinstance(engine, Engine) and not engine.supports_sleep  # CPU: no sleep mode
    return engine


@pytest.mark.vllm
def test_vllm_engine_token_in_token_out(vllm_engine: Any, tiny_tokenizer: Any, hf_model: Any) -> None:
    prompts = prompts_of(tiny_tokenizer)
    gens = vllm_engine.generate(prompts, SAMPLED)
    assert len(gens) == 3
    for prompt, gen in zip(prompts, gens):
        assert gen.finish_reason in ("stop", "length") and len(gen.token_ids) <= SAMPLED.max_new_tokens
        assert 0 <= gen.num_cached_tokens <= len(prompt)
        assert_matches_forward(hf_model, prompt, gen)
    for prompt, gen in zip(prompts, vllm_engine.generate(prompts, GREEDY)):
        assert len(gen.token_ids) == GREEDY.max_new_tokens and gen.finish_reason == "length"
        assert_matches_forward(hf_model, prompt, gen, greedy=True)


@pytest.mark.vllm
def test_vllm_engine_constrains_output_to_a_proposal_schema(vllm_engine: Any, tiny_tokenizer: Any) -> None:
    """Structured outputs on the CPU build: even the untrained tiny model can only write a proposal of the
    schema, naming only the parent's rule ids and the notes' citations."""
    import json

    from ctxrl.evolve.proposal import proposal_schema, read_proposal, well_formed
    from ctxrl.evolve.skill import Dropped, Skill

    parent = Skill("## Context\n- Batch edits.\n- Mind the tail.", "file", None, 0)
    cites = frozenset({"[n1.B.s0]", "[n2.B.s3]"})
    schema = json.dumps(proposal_schema(parent, cites, style="edits"))
    prompt = chat_prompt(tiny_tokenizer, "propose")
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=3000, json_schema=schema)
    gens = vllm_engine.generate([prompt] * 3, sampling)
    for gen in gens:
        assert gen.finish_reason == "stop"
        text = tiny_tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        got = read_proposal(text, parent=parent, round=1, known_steps=cites)
        assert isinstance(got, Skill) or (isinstance(got, Dropped) and well_formed(got.reason)), text


@pytest.mark.vllm
def test_vllm_engine_keeps_the_stop_token(vllm_engine: Any, tiny_tokenizer: Any) -> None:
    _check_stop_token_kept(vllm_engine, chat_prompt(tiny_tokenizer, "find key_0042 and submit it"))


@pytest.mark.vllm
def test_vllm_engine_multi_step_reports_prefix_cache_hits(
    vllm_engine: Any, vllm_llm: Any, tiny_tokenizer: Any, hf_model: Any
) -> None:
    """Each step's prompt extends the last (prompt + generation + tool output): later steps hit the cache."""
    block = vllm_llm.llm_engine.vllm_config.cache_config.block_size  # 128 on this CPU build
    prompts = [
        chat_prompt(tiny_tokenizer, f"episode {k}: find key_{k:04d} in the files " * 25) for k in range(2)
    ]
    assert min(map(len, prompts)) > 2 * block
    tool = tiny_tokenizer.encode(
        "<|im_end|>\n<|im_start|>tool\nkey_0001 = 771<|im_end|>\n<|im_start|>assistant\n"
    )
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=12)
    previous: list[list[int]] = []
    for step in range(3):
        gens = vllm_engine.generate(prompts, sampling)
        for k, (prompt, gen) in enumerate(zip(prompts, gens)):
            assert_matches_forward(hf_model, prompt, gen)
            if step > 0:  # every full block of the previous step's prompt is served from the cache
                assert len(previous[k]) // block * block <= gen.num_cached_tokens < len(prompt)
        previous = prompts
        prompts = [p + g.token_ids + tool for p, g in zip(prompts, gens)]


@pytest.mark.vllm
def test_vllm_engine_weight_update_matches_transformers(
    vllm_engine: Any, tiny_model_dir: Path, tiny_tokenizer: Any, hf_model: Any
) -> None:
    from transformers import AutoModelForCausalLM

    prompts = prompts_of(tiny_tokenizer)[:2]
    original = {k: v.clone() for k, v in hf_model.state_dict().items()}
    before = vllm_engine.generate(prompts, GREEDY)
    noisy = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    noisy.load_state_dict(perturbed_state_dict(original, seed=1))
    try:
        vllm_engine.update_weights(noisy)
        after = vllm_engine.generate(prompts, GREEDY)
        for prompt, old, new in zip(prompts, before, after):
            assert new.token_ids != old.token_ids
            assert_matches_forward(noisy, prompt, new, greedy=True)
    finally:
        vllm_engine.update_weights(original)
    restored = vllm_engine.generate(prompts, GREEDY)
    assert [g.token_ids for g in restored] == [g.token_ids for g in before]
    for old, new in zip(before, restored):
        assert new.logprobs == pytest.approx(old.logprobs, abs=1e-4)


COMPILED_CHILD = """
import json, sys
from transformers import AutoModelForCausalLM
from ctxrl.train.engines import EngineConfig, SamplingConfig, make_engine

model_dir, noisy_dir, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
greedy = SamplingConfig(temperature=0.0, max_new_tokens=16, ignore_eos=True)
engine = make_engine(EngineConfig(name="vllm", compile=True, max_model_len=1024), model_dir)
assert not engine.llm.llm_engine.vllm_config.model_config.enforce_eager
before = engine.generate(prompts, greedy)
engine.update_weights(AutoModelForCausalLM.from_pretrained(noisy_dir))
after = engine.generate(prompts, greedy)
engine.close()
print(json.dumps([[(g.token_ids, g.logprobs) for g in gens] for gens in (before, after)]))
"""


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_compiled_vllm_engine_generates_as_transformers_and_takes_new_weights(
    tiny_model_dir: Path, tiny_tokenizer: Any, hf_model: Any, tmp_path: Path
) -> None:
    """``engine.compile``: vLLM runs its model under torch.compile (in a process of its own, beside the suite's
    eager engine); greedy decoding still matches the transformers forward pass, and an in-place weight sync
    reaches the compiled model (a graph that kept the old weights as constants would fail the second half)."""
    import os
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM

    prompts = prompts_of(tiny_tokenizer)[:2]
    noisy = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    noisy.load_state_dict(perturbed_state_dict(hf_model.state_dict(), seed=1))
    noisy.save_pretrained(tmp_path / "noisy")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            COMPILED_CHILD,
            str(tiny_model_dir),
            str(tmp_path / "noisy"),
            json.dumps(prompts),
        ],
        capture_output=True,
        text=True,
        timeout=560,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    before, after = json.loads(done.stdout.strip().splitlines()[-1])
    for model, gens in ((hf_model, before), (noisy, after)):
        for prompt, (ids, logprobs) in zip(prompts, gens):
            assert_matches_forward(model, prompt, Generation(ids, logprobs, "length"), greedy=True)
    assert [ids for ids, _ in before] != [ids for ids, _ in after]


def test_engine_compile_is_refused_by_engines_that_do_not_compile(tiny_model_dir: Path) -> None:
    for name in ("hf", "scripted", "vllm-server"):
        with pytest.raises(ConfigError, match=f"engine.compile: the {name} engine does not compile"):
            make_engine(EngineConfig(name=name, compile=True), tiny_model_dir)


def test_weights_reach_a_bfloat16_engine_in_its_dtype_rounded_as_its_loader_would() -> None:
    import torch

    from ctxrl.train.engines.vllm_engine import VLLMEngine, weights_in_dtype

    gen = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(64, 8, generator=gen), "ids": torch.arange(4), "h": torch.randn(3).bfloat16()}
    out = dict(weights_in_dtype(state, torch.bfloat16))
    assert (
        out["w"].dtype == torch.bfloat16
        and out["ids"].dtype == torch.int64
        and out["h"].dtype == torch.bfloat16
    )
    assert torch.equal(out["ids"], state["ids"]) and torch.equal(out["h"], state["h"])
    loaded = torch.empty(64, 8, dtype=torch.bfloat16)
    loaded.copy_(state["w"])  # what vLLM's default weight loader does with a float32 tensor
    assert torch.equal(out["w"], loaded) and not torch.equal(out["w"].float(), state["w"])
    # and update_weights hands the engine those tensors (a stand-in for vllm.LLM that records what its
    # worker's reload_weights receives: the wiring, which a real bfloat16 engine would only warn about)
    received: dict[str, torch.Tensor] = {}

    def collective_rpc(method: str, kwargs: dict[str, Any]) -> None:
        assert method == "reload_weights"
        received.update(kwargs["weights_iterator"])

    config = SimpleNamespace(dtype=torch.bfloat16, max_model_len=64, get_vocab_size=lambda: 100)
    llm = SimpleNamespace(
        llm_engine=SimpleNamespace(
            model_config=config,
            vllm_config=SimpleNamespace(cache_config=SimpleNamespace(block_size=16)),
            model_executor=SimpleNamespace(
                driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=object()))
            ),
        ),
        collective_rpc=collective_rpc,
        reset_prefix_cache=lambda: True,
    )
    VLLMEngine.from_llm(llm).update_weights(state)
    assert received["w"].dtype == torch.bfloat16 and torch.equal(received["w"], loaded)
    assert dict(weights_in_dtype(state, torch.float32))["w"].dtype == torch.float32  # a float32 engine: as is


@pytest.mark.vllm
def test_vllm_engine_too_long_prompt_is_aborted_and_the_batch_runs(vllm_engine: Any) -> None:
    _check_too_long(vllm_engine)


@pytest.mark.vllm
def test_vllm_engine_sleep_and_wake_are_no_ops_on_cpu(vllm_engine: Any, tiny_tokenizer: Any) -> None:
    prompt = chat_prompt(tiny_tokenizer, "hi")
    before = vllm_engine.generate([prompt], GREEDY)[0]
    vllm_engine.sleep()
    vllm_engine.wake()
    assert vllm_engine.generate([prompt], GREEDY)[0].token_ids == before.token_ids


@pytest.mark.vllm
def test_vllm_engine_block_size_comes_from_the_running_engine(vllm_engine: Any, vllm_llm: Any) -> None:
    """The CPU build caches KV in 128-token blocks (GPU builds: 16); the cost replay must price with the
    engine's own figure, read from its config."""
    assert vllm_engine.cache_block_size == vllm_llm.llm_engine.vllm_config.cache_config.block_size == 128


def test_vllm_engine_without_a_readable_block_size_fails_loudly() -> None:
    """A vLLM whose config is laid out otherwise is an error naming the problem, not a silent 16."""
    from types import SimpleNamespace

    from ctxrl.train.engines.vllm_engine import VLLMEngine

    model_config = SimpleNamespace(max_model_len=2048, get_vocab_size=lambda: 2048)
    llm = SimpleNamespace(llm_engine=SimpleNamespace(model_config=model_config))  # no vllm_config
    with pytest.raises(EngineError, match="cannot read the KV-cache block size"):
        VLLMEngine.from_llm(llm)
