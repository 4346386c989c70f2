"""The update is exact in every layout: shared prefixes and logits only at loss positions change the cost of
a step, not its loss or gradients (within 1e-5, plus 1e-4 of each gradient's largest value, of one packed
line with full-vocabulary logits)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from ctxrl.errors import ConfigError
from ctxrl.train.compile import compile_layers, decoder_layers, is_compiled
from ctxrl.train.logprobs import token_logprobs
from ctxrl.train.loss import LossConfig, policy_loss
from ctxrl.train.rows import LayoutUnit, Row, build_layout, layout_kind, pack_rows
from ctxrl.train.update import (
    backward_layout,
    layout_logprobs,
    layout_sizes,
    make_layout,
    nll_backward,
    prefix_forward,
)

ATOL = 1e-5
RTOL = 1e-4
"""Gradients also within RTOL of each tensor's largest value: float32 sums in another order (another layout, kernel or
CPU) move them by ~1e-5 of it, a mistake (a lost token, a cross-row key) by 1e-2 and more."""
LOSS = LossConfig(tis_cap=2.0)


def group_rows(
    vocab: int, *, seed: int = 0, groups: int = 2, episodes: int = 3, prefix: int = 40
) -> list[Row]:
    """Rows as GRPO makes them: every row of a group starts with the group's pinned prefix; each has two
    generated spans with an observation between them, advantages and engine logprobs of its own."""
    gen = torch.Generator().manual_seed(seed)

    def rand(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=gen).tolist()

    shared = rand(prefix)
    rows = []
    for g in range(groups):
        pinned = shared + rand(10)  # system prompt for all, then this group's task
        for e in range(episodes):
            head = pinned + rand(5 + 7 * e)
            first, obs, second = rand(6), rand(4), rand(5)
            ids = head + first + obs + second
            n = len(ids)
            s1, s2 = len(head), len(head) + len(first) + len(obs)
            mask, adv, old = [0] * n, [0.0] * n, [0.0] * n
            for a, b in ((s1, s1 + len(first)), (s2, n)):
                for t in range(a, b):
                    mask[t], adv[t], old[t] = 1, 10.0 * (e - 1) + 3.0 * g, -1.0 - 0.01 * t
            rows.append(
                Row(ids, mask, old, adv, [0] * n, [(s1, s1 + 6), (s2, n)], g * episodes + e, g, (0, 1))
            )
    return rows


def reference_backward(model: Any, rows: list[Row]) -> tuple[float, dict[str, torch.Tensor]]:
    """The layout being replaced: one packed line, logits and log-softmax at every position."""
    model.zero_grad(set_to_none=True)
    (mb,) = pack_rows(rows, 1 << 20)
    ids, pos = torch.from_numpy(mb.input_ids), torch.from_numpy(mb.position_ids)
    lp, _ = token_logprobs(model, ids, pos)  # no loss mask: the LM head at every position
    mask = torch.from_numpy(mb.loss_mask).float()
    out = policy_loss(
        lp,
        None,
        torch.from_numpy(mb.old_logprobs).float(),
        torch.from_numpy(mb.advantages).float(),
        mask,
        LOSS,
        num_loss_tokens=float(mask.sum()),
    )
    out.loss.backward()
    return float(out.loss.detach()), grads(model)


def grads(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def layout_backward(model: Any, rows: list[Row], kind: str, max_tokens: int) -> tuple[float, dict[str, Any]]:
    model.zero_grad(set_to_none=True)
    units = build_layout(rows, kind, max_tokens, 0)  # type: ignore[arg-type]
    assert layout_kind(units) == kind
    n = float(sum(r.num_loss_tokens for r in rows))
    result = backward_layout(model, units, LOSS, num_loss_tokens=n)
    assert result.stats.tokens == n
    return result.loss, grads(model)


def assert_same(ours: tuple[float, dict[str, Any]], theirs: tuple[float, dict[str, Any]]) -> None:
    assert abs(ours[0] - theirs[0]) <= ATOL
    assert set(ours[1]) == set(theirs[1]) and ours[1]
    for name, g in ours[1].items():
        worst, largest = float((g - theirs[1][name]).abs().max()), float(theirs[1][name].abs().max())
        assert worst <= ATOL + RTOL * largest, (
            f"{name}: gradients differ by {worst:.2e} (largest {largest:.2e})"
        )
    # not vacuous: the gradients are far larger than the tolerance
    assert max(float(g.abs().max()) for g in ours[1].values()) > 1e-3


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> Any:
    return fresh_model(tiny_model_dir)


def fresh_model(tiny_model_dir: Path) -> Any:
    """The tiny model in float32, in training mode, loaded anew."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).train()


@pytest.mark.parametrize(
    ("kind", "max_tokens"), [("packed", 4096), ("padded", 128), ("shared", 64), ("shared", 4096)]
)
def test_every_layout_gives_the_loss_and_gradients_of_one_packed_line(
    model: Any, kind: str, max_tokens: int
) -> None:
    rows = group_rows(model.config.vocab_size)
    assert_same(layout_backward(model, rows, kind, max_tokens), reference_backward(model, rows))


def test_shared_prefix_with_lora_matches_packed(tiny_model_dir: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    # LoRA on q and v only: the prefix's keys of layer 0 need no gradient, its values do
    policy = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"])
    )
    torch.manual_seed(0)
    for p in policy.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    rows = group_rows(base.config.vocab_size, seed=3)
    shared = layout_backward(policy, rows, "shared", 64)
    assert all("lora" in name for name in shared[1])
    assert_same(shared, layout_backward(policy, rows, "packed", 4096))


def trie_rows(vocab: int, *, seed: int = 7, group: int = 0) -> list[Row]:
    """One group whose rows share more than the pinned prefix: three episodes of two rows each, both rows of an
    episode starting with the same 25 tokens after the prefix (a prompt rebuilt that kept its first turns)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=gen).tolist()

    pinned = rand(40)
    rows = []
    for e in range(3):
        kept = rand(25)
        for k in range(2):
            head = pinned + kept + rand(4 + 3 * k + e)
            ids = head + rand(7)
            n = len(ids)
            mask = [0] * len(head) + [1] * 7
            adv = [0.0] * len(head) + [10.0 * (e - 1) + 2.0 * k] * 7
            old = [0.0] * len(head) + [-1.0] * 7
            rows.append(Row(ids, mask, old, adv, [0] * n, [(len(head), n)], e, group, (k,)))
    return rows


def test_nested_prefixes_give_the_gradients_of_one_packed_line(model: Any) -> None:
    rows = trie_rows(model.config.vocab_size)
    (root,) = build_layout(rows, "shared", 4096, 0)
    # the pinned prefix once, then each episode's 25 kept tokens once, then the rows' own suffixes
    assert root.prefix_len == 40 and [c.prefix_len for c in root.children] == [25, 25, 25]
    assert all(c.offset == 40 and c.all_batches()[0].prefix_len == 65 for c in root.children)
    assert root.num_tokens == 40 + 3 * 25 + sum(mb.num_tokens for mb in root.all_batches())
    assert_same(layout_backward(model, rows, "shared", 4096), reference_backward(model, rows))
    with torch.no_grad():
        (lps,) = layout_logprobs(model, [root], torch.device("cpu"))
    assert len(lps) == len(root.all_batches()) == 3


def test_recomputed_prefixes_hold_no_graph_and_give_the_same_gradients(model: Any) -> None:
    """train.recompute_prefixes: a prefix's forward keeps no graph until its backward reruns it; the loss
    and every gradient stay those of one packed line."""
    rows = trie_rows(model.config.vocab_size)
    (root,) = build_layout(rows, "shared", 4096, 0)
    assert root.children  # nested prefixes: a child's recomputed forward attends to its parent's leaves
    state = prefix_forward(model, root.prefix_ids, torch.device("cpu"), recompute=True)
    assert state.kv == [] and state.redo is not None
    assert all(k.requires_grad and k.grad_fn is None for k, _ in state.leaves)

    model.zero_grad(set_to_none=True)
    n = float(sum(r.num_loss_tokens for r in rows))
    result = backward_layout(model, [root], LOSS, num_loss_tokens=n, recompute_prefixes=True)
    assert_same((result.loss, grads(model)), reference_backward(model, rows))


def rebuilt_rows(vocab: int, *, seed: int = 11, group: int = 0) -> list[Row]:
    """One group shaped like a recorded SmolLM2 file-mode group: three episodes, each with a first row whose
    first call (a loss span) follows the pinned prefix, and two rows of rebuilt prompts that keep that call,
    its 20-token result and 30 more tokens (the second) before a call of their own."""
    gen = torch.Generator().manual_seed(seed)

    def rand(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=gen).tolist()

    pinned = rand(40)
    rows = []

    def add(head: list[int], tail: list[int], e: int, k: int) -> None:
        ids, n = head + tail, len(head) + len(tail)
        mask = [0] * len(head) + [1] * len(tail)
        spans = [(len(head), n)]
        if k == 0:  # the first row's own first call is a loss span right after the pinned prefix
            mask[40:46] = [1] * 6
            spans.insert(0, (40, 46))
        adv = [10.0 * (e - 1) + 2.0 * k if m else 0.0 for m in mask]
        old = [-1.0 if m else 0.0 for m in mask]
        rows.append(Row(ids, mask, old, adv, [0] * n, spans, e, group, (k,)))

    for e in range(3):
        call, result, kept = rand(6), rand(20), rand(30)
        add(pinned + call + result, rand(5), e, 0)
        add(pinned + call + result + kept + rand(3 + e), rand(7), e, 1)
        add(pinned + call + result + kept + rand(5), rand(4), e, 2)
    return rows


def test_rows_that_share_past_another_rows_first_loss_token_get_a_node_of_their_own(model: Any) -> None:
    rows = rebuilt_rows(model.config.vocab_size)
    (root,) = build_layout(rows, "shared", 4096, 0)
    # the pinned prefix stops one token before the first rows' first call; those rows go on from there
    assert root.prefix_len == 39 and sorted(i for mb in root.batches for i in mb.rows) == [0, 3, 6]
    # the rebuilt rows share the pinned prefix's last token, then split by episode: each episode's call,
    # result and kept tokens (56) once for its two rows
    (hub,) = root.children
    assert hub.prefix_len == 1 and not hub.batches
    assert [c.prefix_len for c in hub.children] == [56, 56, 56]
    assert [sorted(i for mb in c.batches for i in mb.rows) for c in hub.children] == [[1, 2], [4, 5], [7, 8]]

    def unpadded(unit: LayoutUnit) -> int:
        return (
            unit.prefix_len
            + sum(sum(mb.row_lengths) for mb in unit.batches)
            + sum(map(unpadded, unit.children))
        )

    # 9 rows through the first 39 tokens once, 6 through the 40th once, 2 per episode through its 56 once
    assert unpadded(root) == sum(len(r) for r in rows) - 8 * 39 - 5 * 1 - 3 * 56
    assert_same(layout_backward(model, rows, "shared", 4096), reference_backward(model, rows))


def test_old_and_reference_logprobs_are_those_of_the_rows_alone(model: Any) -> None:
    rows = group_rows(model.config.vocab_size, seed=5) + trie_rows(model.config.vocab_size, seed=9, group=5)
    units = build_layout(rows, "shared", 64, 0)
    with torch.no_grad():
        for unit, lps in zip(units, layout_logprobs(model, units, torch.device("cpu"))):
            for mb, lp in zip(unit.all_batches(), lps):
                for line, i in enumerate(mb.rows):
                    ids = torch.tensor([rows[i].input_ids])
                    alone, _ = token_logprobs(model, ids, torch.arange(ids.shape[1])[None])
                    mask = torch.tensor(rows[i].loss_mask, dtype=torch.bool)
                    suffix = lp[line, : len(rows[i]) - mb.prefix_len]
                    got = torch.cat([torch.zeros(mb.prefix_len), suffix])
                    assert torch.allclose(got[mask], alone[0][mask], atol=ATOL)
                    assert bool((got[~mask] == 0).all())  # the LM head ran only at loss positions


def test_auto_shares_prefixes_in_one_process_and_not_under_ddp(model: Any) -> None:
    rows = group_rows(model.config.vocab_size)
    sizes = layout_sizes(model)
    assert sizes is not None and sizes.head_params == model.get_output_embeddings().weight.numel()
    assert layout_kind(make_layout(rows, "auto", 4096, 0, sizes)) == "shared"
    assert layout_kind(make_layout(rows, "auto", 4096, 0, sizes, shared_ok=False)) in {"packed", "padded"}


SMOL_DIR = os.environ.get("CTXRL_SMOLLM2_DIR")


@pytest.mark.slow
def test_shared_prefix_is_exact_on_smollm2_rows() -> None:
    """SmolLM2-135M-Instruct (a real model: 30 layers, grouped-query attention, tied head): shared prefix and logits at
    loss positions against one packed line with full logits."""
    from transformers import AutoModelForCausalLM

    from ctxrl.train.models import get_model

    folder = get_model(SMOL_DIR or "smollm2-135m-instruct")  # the registry's cache (a download on first use)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
    rows = group_rows(model.config.vocab_size, groups=1, episodes=3, prefix=200)
    assert_same(layout_backward(model, rows, "shared", 512), reference_backward(model, rows))


@pytest.mark.parametrize("lora", [False, True])
def test_two_part_attention_replaces_the_mask_and_keeps_the_gradients(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, lora: bool
) -> None:
    """train.two_part_attention: every forward after a prefix (the suffix batches and the nested prefixes)
    attends in two parts, and the loss and gradients are those of the masked path and of one packed line."""

    from ctxrl.train import attention

    policy: Any = fresh_model(tiny_model_dir)
    if lora:
        from peft import LoraConfig, get_peft_model

        policy = get_peft_model(policy, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        torch.manual_seed(0)
        for p in policy.parameters():
            if p.requires_grad:
                torch.nn.init.normal_(p, std=0.05)
    assert attention.supports_prefix_attention(policy)
    calls: list[tuple[int, ...]] = []
    real = attention.two_part_attention

    def counted(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kw: Any) -> torch.Tensor:
        calls.append((query.shape[0], query.shape[2], key.shape[2]))
        return real(query, key, value, **kw)

    monkeypatch.setattr(attention, "two_part_attention", counted)
    rows = trie_rows(policy.config.vocab_size, seed=13)
    (root,) = build_layout(rows, "shared", 4096, 0)
    n = float(sum(r.num_loss_tokens for r in rows))

    def run(two_part: bool) -> tuple[float, dict[str, Any]]:
        policy.zero_grad(set_to_none=True)
        result = backward_layout(policy, [root], LOSS, num_loss_tokens=n, two_part=two_part)
        return result.loss, grads(policy)

    masked = run(False)
    assert calls == []
    two_part = run(True)
    layers = policy.config.num_hidden_layers
    # each child prefix once (1 line after the 40 pinned tokens), each suffix batch of 2 lines after 65
    assert len(calls) == layers * 6 and all(c[1] < c[2] for c in calls)
    assert sorted(set(calls)) == sorted({(1, 25, 65)} | {(2, mb.input_ids.shape[1], 65 + mb.input_ids.shape[1])
                                         for c in root.children for mb in c.batches})  # fmt: skip
    assert_same(two_part, masked)
    assert_same(two_part, reference_backward(policy, rows))
    assert policy.config._attn_implementation == "sdpa"  # restored after every forward

    def supervised(two_part: bool) -> tuple[float, dict[str, Any]]:
        policy.zero_grad(set_to_none=True)
        return nll_backward(policy, [root], num_loss_tokens=n, two_part=two_part).loss, grads(policy)

    # the SFT path's update takes the same switch (scripts/probe_sft_step.py --two-part)
    calls.clear()
    supervised_two_part = supervised(True)
    assert len(calls) == layers * 6
    assert_same(supervised_two_part, supervised(False))


@pytest.mark.parametrize("two_part", [False, True])
def test_packing_auto_prices_the_attention_each_trainer_will_run(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, two_part: bool
) -> None:
    """``packing: auto`` prices shared prefixes as the update attends to them: in two parts where
    ``train.two_part_attention`` / ``sft.two_part_attention`` is on and the model runs it
    (:func:`two_part_runs`), with the mask otherwise; the GRPO update and the SFT path both pass it on."""
    from accelerate import Accelerator

    from ctxrl.train import update
    from ctxrl.train.config import LoraSettings, TrainConfig
    from ctxrl.train.policy import load_policy
    from ctxrl.train.sft import SFTConfig, SFTExample, train_sft
    from ctxrl.train.update import grpo_update

    priced: list[bool] = []
    real = update.cheapest_layout

    def spy(*args: Any, two_part: bool = False, **kw: Any) -> Any:
        priced.append(two_part)
        return real(*args, two_part=two_part, **kw)

    monkeypatch.setattr(update, "cheapest_layout", spy)
    config = TrainConfig(lora=LoraSettings(enabled=True, r=4, dropout=0.0), two_part_attention=two_part)
    model = load_policy(tiny_model_dir, config).train()
    assert update.two_part_runs(model, two_part) is two_part  # the tiny model: SDPA on the CPU
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    rows = group_rows(model.config.vocab_size, groups=1, episodes=2, prefix=40)
    grpo_update(
        Accelerator(cpu=True), model, optimizer, rows, config,
        pad_id=0, sizes=layout_sizes(model), packs=True, shared_ok=True,
    )  # fmt: skip
    assert priced == [two_part]
    priced.clear()
    examples = [SFTExample(r.input_ids, r.loss_mask, r.episode, (0,)) for r in rows]
    sft = SFTConfig(max_steps=1, max_seq_len=512, batch_tokens=4096, two_part_attention=two_part)
    train_sft(sft, tiny_model_dir, examples, tmp_path / "sft", progress=False)
    assert priced == [two_part]
    # a model the two-part attention does not run on is priced with the mask whatever the setting
    model.config._attn_implementation = "eager"
    assert not update.two_part_runs(model, True)


def _update_under(model_dir: Path, mixed: str) -> tuple[dict[str, torch.Tensor], set[torch.dtype], Any]:
    """One trainer update (:func:`grpo_update`, LoRA) of :func:`group_rows` with ``train.mixed_precision``
    set to ``mixed``: the gradients it stepped on, the dtypes the attention projections returned, the model."""
    from accelerate import Accelerator

    from ctxrl.train.config import LoraSettings, TrainConfig
    from ctxrl.train.policy import load_policy
    from ctxrl.train.update import grpo_update

    torch.manual_seed(0)
    config = TrainConfig(lora=LoraSettings(enabled=True, r=4, dropout=0.0), mixed_precision=mixed)  # type: ignore[arg-type]
    model = load_policy(model_dir, config).train()
    for name, p in model.named_parameters():  # LoRA's B starts at 0: give the adapter a gradient of its own
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    seen: dict[str, torch.Tensor] = {}

    class Recording(torch.optim.SGD):
        def step(self, closure: Any = None) -> Any:
            seen.update(
                {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            )
            return super().step(closure)

    dtypes: set[torch.dtype] = set()
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: dtypes.add(out.dtype))
        for n, m in model.named_modules()
        if n.endswith("q_proj.base_layer")
    ]
    optimizer = Recording([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    rows = group_rows(model.config.vocab_size)
    grpo_update(
        Accelerator(cpu=True),
        model,
        optimizer,
        rows,
        config,
        pad_id=0,
        sizes=layout_sizes(model),
        packs=True,
        shared_ok=True,
    )
    for hook in hooks:
        hook.remove()
    return seen, dtypes, model


def test_mixed_precision_runs_the_update_in_bf16_and_keeps_float32_weights_and_gradients(
    tiny_model_dir: Path,
) -> None:
    exact, exact_dtypes, _ = _update_under(tiny_model_dir, "no")
    mixed, mixed_dtypes, model = _update_under(tiny_model_dir, "bf16")
    assert exact_dtypes == {torch.float32} and mixed_dtypes == {torch.bfloat16}
    assert set(mixed) == set(exact) and any("lora_A" in n for n in mixed)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the master weights stay float32
    assert all(g.dtype == torch.float32 for g in mixed.values())
    flat_exact = torch.cat([g.flatten() for g in exact.values()])
    flat_mixed = torch.cat([mixed[n].flatten() for n in exact])
    # bfloat16 arithmetic moves the gradient (it ran) by a few percent of its size (it is the same gradient)
    rel = float((flat_mixed - flat_exact).norm() / flat_exact.norm())
    assert 1e-5 < rel < 0.1, rel


def test_mixed_precision_needs_float32_weights() -> None:
    from ctxrl.train.config import TrainConfig
    from ctxrl.train.update import precision_context

    with pytest.raises(ConfigError, match="mixed_precision=bf16 keeps float32 weights"):
        TrainConfig(mixed_precision="bf16", dtype="bfloat16")
    with pytest.raises(ConfigError, match="mixed_precision must be"):
        TrainConfig(mixed_precision="fp16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mixed_precision"):
        precision_context("fp16", "cpu")


# ---- regional compilation (train.compile / sft.compile) ----------------------------------------------------


def _reset_dynamo() -> None:
    """Forget every compiled graph and the count of them (``reset`` keeps the counters)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@pytest.mark.filterwarnings("ignore")  # dynamo's notes on recompilation
def test_compiled_layers_give_eagers_loss_and_gradients_in_every_layout(tiny_model_dir: Path) -> None:
    _reset_dynamo()
    eager, compiled = fresh_model(tiny_model_dir), fresh_model(tiny_model_dir)
    assert compile_layers(compiled) == compiled.config.num_hidden_layers
    assert is_compiled(compiled) and not is_compiled(eager)
    vocab = eager.config.vocab_size
    cases = [(group_rows(vocab), "packed", 4096), (group_rows(vocab), "shared", 64)]
    cases.append((trie_rows(vocab), "shared", 4096))  # nested prefixes: a cache continued by a cache
    for rows, kind, max_tokens in cases:
        ours, theirs = (
            layout_backward(compiled, rows, kind, max_tokens),
            layout_backward(eager, rows, kind, max_tokens),
        )
        assert_same(ours, theirs)
    assert _graphs() > 0  # the compiled model ran graphs, not eager fallbacks
    # parameter names are untouched: checkpoints and the engine's weight sync see the same state dict
    assert list(compiled.state_dict()) == list(eager.state_dict())


def _layers_model(layers: int) -> Any:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    return Qwen3ForCausalLM(config).train()


@pytest.mark.filterwarnings("ignore")
def test_every_layer_shares_its_graphs_with_the_others() -> None:
    """Six layers compile no more graphs than two, in the shared layout too: the prefix cache's update is
    keyed by the layer's index, and without :func:`eager_cache_class` and an unspecialised index each layer
    would compile graphs of its own."""
    counts = []
    for layers in (2, 6):
        _reset_dynamo()
        model = _layers_model(layers)
        compile_layers(model)
        layout_backward(model, trie_rows(256), "shared", 4096)
        counts.append(_graphs())
    assert counts[0] > 0 and counts[1] == counts[0]


def test_a_model_without_decoder_layers_is_refused() -> None:
    with pytest.raises(ConfigError, match="found no decoder layers in Linear"):
        decoder_layers(torch.nn.Linear(2, 2))
