#!/usr/bin/env bash
# bash scripts/learn_smollm2.sh [OUT]   (default runs/learn; CTXRL=.venv/bin/ctxrl when the venv is not active)
#
# The learning benchmark with SmolLM2-135M-Instruct on the retention ladder (docs/results/learning/), one
# resumable stage at a time, each timed into OUT/times.tsv (a stage whose marker OUT/.NAME.done exists is
# skipped, so a rerun continues after a crash, or in the next session from the same OUT):
#   demos       the scripted file manager on 96 `mini` + 80 `small` train tasks (configs/demonstrations.yaml)
#   sft         LoRA warm start on them (configs/sft_smollm2_ladder.yaml; 12 held out)
#   calib       the calibration table (scripts/calibrate_smollm2.sh): scripted, zero-shot and the SFT start
#               at mini / small / short, file and tools mode; `ctxrl calibrate` names the level and mode.
#               No level named: the script stops here, as the issue says.
#   self        the SFT start's own episodes on 64 train tasks at that level and mode (vLLM)
#   sft_ei      expert iteration: SFT from the base again, the successful self episodes added to the demos
#   eval_sft, eval_ei    both starts on the same HELDOUT (64) dev tasks; the better one is the GRPO start
#   grpo_mid, grpo_w0_mid   GRPO (configs/train_smollm2_ladder.yaml) for MID (10) steps, default w_eff and w_eff = 0
#   eval_mid, eval_w0_mid   both arms' step-MID checkpoints on the first 32 of those dev tasks
#   grpo, grpo_w0           both arms resumed to STEPS (20)
#   eval_grpo, eval_w0      both arms on the HELDOUT dev tasks
#   compare     `ctxrl compare` of start, GRPO and the w_eff = 0 arm: OUT/summary.json
# Sizes: HELDOUT, MID, STEPS (environment). Extra arguments go to both GRPO arms (e.g. train.lr=1e-4).
set -euo pipefail
OUT="${1:-runs/learn}"
shift || true
CTXRL="${CTXRL:-ctxrl}"
PY="${PY:-python}"
HELDOUT="${HELDOUT:-64}"
MID="${MID:-10}"
STEPS="${STEPS:-20}"
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
demos() {
  for spec in mini:96 small:80; do
    "$CTXRL" rollout --config configs/demonstrations.yaml --model smollm2-135m-instruct --overwrite \
      --out "$OUT/demos_${spec%%:*}" tasks.families=[retention] tasks.difficulty="${spec%%:*}" tasks.count="${spec##*:}"
  done
}
stage demos demos
DEMOS=("$OUT/demos_mini/trajectories.jsonl" "$OUT/demos_small/trajectories.jsonl")
stage sft "$CTXRL" sft --config configs/sft_smollm2_ladder.yaml --demos "${DEMOS[@]}" --out "$OUT/sft" --overwrite
stage calib env CTXRL="$CTXRL" bash scripts/calibrate_smollm2.sh "$OUT/calib" "$OUT/sft/model"
chosen() { "$PY" -c "import json,sys; c=json.load(open(sys.argv[1]))['chosen']; print(c[sys.argv[2]] if c else '')" "$OUT/calib/calibration.json" "$1"; }
LEVEL="$(chosen level)"
MODE="$(chosen mode)"
if [ -z "$LEVEL" ]; then
  echo "the SFT start is inside [25 %, 75 %] at no level; the table is $OUT/calib/calibration.md" >&2
  exit 2
fi
echo "== training level: $LEVEL, $MODE mode"
AT=(tasks.difficulty="$LEVEL" rollout.mode="$MODE")
EVAL=(--config configs/eval_smollm2_ladder.yaml eval.difficulty="$LEVEL" eval.modes=["$MODE"])
stage self "$CTXRL" rollout --config configs/eval_smollm2_ladder.yaml --model "$OUT/sft/model" --out "$OUT/self" \
  --overwrite tasks.families=[retention] tasks.split=train tasks.count=64 "${AT[@]}" rollout.group_size=1
stage sft_ei "$CTXRL" sft --config configs/sft_smollm2_ladder.yaml --out "$OUT/sft_ei" --overwrite \
  --demos "$OUT/self/trajectories.jsonl" "${DEMOS[@]}"
stage eval_sft "$CTXRL" eval "${EVAL[@]}" eval.episodes="$HELDOUT" --model "$OUT/sft/model" --out "$OUT/eval_sft" --overwrite
stage eval_ei "$CTXRL" eval "${EVAL[@]}" eval.episodes="$HELDOUT" --model "$OUT/sft_ei/model" --out "$OUT/eval_ei" --overwrite
success() { "$PY" -c "import json,sys; s=json.load(open(sys.argv[1]))['summary']; print(next(iter(s.values()))['overall']['success'])" "$1/eval.json"; }
START="sft"
if "$PY" -c "import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)" \
  "$(success "$OUT/eval_ei")" "$(success "$OUT/eval_sft")"; then
  START="sft_ei"
fi
echo "== GRPO start: $OUT/$START/model"
arm() {  # arm NAME STEPS EXTRA...: GRPO into OUT/NAME, resumed when it has begun
  local name="$1" steps="$2"
  shift 2
  local resume=()
  [ -e "$OUT/$name/config.yaml" ] && resume=(--resume)
  "$CTXRL" train --config configs/train_smollm2_ladder.yaml --model "$OUT/$START/model" --out "$OUT/$name" \
    "${resume[@]}" "${AT[@]}" train.steps="$steps" "$@"
}
evaluate() {  # evaluate RUN STEP EPISODES OUT: export the RUN's checkpoint STEP and evaluate it
  rm -rf "$4/export"
  mkdir -p "$4"
  "$CTXRL" export --run "$1" --step "$2" --out "$4/export"
  "$CTXRL" eval "${EVAL[@]}" eval.episodes="$3" --model "$4/export" --out "$4/eval" --overwrite
}
stage grpo_mid arm grpo "$MID" "$@"
stage grpo_w0_mid arm grpo_w0 "$MID" advantages.w_eff=0 "$@"
stage eval_mid evaluate "$OUT/grpo" "$MID" 32 "$OUT/eval_mid"
stage eval_w0_mid evaluate "$OUT/grpo_w0" "$MID" 32 "$OUT/eval_w0_mid"
stage grpo arm grpo "$STEPS" "$@"
stage grpo_w0 arm grpo_w0 "$STEPS" advantages.w_eff=0 "$@"
stage eval_grpo evaluate "$OUT/grpo" "$STEPS" "$HELDOUT" "$OUT/eval_grpo"
stage eval_w0 evaluate "$OUT/grpo_w0" "$STEPS" "$HELDOUT" "$OUT/eval_w0"
stage compare "$CTXRL" compare "$OUT/eval_$([ "$START" = sft ] && echo sft || echo ei)" "$OUT/eval_grpo/eval" \
  "$OUT/eval_w0/eval" --out "$OUT/summary.json"
echo "== done: $OUT/summary.json; stage times (s) in $OUT/times.tsv"
