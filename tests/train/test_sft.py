"""The SFT warm start: loss masks from hand-built records, a short run that learns, ``ctxrl sft`` end to end,
and one-line errors on bad input."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ctxrl.config import load_config
from ctxrl.errors import ConfigError, UsageError
from ctxrl.train.sft import (
    SFTConfig,
    SFTExample,
    load_demonstrations,
    loss_sample,
    sft_examples,
    sft_steps,
    train_sft,
)
from ctxrl.train.trajectory import save_trajectories


@pytest.fixture(autouse=True)
def _one_torch_thread() -> object:
    """One intra-op thread: on a shared 2-core machine two OpenMP threads wait on each other (measured: a
    6-step run took 135 s with two threads, 10 s with one)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_examples_merge_extend_steps_and_mask_only_generated_tokens(records: SimpleNamespace) -> None:
    s = records.step
    ep = records.episode(
        [
            s([1, 2, 3], [10, 11], source="reset"),
            s([1, 2, 3, 10, 11, 4, 5], [12], source="extend"),  # extends step 0: same sequence
            s([1, 2, 6], [13, 14, 15], source="rebuild"),  # an edit broke the prefix: a new sequence
            s([1, 2, 7], [16], source="extend"),  # says extend but does not: a new sequence
        ]
    )
    examples, stats = sft_examples([ep], max_seq_len=100)
    assert [e.input_ids for e in examples] == [
        [1, 2, 3, 10, 11, 4, 5, 12],
        [1, 2, 6, 13, 14, 15],
        [1, 2, 7, 16],
    ]
    assert [e.completion_mask for e in examples] == [
        [0, 0, 0, 1, 1, 0, 0, 1],
        [0, 0, 0, 1, 1, 1],
        [0, 0, 0, 1],
    ]
    assert [e.steps for e in examples] == [(0, 1), (2,), (3,)]
    assert (stats.examples, stats.tokens, stats.loss_tokens, stats.truncated_loss_tokens) == (3, 18, 7, 0)


def test_examples_cap_length_and_skip_failures(records: SimpleNamespace) -> None:
    s = records.step
    ok = records.episode([s([1, 2, 3], [10, 11], source="reset"), s([1, 2, 3, 10, 11, 4], [12, 13])])
    failed = records.episode([s([1, 2], [9], source="reset")], success=False)
    examples, stats = sft_examples([failed, ok], max_seq_len=8)
    # the row [1,2,3,10,11,4,12,13] is 8 tokens: kept whole; at 7 the last generated token is cut
    assert [e.completion_mask for e in examples] == [[0, 0, 0, 1, 1, 0, 1, 1]]
    assert examples[0].episode == 1 and stats.skipped_episodes == 1
    examples, stats = sft_examples([failed, ok], max_seq_len=7)
    assert examples[0].input_ids == [1, 2, 3, 10, 11, 4, 12]
    assert stats.truncated_loss_tokens == 1 and stats.loss_tokens == 3
    # a cap inside the prompt leaves no loss token: the sequence is dropped
    assert sft_examples([ok], max_seq_len=3)[0] == []
    assert len(sft_examples([failed, ok], max_seq_len=8, successful_only=False)[0]) == 2


def test_decision_copies_repeat_the_edit_tokens_up_to_the_last_edit(records: SimpleNamespace) -> None:
    s = records.step
    ep = records.episode(
        [
            s([1, 2, 3], [10, 11], source="reset"),
            s([1, 2, 3, 10, 11, 4], [12, 13, 14], edit=[1, 1, 0]),  # a notes rewrite, then one more token
            s([1, 2, 3, 10, 11, 4, 12, 13, 14, 5], [15]),
            s([1, 6], [16, 17], source="rebuild"),  # a row with no edit: no copy
        ]
    )
    plain, _ = sft_examples([ep], max_seq_len=100)
    examples, stats = sft_examples([ep], max_seq_len=100, decision_copies=2)
    assert examples[0] == plain[0] and examples[3] == plain[1] and not examples[0].decision
    copies = examples[1:3]
    assert all(c.decision for c in copies) and stats.decision_examples == 2 and stats.examples == 4
    # the row up to its last edit token, the loss on the edit tokens only
    assert copies[0].input_ids == [1, 2, 3, 10, 11, 4, 12, 13]
    assert copies[0].completion_mask == [0, 0, 0, 0, 0, 0, 1, 1]
    # a cap that cuts the edit away leaves no copy
    assert sft_examples([ep], max_seq_len=6, decision_copies=2)[1].decision_examples == 0


def test_decision_copies_need_the_ctxrl_trainer(records: SimpleNamespace, tiny_model_dir: Path) -> None:
    s = records.step
    ep = records.episode([s([1, 2, 3], [10, 11], source="reset", edit=[1, 0])])
    examples, _ = sft_examples([ep], max_seq_len=64, decision_copies=1)
    with pytest.raises(ConfigError, match=r"decision_copies needs sft\.trainer: ctxrl"):
        train_sft(
            SFTConfig(trainer="trl", max_seq_len=64, batch_tokens=64), tiny_model_dir, examples, "unused"
        )
    with pytest.raises(ConfigError, match="decision_copies"):
        SFTConfig(decision_copies=-1)


def test_config_checks_name_the_field() -> None:
    with pytest.raises(ConfigError, match="batch_tokens"):
        SFTConfig(max_seq_len=4096, batch_tokens=1024)
    with pytest.raises(ConfigError, match=r"sft\.lr"):
        SFTConfig(lr=0)
    cfg = load_config(SFTConfig, None, ["lora.enabled=true", "lora.r=4", "max_seq_len=512"])
    assert cfg.lora.enabled and cfg.lora.r == 4 and cfg.accumulation == 32


def _copy_task(records: SimpleNamespace, n: int) -> list:
    """Episodes whose answer is a fixed function of the prompt: after [7, a], generate [a + 1, a + 2, 2]."""
    eps = []
    for i in range(n):
        a = 20 + i % 40
        eps.append(records.episode([records.step([7, 5, a], [a + 1, a + 2, 2], source="reset")], group=i))
    return eps


@pytest.mark.parametrize(
    ("lora", "trainer"), [(False, "ctxrl"), (True, "ctxrl"), (False, "trl"), (True, "trl")]
)
def test_short_run_lowers_the_loss_and_saves_a_loadable_model(
    records: SimpleNamespace, tiny_model_dir: Path, tmp_path: Path, lora: bool, trainer: str
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from ctxrl.train.sft import demonstration_loss

    examples, _ = sft_examples(_copy_task(records, 64), max_seq_len=64)
    cfg = SFTConfig(
        lr=1e-2 if lora else 3e-3,
        max_steps=6,
        max_seq_len=64,
        batch_tokens=64 * 4,
        log_every=3,
        trainer=trainer,  # type: ignore[arg-type]
        lora=load_config(SFTConfig, None, ["lora.enabled=true", "lora.r=8"]).lora
        if lora
        else SFTConfig().lora,
    )
    result = train_sft(cfg, tiny_model_dir, examples, tmp_path, progress=False)
    assert result.steps == 6 and result.trainer == trainer
    # the first step and the rate after it, from each trainer's own clock (TRL's through a callback)
    assert 0 < result.first_step_s < result.wall_s and result.steady_tokens_per_s > 0
    # TRL packs (the tiny Qwen3 honours position-id packing); ctxrl prices the layouts and pads these 6-token rows
    # of alike length, which share no prefix (a packed line would compute attention across its rows)
    assert result.packed if trainer == "trl" else result.layout == "padded"
    assert result.loss_after < result.loss_before - 0.5, (result.loss_before, result.loss_after)
    model = AutoModelForCausalLM.from_pretrained(result.model_dir)  # a plain folder: no adapter left
    assert not any("lora" in name for name, _ in model.named_parameters())
    assert (result.model_dir / "tokenizer.json").is_file()
    # the saved weights give the loss the run reported (the merge changed nothing)
    measured = loss_sample(examples)  # 48 of the 64 sequences
    assert demonstration_loss(model, measured) == pytest.approx(result.loss_after, abs=1e-4)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert demonstration_loss(base, measured) == pytest.approx(result.loss_before, abs=1e-4)
    assert torch.isfinite(torch.tensor(result.loss_after))


def test_steady_rate_leaves_out_the_first_step() -> None:
    from ctxrl.train.sft import _steady_rate

    # 10 s for the first 100 tokens (a compilation, say), then 300 tokens in 3 s
    assert _steady_rate((10.0, 100), 13.0, 400) == pytest.approx(100.0)
    assert _steady_rate((13.0, 400), 13.0, 400) == pytest.approx(400 / 13)  # one step: the run's own rate
    assert _steady_rate(None, 0.0, 0) == 0.0


def test_compiled_sft_trains_as_eager_does(
    records: SimpleNamespace, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """sft.compile reaches the model (its decoder layers run compiled) and changes no result; TRL's trainer
    is refused it by name."""
    from ctxrl.train.compile import is_compiled

    examples, _ = sft_examples(_copy_task(records, 16), max_seq_len=64)
    runs = {}
    for compiled in (False, True):
        cfg = SFTConfig(
            lr=3e-3, max_steps=3, max_seq_len=64, batch_tokens=256, trainer="ctxrl", compile=compiled
        )
        runs[compiled] = train_sft(cfg, tiny_model_dir, examples, tmp_path / str(compiled), progress=False)
    assert is_compiled(runs[True].trained) and not is_compiled(runs[False].trained)
    assert runs[True].loss_after == pytest.approx(runs[False].loss_after, rel=1e-5, abs=1e-5)
    assert runs[True].loss_after < runs[True].loss_before
    with pytest.raises(ConfigError, match=r"sft\.compile compiles the ctxrl trainer"):
        SFTConfig(trainer="trl", compile=True)


def test_two_part_attention_reaches_the_sft_update_and_changes_no_result(
    records: SimpleNamespace, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sft.two_part_attention: the shared layout's rows attend to their prefix in two parts (counted), with
    the masked run's losses; TRL's trainer is refused it by name."""
    from ctxrl.train import attention

    calls: list[int] = []
    real = attention.two_part_attention

    def counted(query: Any, key: Any, value: Any, **kw: Any) -> Any:
        calls.append(query.shape[2])
        return real(query, key, value, **kw)

    monkeypatch.setattr(attention, "two_part_attention", counted)
    # the copy task behind a 24-token prompt every example shares, as a step's rows share the system prompt
    episodes = [
        records.episode([records.step([7, *range(30, 53), a], [a + 1, a + 2, 2], source="reset")], group=a)
        for a in range(60, 76)
    ]
    examples, _ = sft_examples(episodes, max_seq_len=64)
    runs = {}
    for two_part in (False, True):
        cfg = SFTConfig(
            lr=3e-3,
            max_steps=3,
            max_seq_len=64,
            batch_tokens=256,
            packing="shared",
            two_part_attention=two_part,
        )
        runs[two_part] = train_sft(cfg, tiny_model_dir, examples, tmp_path / str(two_part), progress=False)
        assert bool(calls) == two_part
    assert runs[True].loss_after == pytest.approx(runs[False].loss_after, rel=1e-5, abs=1e-5)
    assert runs[True].loss_after < runs[True].loss_before
    with pytest.raises(ConfigError, match=r"sft\.two_part_attention changes the ctxrl trainer"):
        SFTConfig(trainer="trl", two_part_attention=True)


def test_gradient_checkpointing_reaches_trl_off_by_default_and_changes_no_result(
    records: SimpleNamespace, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trl

    seen: list[bool] = []
    real = trl.SFTConfig

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["gradient_checkpointing"])
        return real(*args, **kwargs)

    monkeypatch.setattr(trl, "SFTConfig", spy)
    examples, _ = sft_examples(_copy_task(records, 16), max_seq_len=64)
    losses = []
    for on in (False, True):
        cfg = SFTConfig(
            lr=3e-3, max_steps=2, max_seq_len=64, batch_tokens=256, gradient_checkpointing=on, trainer="trl"
        )
        losses.append(train_sft(cfg, tiny_model_dir, examples, tmp_path / str(on), progress=False).loss_after)
    assert seen == [False, True] and SFTConfig().gradient_checkpointing is False  # TRL's own default is True
    assert losses[0] == pytest.approx(losses[1], abs=1e-4)  # recomputing activations is exact


@pytest.mark.parametrize("trainer", ["ctxrl", "trl"])
def test_mixed_precision_trains_float32_weights_under_bf16_autocast(
    records: SimpleNamespace,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    trainer: str,
) -> None:
    """``sft.mixed_precision: bf16``: both trainers run their matmuls in bfloat16 on float32 weights (TRL
    with ``bf16=True``), and the run still learns."""
    import torch

    seen: set[torch.dtype] = set()
    real = torch.nn.Linear.forward

    def spy(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        out = real(self, x)
        if self.training and torch.is_grad_enabled():
            seen.add(out.dtype)
            assert self.weight.dtype == torch.float32
        return out

    monkeypatch.setattr(torch.nn.Linear, "forward", spy)
    examples, _ = sft_examples(_copy_task(records, 64), max_seq_len=64)
    cfg = SFTConfig(
        lr=3e-3,
        max_steps=6,
        max_seq_len=64,
        batch_tokens=256,
        trainer=trainer,
        mixed_precision="bf16",  # type: ignore[arg-type]
    )
    result = train_sft(cfg, tiny_model_dir, examples, tmp_path, progress=False)
    assert seen == {torch.bfloat16}
    assert result.loss_after < result.loss_before - 0.5, (result.loss_before, result.loss_after)
    with pytest.raises(ConfigError, match=r"sft\.mixed_precision=bf16 keeps float32 weights"):
        SFTConfig(mixed_precision="bf16", dtype="bfloat16")


def test_bad_demonstration_files_are_one_line_errors(records: SimpleNamespace, tmp_path: Path) -> None:
    good = save_trajectories(_copy_task(records, 2), tmp_path / "good.jsonl")
    assert len(load_demonstrations(good)) == 2
    lines = good.read_text().splitlines()

    def bad(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    broken = json.loads(lines[1])
    broken["steps"][0]["token_ids"] = ["x"]
    cases = {
        bad("notjson.jsonl", lines[0] + "\n{oops\n"): r"notjson.jsonl:2: not JSON",
        bad("list.jsonl", "[1, 2]\n"): r"list.jsonl:1: not an episode record",
        bad("missing.jsonl", json.dumps({"task_id": "t"}) + "\n"): r"missing.jsonl:1: .*lacks",
        bad("ids.jsonl", lines[0] + "\n" + json.dumps(broken) + "\n"): r"ids.jsonl:2: .*token_ids",
        bad("empty.jsonl", "\n"): r"empty.jsonl holds no episodes",
        tmp_path / "absent.jsonl": r"absent.jsonl does not exist",
    }
    for path, pattern in cases.items():
        with pytest.raises(UsageError, match=pattern):
            load_demonstrations(path)


def _main(*argv: str) -> int:
    from ctxrl.cli import main

    return main(list(argv))


def test_ctxrl_sft_end_to_end_records_then_trains(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import AutoModelForCausalLM

    config = Path(__file__).parents[2] / "configs" / "sft_tiny.yaml"
    out = tmp_path / "sft"
    # easy retention prompts run to ~2.5k tokens: 4,096 keeps whole rows
    overrides = ["tasks.count=2", "sft.max_steps=2", "sft.max_seq_len=4096", "sft.batch_tokens=4096"]
    assert _main("sft", "--config", str(config), "--out", str(out), *overrides) == 0
    summary = json.loads((out / "summary.json").read_text())
    demos = load_demonstrations(out / "demos" / "trajectories.jsonl")
    assert len(demos) == 2 and all(d.engine == "scripted" and d.mode == "file" for d in demos)
    assert summary["episodes"] == 2 and summary["steps"] == 2
    assert 0 < summary["trained_tokens"] <= 2 * 4096  # two steps of one packed sequence of <= 4,096 tokens
    generated = sum(len(s.token_ids) for d in demos for s in d.steps)
    assert summary["loss_tokens"] + summary["truncated_loss_tokens"] == generated
    assert summary["loss_after"] < summary["loss_before"]
    assert AutoModelForCausalLM.from_pretrained(out / "model").config.vocab_size > 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) >= 1
    assert not (out / "trainer").exists()
    printed = capsys.readouterr().out
    assert "demo loss" in printed
    # the summary's rate after the first step, as summary.json has it
    assert 0 < summary["first_step_s"] < summary["wall_s"]
    assert f"then {summary['steady_tokens_per_s']:.0f} tokens/s" in printed

    # the recorded file trains again through --demos, into another folder
    again = tmp_path / "again"
    code = _main(
        "sft", "--config", str(config), "--demos", str(out / "demos" / "trajectories.jsonl"),
        "--out", str(again), "--model", str(out / "model"), *overrides,
    )  # fmt: skip
    assert code == 0
    assert json.loads((again / "summary.json").read_text())["base_model"] == str(out / "model")


def test_ctxrl_sft_holds_out_the_last_demonstrations_and_takes_several_files(
    records: SimpleNamespace, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Two demonstration files train together; the last ``heldout_episodes`` are never trained on and their
    loss before and after is in the summary."""
    eps = _copy_task(records, 24)
    save_trajectories(eps[:12], tmp_path / "a.jsonl")
    save_trajectories(eps[12:], tmp_path / "b.jsonl")
    out = tmp_path / "sft"
    args = ["sft", "--demos", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--out", str(out)]
    sets = [
        "sft.lr=3e-3",
        "sft.max_steps=6",
        "sft.max_seq_len=64",
        "sft.batch_tokens=256",
        "sft.heldout_episodes=4",
    ]
    assert _main(*args, "--model", str(tiny_model_dir), *sets) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 20 and summary["heldout_episodes"] == 4
    assert summary["demos"] == [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    # the copy rule generalises to the held-out prompts, so their loss falls too, measured on them alone
    assert summary["heldout_loss_after"] < summary["heldout_loss_before"]
    from transformers import AutoModelForCausalLM

    from ctxrl.train.sft import demonstration_loss

    heldout, _ = sft_examples(eps[-4:], max_seq_len=64)
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    assert demonstration_loss(model, heldout) == pytest.approx(summary["heldout_loss_after"], abs=1e-4)

    assert (
        _main(*args, "--overwrite", "--model", str(tiny_model_dir), *sets[:-1], "sft.heldout_episodes=24")
        == 1
    )


def test_ctxrl_sft_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n")
    assert _main("sft", "--demos", str(bad), "--out", str(tmp_path / "o1")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.jsonl:1" in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "o1").exists()  # refused before the run folder was made

    assert _main("sft", "engine.name=hf", "--out", str(tmp_path / "o2")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--demos" in err[0] and "engine.name=scripted" in err[0]

    assert _main("sft", "sft.max_seq_len=4096", "sft.batch_tokens=1", "--out", str(tmp_path / "o3")) == 1
    assert "batch_tokens" in capsys.readouterr().err


def test_ctxrl_sft_update_is_the_plain_cross_entropy(records: SimpleNamespace, tiny_model_dir: Path) -> None:
    """The SFT update (shared prefixes, LM head at loss tokens) gives the loss and gradients of transformers'
    own token-mean cross-entropy (``labels``, -100 off the completion), row by row."""
    import torch
    from transformers import AutoModelForCausalLM

    from ctxrl.train.rows import Row
    from ctxrl.train.update import make_layout, nll_backward

    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, 200, (30,), generator=gen).tolist()
    rows = []
    for e in range(4):  # two episodes of two rows each, every row after the same 30-token prefix
        body = torch.randint(3, 200, (8 + 3 * e,), generator=gen).tolist()
        n = 30 + len(body)
        mask = [0] * 33 + [1] * (n - 33)
        rows.append(Row(prefix + body, mask, [0.0] * n, [0.0] * n, [0] * n, [], e // 2, e // 2, (0,)))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).train()
    n_loss = float(sum(r.num_loss_tokens for r in rows))
    units = make_layout(rows, "shared", 4096, 0, None)
    assert all(u.prefix_len > 0 for u in units)
    result = nll_backward(model, units, num_loss_tokens=n_loss)
    ours = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    total = 0.0
    for r in rows:
        ids = torch.tensor([r.input_ids])
        labels = torch.tensor([[t if m else -100 for t, m in zip(r.input_ids, r.loss_mask)]])
        loss = model(input_ids=ids, labels=labels).loss * (r.num_loss_tokens / n_loss)
        loss.backward()
        total += float(loss)
    assert result.loss == pytest.approx(total, rel=1e-5, abs=1e-5)
    assert result.stats.loss_sum / n_loss == pytest.approx(total, rel=1e-5, abs=1e-5)
    for k, p in model.named_parameters():
        assert torch.allclose(ours[k], p.grad, atol=1e-5), k
    assert max(float(g.abs().max()) for g in ours.values()) > 1e-3


def test_one_row_episodes_share_the_system_prompt_across_episodes(
    records: SimpleNamespace, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Rows of different episodes that begin alike (the system prompt every demonstration starts with) share
    it: one-row episodes alone would have nothing to share, so this is the step-wide trie."""
    system = list(range(30, 130))  # a 100-token common prefix
    eps = [
        records.episode([records.step([*system, 7, a], [a + 1, a + 2, 2], source="reset")], group=i)
        for i, a in enumerate(range(20, 28))
    ]
    examples, _ = sft_examples(eps, max_seq_len=256)
    cfg = SFTConfig(lr=1e-3, max_steps=2, max_seq_len=256, batch_tokens=1024, packing="shared")
    result = train_sft(cfg, tiny_model_dir, examples, tmp_path, progress=False)
    assert result.layout == "shared"


def test_sft_steps_cover_every_example_once_per_epoch() -> None:
    ex = [SFTExample([1] * n, [0] * (n - 1) + [1], i, (0,)) for i, n in enumerate([30, 20, 50, 10, 40, 25])]
    steps = sft_steps(ex, SFTConfig(max_seq_len=64, batch_tokens=64, epochs=2))
    assert sorted(i for s in steps for i in s) == sorted(list(range(6)) * 2)
    assert all(sum(len(ex[i].input_ids) for i in s) <= 64 for s in steps)
    assert len(sft_steps(ex, SFTConfig(max_seq_len=64, batch_tokens=64, max_steps=7))) == 7


def test_episode_steps_keep_each_episodes_examples_together_in_order() -> None:
    # three episodes of 3, 2 and 4 examples (20 tokens each); steps of at most 60 tokens
    ex = [SFTExample([1] * 20, [0] * 19 + [1], e, (k,)) for e, n in enumerate([3, 2, 4]) for k in range(n)]
    cfg = SFTConfig(max_seq_len=20, batch_tokens=60, epochs=2, steps_by="episode")
    steps = sft_steps(ex, cfg)
    assert sorted(i for s in steps for i in s) == sorted(list(range(9)) * 2)
    assert all(sum(len(ex[i].input_ids) for i in s) <= 60 for s in steps)
    for half in (steps[: len(steps) // 2], steps[len(steps) // 2 :]):
        order = [i for s in half for i in s]
        runs = [ex[i].episode for i in order]
        # each episode is one contiguous run, its examples in their recorded order
        assert len(runs) == 9 and sum(a != b for a, b in itertools.pairwise(runs)) == 2
        assert all(order[k] < order[k + 1] for k in range(8) if runs[k] == runs[k + 1])
    assert all(len({ex[i].episode for i in s}) <= 2 for s in steps)
    # the per-example default mixes episodes within a step for the same data
    mixed = sft_steps(ex, SFTConfig(max_seq_len=20, batch_tokens=60, epochs=2))
    assert any(len({ex[i].episode for i in s}) > 1 for s in mixed)


def test_row_steps_keep_each_rows_decision_copies_right_after_it() -> None:
    # two episodes of three 20-token rows; rows 0 and 1 of each edited the context: two 15-token copies each
    ex = []
    for e in range(2):
        for k in range(3):
            ex.append(SFTExample([1] * 20, [0] * 19 + [1], e, (k,)))
            if k < 2:
                ex += [SFTExample([1] * 15, [0] * 14 + [1], e, (k,), decision=True)] * 2
    cfg = SFTConfig(max_seq_len=20, batch_tokens=60, epochs=2, steps_by="row", decision_copies=2)
    steps = sft_steps(ex, cfg)
    assert sorted(i for s in steps for i in s) == sorted(list(range(len(ex))) * 2)
    assert all(sum(len(ex[i].input_ids) for i in s) <= 60 for s in steps)
    for half in (steps[: len(steps) // 2], steps[len(steps) // 2 :]):
        order = [i for s in half for i in s]
        rows = [i for i in order if not ex[i].decision]
        assert len(rows) == 6 and rows != sorted(rows)  # the rows are shuffled, across episodes
        for p, i in enumerate(order):  # each copy comes right after its row or the row's other copy
            if ex[i].decision:
                assert p > 0
                before = ex[order[p - 1]]
                assert (before.episode, before.steps) == (ex[i].episode, ex[i].steps)
        # and in its row's step: a row and its copies (50 tokens) go whole into a step when they fit in one
        for s in half:
            for i in s:
                if ex[i].decision:
                    assert any(
                        not ex[j].decision and (ex[j].episode, ex[j].steps) == (ex[i].episode, ex[i].steps)
                        for j in s
                    )
    with pytest.raises(ConfigError, match=r"steps_by: row needs sft\.trainer: ctxrl"):
        SFTConfig(steps_by="row", trainer="trl")


def test_lora_sft_saves_a_bf16_adapter_that_merges_into_the_saved_model_exactly(
    records: SimpleNamespace, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``<out>/adapter`` is the stage output a later session commits and merges again (``ctxrl export
    --adapter``): bf16 weights, the base as it was given, and a merge equal to ``<out>/model`` bit for bit."""
    import torch
    from safetensors.torch import load_file

    save_trajectories(_copy_task(records, 12), tmp_path / "a.jsonl")
    out = tmp_path / "sft"
    sets = ["sft.lr=1e-2", "sft.max_steps=3", "sft.max_seq_len=64", "sft.batch_tokens=256"]
    lora = ["sft.lora.enabled=true", "sft.lora.r=4"]
    args = ["sft", "--demos", str(tmp_path / "a.jsonl"), "--out", str(out), "--model", str(tiny_model_dir)]
    assert _main(*args, *sets, *lora) == 0
    adapter = out / "adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tiny_model_dir) and config["r"] == 4
    assert sorted(p.name for p in adapter.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    assert weights and all(t.dtype == torch.bfloat16 for t in weights.values())
    assert any(t.abs().max() > 0 for name, t in weights.items() if "lora_B" in name)  # it trained

    merged = tmp_path / "merged"
    assert _main("export", "--adapter", str(adapter), "--out", str(merged)) == 0
    saved, again = (
        load_file(str(out / "model" / "model.safetensors")),
        load_file(str(merged / "model.safetensors")),
    )
    assert saved.keys() == again.keys()
    assert all(torch.equal(saved[k], again[k]) for k in saved)
    assert (merged / "tokenizer.json").is_file()

    capsys.readouterr()
    assert _main("export", "--adapter", str(out / "model"), "--out", str(tmp_path / "m2")) == 1
    assert _main("export", "--adapter", str(adapter), "--out", str(merged)) == 1  # not empty
    assert _main("export", "--run", str(out), "--base", "x", "--out", str(tmp_path / "m3")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "adapter_config.json is missing" in err[0] and "not empty" in err[1]
    assert "--base goes with --adapter" in err[2] and not any("Traceback" in e for e in err)
    # without LoRA there is no adapter to keep
    assert _main(*args, "--overwrite", *sets) == 0
    assert not (out / "adapter").exists()
