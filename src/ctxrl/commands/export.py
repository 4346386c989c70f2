"""``ctxrl export``: a run's checkpoint as a serving-ready model folder, verified in vLLM.

    ctxrl export --run runs/grpo1 --out exports/grpo1              # latest checkpoint, LoRA merged
    ctxrl export --run runs/grpo1 --step 20 --out exports/grpo1-20
    ctxrl export --run runs/grpo1 --out exports/grpo1-lora --adapter-only
    ctxrl export --adapter docs/results/learning/sft/adapter --out runs/ladder/sft/model   # merge, no check

What the folder holds and how it is checked: :mod:`ctxrl.publish.export`. ``--out`` must be new or empty (there
is no ``--overwrite``: an export is never replaced in place). A missing run, step or base model is a one-line
error before anything loads.
"""

from __future__ import annotations

import argparse


def run_export(args: argparse.Namespace) -> int:
    """Entry point of ``ctxrl export``: write, verify, then print what was checked and how to serve it."""
    from ctxrl.errors import UsageError
    from ctxrl.publish.export import export_run, rollout_command, serve_command

    if args.adapter is not None:
        from ctxrl.publish.export import merge_adapter

        if args.step is not None or args.adapter_only:
            raise UsageError("--step and --adapter-only go with --run, not --adapter")
        merge_adapter(args.adapter, args.out, base=args.base)
        print(
            f"wrote {args.out}: {args.adapter} merged into its base ({args.base or 'as the adapter names it'})"
        )
        return 0
    if args.base is not None:
        raise UsageError("--base goes with --adapter (a run's checkpoints name their own base)")
    if args.step is not None and args.step < 1:
        raise UsageError(f"--step must be >= 1, not {args.step}")
    print(f"exporting {args.run_dir} (step {args.step or 'latest'}) to {args.out} ...", flush=True)
    result = export_run(args.run_dir, args.out, step=args.step, adapter_only=args.adapter_only)
    ckpt, v = result.checkpoint, result.verification
    what = "adapter" if result.adapter_only else "LoRA merged into" if ckpt.adapter else "full model of"
    print(f"wrote {result.out}: step {ckpt.step}, {what} {ckpt.base_model} ({len(result.files)} files)")
    if v is not None:
        print(
            f"verified with {v.engine}: {v.prompts} held-out prompts, {v.generated_tokens} greedy tokens equal "
            f"to the checkpoint's, max |logprob diff| {v.max_logprob_diff:.2e} (tolerance {v.tolerance:.0e})"
        )
    if result.adapter_only:
        print("serve the base model with the adapter (vLLM LoRA serving; not checked by this export):")
        print(
            f"  python -m vllm.entrypoints.openai.api_server --model {ckpt.base_model} --enable-lora "
            f"--lora-modules ctxrl={result.out} --enable-prefix-caching --enable-prompt-tokens-details"
        )
        return 0
    print(f"skill: {result.skill_source}; harness: {result.out / 'harness.yaml'}")
    print("serve it (OpenAI-compatible, prefix caching on):")
    print(f"  {serve_command(result.out)}")
    print("then roll the policy out in its harness against that server:")
    print(f"  {rollout_command(result.out)}")
    return 0
