#!/usr/bin/env bash
# bash scripts/learn_smollm2_short.sh [OUT]   (default runs/learn_smol)
#
# The first learning attempt (2026-11-30, docs/learning_smollm2.md), kept to reproduce it; the benchmark now is
# scripts/learn_smollm2.sh on the retention ladder.
#
# The learning benchmark with SmolLM2-135M-Instruct on a CPU, every stage timed into OUT/times.tsv:
#   1. sft        LoRA warm start on scripted file-mode demonstrations (configs/sft_smollm2.yaml)
#   2. eval_sft   the SFT start on 16 held-out dev tasks (configs/eval_smollm2_short.yaml)
#   3. grpo       stepwise GRPO from the SFT start (configs/train_smollm2.yaml), a new LoRA adapter
#   4. export     the GRPO policy merged into a serving folder, verified in vLLM (ctxrl export)
#   5. eval_grpo  the GRPO policy on the same 16 dev tasks and seeds
# A stage whose output exists is skipped, so a rerun continues after a crash. Extra arguments are passed
# to the grpo stage (e.g. train.steps=8).
set -euo pipefail
OUT="${1:-runs/learn_smol}"
shift || true
CTXRL="${CTXRL:-ctxrl}"
mkdir -p "$OUT"
stage() {  # stage NAME COMMAND...: skipped once OUT/.NAME.done exists
  local name="$1"
  shift
  if [ -e "$OUT/.$name.done" ]; then
    echo "== $name: done before, skipped"
    return
  fi
  echo "== $name: $*"
  local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1 || { echo "$name failed; see $OUT/$name.log" >&2; tail -5 "$OUT/$name.log" >&2; exit 1; }
  printf '%s\t%d\n' "$name" $((SECONDS - t0)) >> "$OUT/times.tsv"
  touch "$OUT/.$name.done"
  tail -3 "$OUT/$name.log"
}
stage sft $CTXRL sft --config configs/sft_smollm2.yaml --out "$OUT/sft" --overwrite
stage eval_sft $CTXRL eval --config configs/eval_smollm2_short.yaml --model "$OUT/sft/model" --out "$OUT/eval_sft" --overwrite
resume=()
[ -e "$OUT/grpo/config.yaml" ] && resume=(--resume)  # a killed GRPO run continues from its last checkpoint
stage grpo $CTXRL train --config configs/train_smollm2.yaml --model "$OUT/sft/model" --out "$OUT/grpo" "${resume[@]}" "$@"
[ -e "$OUT/.export.done" ] || rm -rf "$OUT/export"  # export refuses to overwrite; a half-written one goes
stage export $CTXRL export --run "$OUT/grpo" --out "$OUT/export"
stage eval_grpo $CTXRL eval --config configs/eval_smollm2_short.yaml --model "$OUT/export" --out "$OUT/eval_grpo" --overwrite
echo "== done: stage times (s) in $OUT/times.tsv"
