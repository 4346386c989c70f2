#!/usr/bin/env bash
# bash scripts/calibrate_smollm2.sh [OUT] [SFT_MODEL]      (default OUT: runs/calib)
#
# The calibration table of the retention ladder (docs/results/learning/calibration.md): for each level of
# LEVELS (default "mini small short"), EPISODES (default 32) dev-split tasks for
#   scripted  the reference policies append, file-manager and tools-manager (seconds);
#   zeroshot  SmolLM2-135M-Instruct as it comes, in file and tools mode (configs/eval_smollm2_ladder.yaml),
#             at the levels of ZEROSHOT_LEVELS (default: LEVELS);
#   sft       the SFT start SFT_MODEL (configs/sft_smollm2_ladder.yaml's OUT/model), same config;
# each cell one `ctxrl eval --out OUT/<level>/<group>`, skipped when its eval.json exists (a rerun continues).
# Then `ctxrl calibrate OUT` writes OUT/calibration.{json,md} and names the training level by its rule.
set -euo pipefail
OUT="${1:-runs/calib}"
SFT="${2:-}"
CTXRL="${CTXRL:-ctxrl}"
LEVELS="${LEVELS:-mini small short}"
ZEROSHOT_LEVELS="${ZEROSHOT_LEVELS-$LEVELS}"  # set but empty: no zero-shot cells
EPISODES="${EPISODES:-32}"
mkdir -p "$OUT"
cell() {  # cell LEVEL GROUP EVAL-ARGS...
  local level="$1" group="$2"
  shift 2
  if [ -e "$OUT/$level/$group/eval.json" ]; then
    echo "== $level/$group: done before, skipped"
    return
  fi
  echo "== $level/$group"
  local t0=$SECONDS
  "$CTXRL" eval "$@" eval.difficulty="$level" eval.episodes="$EPISODES" --out "$OUT/$level/$group" --overwrite \
    > "$OUT/$level.$group.log" 2>&1 || { echo "$level/$group failed; see $OUT/$level.$group.log" >&2; exit 1; }
  printf '%s\t%s\t%d\n' "$level" "$group" $((SECONDS - t0)) >> "$OUT/times.tsv"
  grep -E "solved" "$OUT/$level.$group.log" || true
}
for level in $LEVELS; do
  cell "$level" scripted --engine scripted --model smollm2-135m-instruct eval.families=[retention] eval.split=dev \
    'eval.policies=[append,file-manager,tools-manager]'
  case " $ZEROSHOT_LEVELS " in
    *" $level "*) cell "$level" zeroshot --config configs/eval_smollm2_ladder.yaml --model smollm2-135m-instruct ;;
  esac
  if [ -n "$SFT" ]; then
    cell "$level" sft --config configs/eval_smollm2_ladder.yaml --model "$SFT"
  fi
done
"$CTXRL" calibrate "$OUT"
