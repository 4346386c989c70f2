#!/usr/bin/env bash
# bash scripts/device_learning_eval.sh [--quick] [--adapters DIR] [--runs "wide wide_s1 wide_s2"] [--step N]
#                                      [--episodes N] [--offset K] [--out DIR] [KEY=VALUE ...]
#
# The learning benchmark's policies evaluated again on a lent accelerator, with another engine and precision:
# the GRPO start (SmolLM2-135M-Instruct + the SFT adapter + the expert-iteration adapter, merged) and the step-STEP
# checkpoints of the GRPO runs named in --runs (each merged into that start), on EPISODES test tasks from seed
# OFFSET of the split, at the level and mode the calibration chose (docs/results/learning/calibration/), sampled
# as configs/eval_smollm2_ladder.yaml says, but on the `hf` engine (transformers `generate`, one batch for all
# episodes) in bf16. Then `ctxrl compare` of the start against the runs pooled: OUT/keep/summary.json, beside
# each policy's eval.json and eval.md and the stage times (OUT/keep/times.tsv).
#
# Adapters come from DIR, laid out as docs/results/learning is (sft/adapter, sft_ei/adapter,
# grpo_RUN/checkpoints/step-STEP/model); default: the adapters/ that the calls carried (scripts/device_lib.sh
# stages them with the wheel's parts), else docs/results/learning.
# --quick: the same path on the CPU with the tiny model, adapters for it in --adapters, 2 episodes of 2 steps at
# most 16 new tokens, float32; the suite runs it (tests/test_device_script.py). KEY=VALUE arguments go to every
# `ctxrl eval`.
set -euo pipefail
cd "$(dirname "$0")/.."

QUICK=0
ADAPTERS=""
RUNS="wide wide_s1 wide_s2"
STEP=20
EPISODES=128
OFFSET=256
OUT_DIR="runs/device_eval"
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --adapters) ADAPTERS="$2"; shift ;;
    --runs) RUNS="$2"; shift ;;
    --step) STEP="$2"; shift ;;
    --episodes) EPISODES="$2"; shift ;;
    --offset) OFFSET="$2"; shift ;;
    --out) OUT_DIR="$2"; shift ;;
    *=*) EXTRA+=("$1") ;;
    *) echo "device_learning_eval: unknown argument $1 (--quick, --adapters DIR, --runs NAMES, --step N, --episodes N, --offset K, --out DIR, KEY=VALUE)" >&2; exit 2 ;;
  esac
  shift
done

PY="${CTXRL_PYTHON:-python3}"
# shellcheck source=scripts/device_lib.sh
source scripts/device_lib.sh
stage_carried
python_env
if [ -z "$ADAPTERS" ]; then
  ADAPTERS="$STAGE/adapters"
  [ -d "$ADAPTERS" ] || ADAPTERS=docs/results/learning
fi
CHECKPOINT="checkpoints/step-$(printf '%06d' "$STEP")/model"
for adapter in sft/adapter sft_ei/adapter $(for run in $RUNS; do echo "grpo_$run/$CHECKPOINT"; done); do
  [ -f "$ADAPTERS/$adapter/adapter_config.json" ] || {
    echo "device_learning_eval: no LoRA adapter in $ADAPTERS/$adapter" >&2
    exit 2
  }
done
read -r LEVEL MODE < <("$PY" -c "import json, sys; c = json.load(open(sys.argv[1]))['chosen']; print(c['level'], c['mode'])" \
  docs/results/learning/calibration/calibration.json)
mapfile -t ISOLATION < <(sandbox_overrides)
KEEP="$OUT_DIR/keep"
WORK="$OUT_DIR/work"
rm -rf "$KEEP" "$WORK"
mkdir -p "$KEEP" "$WORK"

BASE="$(base_model "$QUICK" "$OUT_DIR")"
if [ "$QUICK" = 1 ]; then
  SETTINGS=(eval.episodes=2 rollout.max_steps=2 sampling.max_new_tokens=16 engine.dtype=float32)
else
  SETTINGS=("eval.episodes=$EPISODES" engine.dtype=bfloat16 "engine.batch_size=$EPISODES")
fi
echo "[device] level $LEVEL, $MODE mode; test tasks $((OFFSET + 1))-$((OFFSET + EPISODES)) (eval.offset=$OFFSET)"

timed() {  # timed NAME COMMAND...: run it quietly into WORK/NAME.log, its seconds into KEEP/times.tsv
  local name="$1" t0=$SECONDS
  shift
  "$@" > "$WORK/$name.log" 2>&1 || { echo "$name failed; the end of its log:" >&2; tail -20 "$WORK/$name.log" >&2; exit 1; }
  printf '%s\t%d\n' "$name" $((SECONDS - t0)) | tee -a "$KEEP/times.tsv"
}
evaluate() {  # evaluate NAME MODEL: the eval, its small outputs kept
  timed "eval_$1" "$PY" -m ctxrl.cli eval --config configs/eval_smollm2_ladder.yaml eval.difficulty="$LEVEL" \
    eval.modes=["$MODE"] eval.split=test eval.offset="$OFFSET" engine.name=hf "${SETTINGS[@]}" \
    ${ISOLATION[@]+"${ISOLATION[@]}"} ${EXTRA[@]+"${EXTRA[@]}"} --model "$2" --out "$WORK/$1" --overwrite
  mkdir -p "$KEEP/$1"
  cp "$WORK/$1/eval.json" "$WORK/$1/eval.md" "$KEEP/$1/"
  "$PY" -c "import json, sys; s = json.load(open(sys.argv[1]))['summary']; o = next(iter(s.values()))['overall']; print(f'[device] {sys.argv[2]}: success {o[\"success\"]:.3f}')" \
    "$KEEP/$1/eval.json" "$1"
}
merge() {  # merge NAME ADAPTER BASE: WORK/NAME, the adapter merged into its base
  timed "merge_$1" "$PY" -m ctxrl.cli export --adapter "$ADAPTERS/$2" --base "$3" --out "$WORK/$1.model"
}

merge sft sft/adapter "$BASE"
merge start sft_ei/adapter "$WORK/sft.model"
evaluate start "$WORK/start.model"
POOL=()
for run in $RUNS; do
  merge "$run" "grpo_$run/$CHECKPOINT" "$WORK/start.model"
  evaluate "$run" "$WORK/$run.model"
  POOL+=("$KEEP/$run")
done
timed compare "$PY" -m ctxrl.cli compare "$KEEP/start" "$(IFS=,; echo "${POOL[*]}")" --out "$KEEP/summary.json"
tail -4 "$WORK/compare.log"
echo "[device] done: $KEEP"
