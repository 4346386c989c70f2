"""Where one SFT step of SmolLM2 spends its time, in float32 and under bfloat16 autocast.

    python scripts/probe_sft_step.py [LENGTH] [LOSS_TOKENS] [--profile] [--casts] [--compile]
    python scripts/probe_sft_step.py 2048 600 --profile
    python scripts/probe_sft_step.py --demos TASKS [MAX_SEQ_LEN] [MODEL] [--profile] [--fp32] [--compile] [--two-part]
    python scripts/probe_sft_step.py --demos TASKS [MAX_SEQ_LEN] [MODEL] [--fp32] --pairs N
    python scripts/probe_sft_step.py --trainers [bf16|fp32] [MODEL] [--ladder]

One LoRA (r = 16) supervised step of SmolLM2-135M-Instruct on a single row of LENGTH random token ids, the
loss on its last LOSS_TOKENS, through the SFT path's own update (:func:`ctxrl.train.update.nll_backward` on
the layout :func:`ctxrl.train.update.make_layout` picks), as ``configs/sft_smollm2.yaml`` runs it: one
sequence a step. Each precision (``train.mixed_precision`` ``no`` and ``bf16``) runs one untimed step, then
two timed ones; it prints seconds a step and tokens a second, and with ``--profile`` torch's profiler table
of one more step (top operators by self CPU time); with ``--casts`` it counts the dtype casts
(``aten::_to_copy``) of one more step and their time, split into weight-shaped ones (a 2-D input of more than
one row: autocast rounding a weight to bf16) and the others (activations, id rows). With ``--compile`` the
decoder layers are compiled first (``sft.compile``, :func:`ctxrl.train.compile.compile_layers`) and the
untimed step's seconds, which hold the compilation, are printed too. Used for the "Sixth run" and "Seventh
run" sections of docs/train_throughput.md.

``--demos TASKS``: one SFT step on real demonstrations instead — the scripted file manager's episodes of
TASKS train-split `short` retention tasks (as ``ctxrl bench smollm2`` records them), their rows cut at
MAX_SEQ_LEN (default 4,096, configs/sft_smollm2_ladder.yaml's) in one step (which it names the layout
``packing: auto`` picks for) — timed under bfloat16 autocast
in three layouts: ``padded`` (rows of alike length batched), ``shared`` (the trie) and
``shared-unlimited`` (the trie with rows batched however much padding they take, ``slack=math.inf``, as
before :data:`ctxrl.train.rows.PAD_SLACK`). Each prints its suffix batches (lines × width), tokens through the
model, seconds of one step after an untimed one, and row tokens a second (the SFT figures' unit). MODEL:
``smollm2-135m-instruct`` (default) or ``tiny``. Used for the "Tenth run" section. With ``--profile`` it then
runs one more step of the ``shared`` layout under torch's profiler and prints its table (top operators by self
CPU time) and the attention kernels' share of the operators' time (SDPA forward and backward; the
"Thirteenth run" section). ``--fp32``: all of it in float32 instead, the precision configs/sft_smollm2*.yaml
set; ``--compile``: the decoder layers compiled first (``sft.compile``; each layout's untimed step compiles
what it needs); ``--two-part``: rows attend to their shared prefixes in two parts
(``train.two_part_attention``); ``--pairs N``: instead of the three layouts, N pairs of the ``shared`` layout's
step with the dense mask and in two parts, alternated (mask first in odd pairs, two-part first in even ones)
after one untimed step of each, so that a drift in the machine's speed falls on both alike; it prints each
pair, the medians and the median ratio — the "Fourteenth run" section.

``--trainers [bf16|fp32]``: the bench's SFT comparison at configs/sft_smollm2.yaml's sizes alone (``ctxrl
bench smollm2``'s ``sft_speedup``: :func:`ctxrl.commands.bench_train._sft_speedup` with the one-sequence setup,
4 steps of each trainer on 2 recorded demonstrations, eager, under bfloat16 autocast or in float32), without
the bench's GRPO step or its preloading: the process runs with the ``LD_PRELOAD`` it is given (printed first),
so one allocator or OpenMP runtime can be compared with another. Prints both trainers' tokens a second and
the two ratios. Used for the "Eleventh run" section. With ``--ladder`` the SFT path also runs at
configs/sft_smollm2_ladder.yaml's sizes against that TRL run (the ``_ladder`` figures, "Thirteenth run").
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from ctxrl.train.compile import compile_layers
from ctxrl.train.config import LoraSettings, TrainConfig
from ctxrl.train.models import get_model
from ctxrl.train.policy import load_policy
from ctxrl.train.rows import LayoutUnit, Row
from ctxrl.train.update import layout_sizes, make_layout, nll_backward, precision_context


def count_casts(step: Callable[[], object]) -> dict[str, tuple[int, float]]:
    """``{"weight" | "activation": (calls, seconds)}`` of the ``aten::_to_copy`` calls one ``step()`` makes."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as run_profiler

    with run_profiler(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    found: dict[str, tuple[int, float]] = {"weight": (0, 0.0), "activation": (0, 0.0)}
    for event in prof.events():
        if event.name == "aten::_to_copy" and event.input_shapes and event.input_shapes[0]:
            shape = event.input_shapes[0]
            kind = "weight" if len(shape) == 2 and shape[0] > 1 else "activation"  # not a [1, T] id row
            calls, seconds = found[kind]
            found[kind] = (calls + 1, seconds + event.cpu_time_total / 1e6)
    return found


def demo_layouts(
    tasks: int,
    max_seq_len: int,
    name: str,
    profile: bool = False,
    precision: str = "bf16",
    compiled: bool = False,
    two_part: bool = False,
    pairs: int = 0,
) -> None:
    """The ``--demos`` mode (module docstring)."""
    import math
    import tempfile
    from pathlib import Path

    from ctxrl.commands.bench_train import scripted_demonstrations
    from ctxrl.env.tokenizer import load_tokenizer_dir
    from ctxrl.train.rows import PAD_SLACK, build_layout, layout_kind
    from ctxrl.train.sft import sft_examples, sft_rows

    with tempfile.TemporaryDirectory(prefix="probe-sft-") as tmp:
        folder = get_model(name, Path(tmp) / "model" if name == "tiny" else None)
        tokenizer = load_tokenizer_dir(folder)
        demos = scripted_demonstrations(folder, tokenizer, range(1, tasks + 1), "short")
        rows = sft_rows(sft_examples(demos, max_seq_len=max_seq_len, successful_only=False)[0])
        row_tokens = sum(len(r) for r in rows)
        n_loss = float(sum(r.num_loss_tokens for r in rows))
        print(
            f"{len(demos)} episodes, {len(rows)} rows of {[len(r) for r in rows]} tokens ({row_tokens} in all)"
        )
        model = load_policy(folder, TrainConfig(lora=LoraSettings(enabled=True, dropout=0.0))).train()
        if compiled:
            compile_layers(model)
        step = partial(nll_backward, model, num_loss_tokens=n_loss, two_part=two_part)
        auto = make_layout(rows, "auto", max_seq_len, 0, layout_sizes(model), packs=True)
        print(
            f"packing: auto picks {layout_kind(auto)}; mixed_precision={precision}"
            + " compiled" * compiled
            + " two-part" * two_part
        )
        if pairs:
            two_part_pairs(model, build_layout(rows, "shared", max_seq_len, 0), n_loss, precision, pairs)
            return
        for label, kind, slack in (
            ("padded", "padded", PAD_SLACK),
            ("shared", "shared", PAD_SLACK),
            ("shared-unlimited", "shared", math.inf),
        ):
            units = build_layout(rows, kind, max_seq_len, 0, slack=slack)
            shapes = [tuple(mb.input_ids.shape) for u in units for mb in u.all_batches()]
            tokens = sum(u.num_tokens for u in units)
            with precision_context(precision, "cpu"):
                step(units)  # warm-up
                start = time.perf_counter()
                step(units)
                seconds = time.perf_counter() - start
            model.zero_grad(set_to_none=True)
            print(
                f"{label} {seconds:.2f} s {tokens} tokens {row_tokens / seconds:.1f} row tokens/s batches {shapes}",
                flush=True,
            )
        if profile:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as run_profiler

            units = build_layout(rows, "shared", max_seq_len, 0)
            with precision_context(precision, "cpu"), run_profiler(activities=[ProfilerActivity.CPU]) as prof:
                step(units)
            ops = prof.key_averages()
            print(ops.table(sort_by="self_cpu_time_total", row_limit=12), flush=True)
            attention = sum(op.self_cpu_time_total for op in ops if "scaled_dot_product" in op.key)
            total = sum(op.self_cpu_time_total for op in ops)
            print(f"attention {attention / total:.1%} of the shared step's operator time", flush=True)


def two_part_pairs(model: Any, units: list[LayoutUnit], n_loss: float, precision: str, pairs: int) -> None:
    """The ``--pairs`` option of ``--demos`` (module docstring)."""
    from ctxrl.commands.bench_train import time_two_part_pairs

    def step(two_part: bool) -> None:
        model.zero_grad(set_to_none=True)
        nll_backward(model, units, num_loss_tokens=n_loss, two_part=two_part)

    with precision_context(precision, "cpu"):
        time_two_part_pairs(step, pairs)


def trainers(precision: str, name: str, ladder: bool = False) -> None:
    """The ``--trainers`` mode (module docstring)."""
    import os
    import tempfile
    from dataclasses import replace
    from pathlib import Path

    from ctxrl.commands.bench_train import SMOL, SMOL_QUICK, _sft_speedup

    sizes = replace(SMOL_QUICK if name == "tiny" else SMOL, precision=precision)
    print(f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')}", flush=True)
    with tempfile.TemporaryDirectory(prefix="probe-sft-") as tmp:
        setups = ("", "_ladder") if ladder else ("",)
        figures = _sft_speedup(sizes, Path(tmp), steps=2 if name == "tiny" else 4, setups=setups)
    for suffix in setups:
        for key in ("sft_tokens_per_s", "sft_trl_tokens_per_s", "sft_speedup", "sft_steady_speedup"):
            print(f"{key}{suffix} {figures[key + suffix]:.3f}", flush=True)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--trainers"]:
        args = [a for a in argv if a != "--ladder"]
        trainers(
            args[1] if len(args) > 1 else "bf16",
            args[2] if len(args) > 2 else "smollm2-135m-instruct",
            ladder="--ladder" in argv,
        )
        return
    if argv[:1] == ["--demos"]:
        rest, pairs = list(argv), 0
        if "--pairs" in rest:  # --pairs N: the option and its number
            at = rest.index("--pairs")
            pairs = int(rest[at + 1])
            del rest[at : at + 2]
        args = [a for a in rest if a not in ("--profile", "--fp32", "--compile", "--two-part")]
        demo_layouts(
            int(args[1]),
            int(args[2]) if len(args) > 2 else 4096,
            args[3] if len(args) > 3 else "smollm2-135m-instruct",
            profile="--profile" in argv,
            precision="no" if "--fp32" in argv else "bf16",
            compiled="--compile" in argv,
            two_part="--two-part" in argv,
            pairs=pairs,
        )
        return
    profile = "--profile" in argv
    casts = "--casts" in argv
    compiled = "--compile" in argv
    args = [a for a in argv if a not in ("--profile", "--casts", "--compile")]
    length = int(args[0]) if args else 2048
    n_loss = int(args[1]) if len(args) > 1 else 600
    model_dir = get_model("smollm2-135m-instruct")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 49_000, (length,), generator=gen).tolist()
    mask = [0] * (length - n_loss) + [1] * n_loss
    row = Row(
        ids, mask, [0.0] * length, [0.0] * length, [0] * length, [(length - n_loss, length)], 0, 0, (0,)
    )
    for mixed in ("no", "bf16"):
        model = load_policy(model_dir, TrainConfig(lora=LoraSettings(enabled=True, dropout=0.0))).train()
        if compiled:
            compile_layers(model)
        units = make_layout([row], "auto", 4096, 0, layout_sizes(model), packs=True)
        with precision_context(mixed, "cpu"):
            start = time.perf_counter()
            nll_backward(model, units, num_loss_tokens=n_loss)  # warm-up (and the compilation)
            if compiled:
                print(f"mixed_precision={mixed} compiled: first step {time.perf_counter() - start:.1f} s")
            start = time.perf_counter()
            for _ in range(2):
                nll_backward(model, units, num_loss_tokens=n_loss)
            step = (time.perf_counter() - start) / 2
            label = f"mixed_precision={mixed}" + (" compiled" if compiled else "")
            print(f"{label}: {step:.2f} s a step, {length / step:.1f} tokens/s", flush=True)
            if profile:
                from torch.profiler import ProfilerActivity
                from torch.profiler import profile as run_profiler

                with run_profiler(activities=[ProfilerActivity.CPU]) as prof:
                    nll_backward(model, units, num_loss_tokens=n_loss)
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), flush=True)
            if casts:
                found = count_casts(partial(nll_backward, model, units, num_loss_tokens=n_loss))
                print(
                    f"casts mixed_precision={mixed}: "
                    + ", ".join(
                        f"{kind} {calls} calls {seconds:.2f} s" for kind, (calls, seconds) in found.items()
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
    else:
        main(sys.argv[1:])
