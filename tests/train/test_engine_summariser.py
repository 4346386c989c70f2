"""``modes.pressure.summariser: engine`` from the command line: the policy's engine writes the fold summaries.

The tiny model (random weights) is the policy on the ``hf`` engine in ``harness`` mode; a low soft ceiling
and ``keep_rounds: 0`` make the pressure pass fold after the first steps. Each fold's summary must be the
model's own greedy completion of the summary prompt, recomputed here with plain transformers from the
folded transcript the overflow store kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ctxrl.cli import main
from ctxrl.env.episode import PromptBuilder
from ctxrl.env.modes.pressure import SUMMARY_PROMPT
from ctxrl.errors import EngineError
from ctxrl.train.engines import SamplingConfig
from ctxrl.train.engines.scripted import ScriptedEngine
from ctxrl.train.summarise import engine_generate

MAX_NEW_TOKENS = 16


def _folds(trajectories: Path) -> list[dict[str, Any]]:
    folds = []
    for line in trajectories.read_text(encoding="utf-8").splitlines():
        for step in json.loads(line)["steps"]:
            for event in map(json.loads, step["events"]):
                if event["type"] == "pressure" and "fold" in event:
                    folds.append({**event["fold"], "summary_chars": event["summary_chars"]})
    return folds


def test_engine_summariser_runs_from_the_command_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    out, store = tmp_path / "run", tmp_path / "overflow"
    code = main(
        [
            "rollout",
            "--model",
            str(tiny_model_dir),
            "--out",
            str(out),
            "engine.name=hf",
            "rollout.mode=harness",
            "rollout.group_size=1",
            "rollout.workers=1",
            "rollout.max_steps=3",
            "rollout.keep_workspaces=true",
            "tasks.families=[retention]",
            "tasks.count=1",
            f"sampling.max_new_tokens={MAX_NEW_TOKENS}",
            "harness.modes.pressure.summariser=engine",
            "harness.modes.pressure.keep_rounds=0",
            "harness.modes.pressure.compact_pct=0.1",
            "harness.modes.pressure.summary_chars=300",
            f"harness.modes.overflow_dir={store}",
        ]
    )
    assert code == 0
    folds = _folds(out / "trajectories.jsonl")
    assert folds, "the pass never folded: the test no longer exercises the summariser"

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(tiny_model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    builder = PromptBuilder(tokenizer)
    [bodies] = [p for p in store.iterdir() if p.is_dir()]
    for fold in folds:
        assert fold["summariser"] == "engine" and fold["fallback"] is None
        summary = fold["summary"]
        answer, _, block = summary.partition("\nPreserved (compaction-safe):")
        block = "Preserved (compaction-safe):" + block if block else ""
        room = fold["summary_chars"] - len(block) - 1
        transcript = (bodies / f"{fold['overflow_id']}.txt").read_text(encoding="utf-8")
        prompt = SUMMARY_PROMPT.format(chars=room, transcript=transcript[:24000])
        ids = builder.full([{"role": "user", "content": prompt}], None)
        import torch

        with torch.no_grad():
            out_ids = model.generate(
                torch.tensor([ids]), max_new_tokens=MAX_NEW_TOKENS, do_sample=False, pad_token_id=0
            )
        expected = tokenizer.decode(out_ids[0, len(ids) :], skip_special_tokens=True).strip()
        assert len(answer) >= 16 and answer == expected[:room].rstrip()


def test_scripted_policies_need_a_model_to_summarise(capsys: pytest.CaptureFixture[str]) -> None:
    """A scripted policy has no model: one line naming both fixes, before any episode runs."""
    args = [
        "eval",
        "eval.policies=[harness]",
        "eval.episodes=1",
        "eval.families=[repo]",
        "engine.name=scripted",
    ]
    assert main([*args, "harness.modes.pressure.summariser=engine"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "give --model DIR" in err and "harness.modes.pressure.summariser=extractive" in err


def test_the_adapter_renders_the_chat_template_and_bounds_the_answer(tiny_model_dir: Path) -> None:
    """The prompt reaches the engine as one user message with the generation prompt; at most
    ``max_new_tokens`` come back, decoded without special tokens; a prompt the engine cannot run raises."""
    from ctxrl.env.tokenizer import load_tokenizer_dir

    tokenizer = load_tokenizer_dir(tiny_model_dir)
    builder = PromptBuilder(tokenizer)
    seen: list[list[int]] = []
    inner = ScriptedEngine(lambda ids: "<b>short</b> answer of several words", tokenizer, max_model_len=64)

    class Recorder:
        name, max_model_len = "recorder", 64

        def generate(self, prompts: Any, sampling: SamplingConfig) -> Any:
            seen.extend(list(p) for p in prompts)
            assert sampling.greedy and sampling.max_new_tokens == 5
            return inner.generate(prompts, sampling)

    generate = engine_generate(Recorder(), builder, max_new_tokens=5)  # type: ignore[arg-type]
    text = generate("Summarise: x")
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Summarise: x"}], add_generation_prompt=True, tokenize=False
    )
    assert seen == [builder.encode(rendered)]
    first5 = builder.encode_text("<b>short</b> answer of several words")[:5]
    assert text == tokenizer.decode(first5, skip_special_tokens=True)
    with pytest.raises(EngineError, match="not run"):
        generate("word " * 200)  # more than the engine's 64 tokens
