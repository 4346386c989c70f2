"""Time one update of a real model in each layout, on the scripted file manager's episodes of one task.

    python scripts/probe_layouts.py [MODEL] [GROUP_SIZE] [DIFFICULTY] [LAYOUTS]
    python scripts/probe_layouts.py smollm2-135m-instruct 2 short padded,shared,padded,shared
    python scripts/probe_layouts.py --tokens runs/roll/trajectories.jsonl   # token counts of recorded episodes
    python scripts/probe_layouts.py --flops runs/roll/trajectories.jsonl [MODEL]
    python scripts/probe_layouts.py --profile runs/roll/trajectories.jsonl [MODEL] [LAYOUTS]
    python scripts/probe_layouts.py --pairs N runs/roll/trajectories.jsonl [MODEL] [EPISODES]

``--tokens FILE``: no model, no timing: the rows of the episodes in a trajectories file (``ctxrl rollout``
writes one), and the tokens each layout puts through the model — packed rows, the group's prefix once
(one level), and the trie of nested prefixes (``share_prefixes``' default) — as ratios to packed.

``--flops FILE [MODEL]``: no timing: the FLOPs of one update of the recorded episodes' rows in the shared
layout (rows as ``--profile`` builds them; MODEL's geometry): the forward's matmuls (the body, and the LM head
at loss positions) and its attention, with the suffixes attending through the dense mask and in two parts;
the update as ``rows.update_flops`` counts it (2 × matmuls + 3 × attention) and as the bench counted it
before 2026-12-07 16:00 (2 × the forward with the mask's pairs), and their ratio. The "update's FLOPs" paragraph of
docs/train_throughput.md's "Seventeenth run" quotes it.

``--profile FILE``: one update of the recorded episodes' rows (rewards alternating, as ``ctxrl bench smollm2``
sets them, so every row carries advantages) in each layout, timed after one untimed warm-up pass, under
torch's profiler: seconds, tokens, estimated GFLOP and the ops that took the time.

``--pairs N FILE``: the recorded episodes' update (the first EPISODES of them, default all; rewards as
``--profile`` sets them) in the shared layout, with the rows attending to their prefixes through the dense
mask and in two parts (``train.two_part_attention``), N pairs alternated in one process after one untimed
round (mask first in odd pairs, two-part first in even ones), so that the machine's drift falls on both:
each pair's seconds, the medians, the median ratio two-part / mask and in how many pairs two-part was faster.

LAYOUTS: a comma list of shared, packed, padded (``ctxrl.train.update.backward_layout``, LM head at loss
positions; shared with the two-part attention, ``train.two_part_attention=true``), masked (shared, with the
rows attending to their prefix through the dense mask transformers builds: the default) and legacy (packed lines, LM head and
log-softmax at every position: the update before shared prefixes). LoRA r=16 as configs/train_smollm2.yaml, 4,096-token microbatches, torch's default threads. The first
layout timed also pays the process's warm-up: list one twice to see it. Prints tokens, estimated GFLOP and
seconds per layout; used for docs/train_throughput.md.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from typing import Any

from ctxrl.commands.bench_train import legacy_packed_backward
from ctxrl.env.policies import make_policy
from ctxrl.env.tasks.registry import make_task
from ctxrl.env.tokenizer import load_tokenizer_dir
from ctxrl.rewards.advantages import AdvantageConfig
from ctxrl.train.config import LoraSettings, TrainConfig
from ctxrl.train.credit import CreditConfig, assign_credit
from ctxrl.train.engines import EngineConfig, SamplingConfig, make_engine
from ctxrl.train.engines.scripted import text_policy
from ctxrl.train.models import get_model
from ctxrl.train.policy import load_policy
from ctxrl.train.rollout import RolloutConfig, rollout
from ctxrl.train.rows import build_layout, episode_rows, flop_parts, layout_flops, update_flops
from ctxrl.train.update import backward_layout, layout_sizes


def token_counts(path: str) -> None:
    from ctxrl.train.rows import pack_rows, plain_units, share_prefixes
    from ctxrl.train.trajectory import load_trajectories

    episodes = load_trajectories(path)
    rows = [
        r
        for i, ep in enumerate(episodes)
        for r in episode_rows(ep, [[1.0] * len(s.token_ids) for s in ep.steps], episode_index=i)
    ]
    packed = sum(u.num_tokens for u in plain_units(pack_rows(rows, 4096)))
    one = sum(u.num_tokens for u in share_prefixes(rows, 4096, 0, max_depth=0))
    trie = sum(u.num_tokens for u in share_prefixes(rows, 4096, 0))
    groups = len({ep.group for ep in episodes})
    print(f"{len(episodes)} episodes in {groups} groups, {len(rows)} rows")
    print(
        f"packed {packed} tokens; group prefix once {one} ({one / packed:.3f}); trie {trie} ({trie / packed:.3f})"
    )


def update_rows(episodes: list[Any]) -> list[Any]:
    """The rows an update trains on, with rewards alternating as ``ctxrl bench smollm2`` sets them (so every
    row carries advantages: the probe times the update, not its direction)."""
    episodes = [replace(ep, reward=float(i % 2)) for i, ep in enumerate(episodes)]
    credit = assign_credit(episodes, CreditConfig(advantages=AdvantageConfig(w_eff=0.25)))
    return [
        r
        for i, (ep, c) in enumerate(zip(episodes, credit))
        for r in episode_rows(ep, c.steps, episode_index=i)
    ]


def _layout(kind: str) -> Any:
    """The layout a LAYOUTS name builds (``masked`` is the shared layout, timed with the mask)."""
    return "shared" if kind == "masked" else kind


def _prefix_nodes(units: Any) -> int:
    return sum(bool(u.prefix_len) + _prefix_nodes(u.children) for u in units)


def update_flop_counts(path: str, name: str) -> None:
    """The ``--flops`` mode (module docstring)."""
    from ctxrl.train.trajectory import load_trajectories

    rows = update_rows(load_trajectories(path))
    model = load_policy(get_model(name), TrainConfig(lora=LoraSettings(enabled=True, dropout=0.0)))
    sizes = layout_sizes(model)
    assert sizes is not None
    units = build_layout(rows, "shared", 4096, 0)
    dense, masked = flop_parts(units, sizes, False)
    _, two_part = flop_parts(units, sizes, True)
    before = 2 * layout_flops(units, sizes) / 1e9
    now = update_flops(units, sizes, two_part=True) / 1e9
    tokens = sum(u.num_tokens for u in units)
    body = 2 * sizes.body_params * tokens  # every token laid out, padding included; the rest is the LM head
    print(f"{len(rows)} rows, {tokens} tokens laid out (shared)")
    print(f"forward: matmuls {dense / 1e9:.1f} GFLOP (body {body / 1e9:.1f}, LM head {(dense - body) / 1e9:.1f}), "
          f"attention {masked / 1e9:.1f} with the mask, {two_part / 1e9:.1f} in two parts")  # fmt: skip
    print(f"update: {now:.1f} GFLOP counted as computed (two parts), "
          f"{update_flops(units, sizes) / 1e9:.1f} with the mask; 2 x forward with the mask {before:.1f}; "
          f"ratio {now / before:.3f}")  # fmt: skip


def profile_recorded(path: str, name: str, kinds: list[str]) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ctxrl.train.trajectory import load_trajectories

    episodes = load_trajectories(path)
    rows = update_rows(episodes)
    print(f"{len(episodes)} episodes, {len(rows)} rows, {sum(len(r) for r in rows)} row tokens")
    config = TrainConfig(lora=LoraSettings(enabled=True, dropout=0.0))
    model = load_policy(get_model(name), config).train()
    sizes = layout_sizes(model)
    assert sizes is not None
    for kind in kinds:
        units = build_layout(rows, _layout(kind), 4096, 0)
        n = float(sum(u.num_loss_tokens for u in units))
        two_part = kind != "masked"
        backward_layout(model, units, config.loss, num_loss_tokens=n, two_part=two_part)  # warm-up
        model.zero_grad(set_to_none=True)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            backward_layout(model, units, config.loss, num_loss_tokens=n, two_part=two_part)
            seconds = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        nodes = _prefix_nodes(units)
        passes = sum(len(u.all_batches()) for u in units)
        tokens = sum(u.num_tokens for u in units)
        gflop = layout_flops(units, sizes) / 1e9
        print(
            f"{kind:7s} {seconds:7.1f} s  {tokens} tokens  {gflop:.0f} GFLOP forward  {nodes} prefix nodes  "
            f"{passes} suffix passes  ({torch.get_num_threads()} threads)",
            flush=True,
        )
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18), flush=True)


def paired_two_part(path: str, pairs: int, name: str, episodes: int | None) -> None:
    """The ``--pairs`` mode (module docstring)."""
    from ctxrl.commands.bench_train import time_two_part_pairs
    from ctxrl.train.trajectory import load_trajectories

    rows = update_rows(load_trajectories(path)[:episodes])
    config = TrainConfig(lora=LoraSettings(enabled=True, dropout=0.0))
    model = load_policy(get_model(name), config).train()
    units = build_layout(rows, "shared", 4096, 0)
    n = float(sum(u.num_loss_tokens for u in units))
    print(
        f"{len(rows)} rows, {sum(len(r) for r in rows)} row tokens, {sum(u.num_tokens for u in units)} laid out"
    )

    def update(two_part: bool) -> None:
        model.zero_grad(set_to_none=True)
        backward_layout(model, units, config.loss, num_loss_tokens=n, two_part=two_part)

    time_two_part_pairs(update, pairs)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--tokens"]:
        token_counts(argv[1])
        return
    if argv[:1] == ["--flops"]:
        update_flop_counts(argv[1], argv[2] if len(argv) > 2 else "smollm2-135m-instruct")
        return
    if argv[:1] == ["--pairs"]:
        name = argv[3] if len(argv) > 3 else "smollm2-135m-instruct"
        paired_two_part(argv[2], int(argv[1]), name, int(argv[4]) if len(argv) > 4 else None)
        return
    if argv[:1] == ["--profile"]:
        kinds = (argv[3] if len(argv) > 3 else "shared").split(",")
        profile_recorded(argv[1], argv[2] if len(argv) > 2 else "smollm2-135m-instruct", kinds)
        return
    name = argv[0] if argv else "smollm2-135m-instruct"
    group = int(argv[1]) if len(argv) > 1 else 2
    difficulty = argv[2] if len(argv) > 2 else "short"
    kinds = (argv[3] if len(argv) > 3 else "padded,shared,padded,shared,legacy").split(",")
    folder = get_model(name)
    tokenizer = load_tokenizer_dir(folder)
    policy = text_policy(make_policy("file-manager"), tokenizer)
    engine = make_engine(EngineConfig(name="scripted"), folder, tokenizer=tokenizer, policy=policy)
    task = make_task("retention", 0, difficulty, split="train")
    result = rollout(
        engine,
        tokenizer,
        [task],
        RolloutConfig(group_size=group, mode="file"),
        sampling=SamplingConfig(max_new_tokens=256),
    )
    rows = update_rows(result.episodes)
    print(
        f"{len(rows)} rows of {[len(r) for r in rows]} tokens, {sum(r.num_loss_tokens for r in rows)} loss tokens"
    )
    config = TrainConfig(lora=LoraSettings(enabled=True, dropout=0.0))
    model = load_policy(folder, config).train()
    sizes = layout_sizes(model)
    assert sizes is not None
    for kind in kinds:
        start = time.perf_counter()
        if kind == "legacy":
            legacy_packed_backward(model, rows, config.loss, 4096)
            print(f"legacy  {time.perf_counter() - start:7.1f} s", flush=True)
        else:
            units = build_layout(rows, _layout(kind), 4096, 0)
            n = float(sum(u.num_loss_tokens for u in units))
            backward_layout(model, units, config.loss, num_loss_tokens=n, two_part=kind != "masked")
            tokens = sum(u.num_tokens for u in units)
            gflop = layout_flops(units, sizes) / 1e9
            print(
                f"{kind:7s} {time.perf_counter() - start:7.1f} s  {tokens} tokens  {gflop:.0f} GFLOP forward",
                flush=True,
            )
        model.zero_grad(set_to_none=True)


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
    else:
        main(sys.argv[1:])
