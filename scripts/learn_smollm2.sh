#!/usr/bin/env bash
# bash scripts/learn_smollm2.sh [OUT] [KEY=VALUE ...]   (default OUT runs/learn; CTXRL=.venv/bin/ctxrl PY=.venv/bin/python
#                                                       when the venv is not active)
#
# The learning benchmark with SmolLM2-135M-Instruct on the retention ladder (docs/results/learning/), one
# resumable stage at a time, each timed into KEEP/times.tsv:
#   demos       the scripted file manager on 96 `mini` + 80 `small` train tasks (configs/demonstrations.yaml)
#   sft         LoRA warm start on them (configs/sft_smollm2_ladder.yaml; 12 held out)
#   calib       the calibration table (scripts/calibrate_smollm2.sh): scripted, zero-shot and the SFT start
#               at mini / small / short, file and tools mode; `ctxrl calibrate` names the level and mode.
#               No level named: the script stops here, as the issue says.
#   ei          expert iteration: the SFT start's own episodes on 64 train tasks at that level and mode (vLLM),
#               the successful ones train a new adapter on top of it (configs/sft_smollm2_ei.yaml)
#   eval_sft, eval_ei    both starts on the same HELDOUT (64) dev tasks; the better one is the GRPO start
#   grpo_mid, grpo_w0_mid   GRPO (configs/train_smollm2_ladder.yaml) for MID (10) steps, default w_eff and w_eff = 0
#   eval_mid, eval_w0_mid   both arms' step-MID checkpoints on the first 32 of those dev tasks
#   grpo, grpo_w0           both arms resumed to STEPS (20)
#   eval_grpo, eval_w0      both arms on the HELDOUT dev tasks
#   compare     `ctxrl compare` of start, GRPO and the w_eff = 0 arm: KEEP/summary_first.json
#   grpo_act_mid, eval_act_mid, grpo_act, eval_act, compare_act   a third arm, the same as the default one but
#               with the efficiency advantage on every action token (advantages.efficiency_tokens=actions, an
#               ablation of where the channel acts): KEEP/summary_actions.json against the start and w_eff = 0
#   test_start, test_grpo, test_w0, test_act, compare_test, compare_test_act   the final table: the start and
#               the three arms' last checkpoints on HELDOUT tasks of the untouched test split
#               (KEEP/summary_test.json, KEEP/summary_test_actions.json)
#   grpo_rank_mid, eval_rank_mid, grpo_rank, test_rank, compare_test_rank, eval_rank, compare_rank   a fourth
#               arm, the third one with the efficiency advantage as a cost rank among the group's successes
#               (advantages.efficiency=rank: cheapest +1, dearest -1) instead of the relative cost difference:
#               KEEP/summary_rank.json and KEEP/summary_test_rank.json against the start and the third arm,
#               on the dev and the test tasks
#   grpo_lr_mid, eval_lr_mid, grpo_lr, test_lr, compare_test_lr, eval_lr, compare_lr   a fifth arm, the third one
#               at four times its learning rate (train.lr=2e-4): KEEP/summary_lr.json and KEEP/summary_test_lr.json
#               against the start and the third arm, on the dev and the test tasks
#   grpo_lr_w0_mid, eval_lr_w0_mid, grpo_lr_w0, test_lr_w0, compare_test_lr_w0, eval_lr_w0, compare_lr_w0   the
#               fifth arm's ablation: the same at w_eff = 0 (KEEP/summary_lr_w0.json, KEEP/summary_test_lr_w0.json:
#               the start, the fifth arm and this one)
#   grpo_lrd_mid, eval_lrd_mid, grpo_lrd, test_lrd, compare_test_lrd, eval_lrd (compare_lrd below)   a sixth arm, the
#               fifth one with its rate decaying linearly to 1e-5 over the STEPS rounds (train.lr_schedule=linear):
#               KEEP/summary_test_lrd.json and KEEP/summary_lrd.json against the start and the fifth arm. It runs
#               between the twin's step 10 and the twin's later stages, which go on in the order eval_lr_w0_mid,
#               grpo_lr_w0, test_lr_w0, compare_test_lr_w0, eval_lr, compare_lr, compare_lrd (it needs eval_lr),
#               eval_lr_w0, compare_lr_w0 (a kept run holds its latest checkpoint only, so a step-MID evaluation
#               comes before the resume past it)
#   grpo_lrd_w0_mid, eval_lrd_w0_mid, grpo_lrd_w0, test_lrd_w0, compare_test_lrd_w0, eval_lrd_w0, compare_lrd_w0
#               the sixth arm's ablation: the same at w_eff = 0 (KEEP/summary_test_lrd_w0.json,
#               KEEP/summary_lrd_w0.json: the start, the sixth arm and this one)
#   grpo_wide_mid, eval_wide_mid, grpo_wide, test_wide, compare_test_wide, eval_wide, compare_wide   a seventh arm,
#               the sixth one with 4 tasks a step instead of 2 (32 episodes) and trained in bf16 (autocast over
#               float32 weights, a bf16 vLLM engine for its rollouts; evaluations stay in float32 as for every
#               arm): KEEP/summary_test_wide.json and KEEP/summary_wide.json against the start and the sixth arm
#   grpo_wide_w0_mid, eval_wide_w0_mid, grpo_wide_w0, test_wide_w0, compare_test_wide_w0, eval_wide_w0,
#               compare_wide_w0   its ablation at w_eff = 0 (KEEP/summary_test_wide_w0.json, KEEP/summary_wide_w0.json)
#   final_start, final_wide, final_wide_w0, compare_final   the start, the seventh arm and its twin evaluated afresh
#               on the first FINAL (128) test tasks (KEEP/summary_final_wide.json; KEEP/summary.json until 2026-12-05)
#   grpo_wide_s1_mid, eval_wide_s1_mid, grpo_wide_s1, final_wide_s1, compare_final_wide_s1, eval_wide_s1,
#               compare_wide_s1   a replicate of the seventh arm with other seeds (engine.seed=1 train.seed=1):
#               KEEP/summary_final_wide_s1.json (FINAL test tasks) and KEEP/summary_wide_s1.json (dev) against
#               the start and the seventh arm
#   grpo_wide_s2_mid, eval_wide_s2_mid, grpo_wide_s2, final_wide_s2, compare_final_wide_s2, eval_wide_s2,
#               compare_wide_s2   a second replicate (engine.seed=2 train.seed=2), the same stages
#   compare_final_pool, compare_pool   the recipe as the pool of its three seeds (`ctxrl compare` with
#               comma-separated replicates), against the start and the twin: KEEP/summary_final_pool.json (FINAL test
#               tasks) and KEEP/summary_pool.json (dev)
#   confirm_start, confirm_wide, confirm_wide_s1, confirm_wide_s2, compare_confirm   the confirmatory table: the start
#               and the three seeds on the next FINAL test tasks (eval.offset=FINAL), untouched by every earlier
#               evaluation, the seeds pooled: KEEP/summary_confirm.json
#   grpo_wide_edit_mid, eval_wide_edit_mid, grpo_wide_edit, final_wide_edit, eval_wide_edit, compare_final_wide_edit,
#               compare_wide_edit   the seventh arm with the efficiency advantage on edit tokens (the default,
#               advantages.efficiency_tokens=edits) against the start and the twin: KEEP/summary_final_wide_edit.json
#               (FINAL test tasks) and KEEP/summary_wide_edit.json (dev)
#   grpo_wide_edit_w1_mid, eval_wide_edit_w1_mid, grpo_wide_edit_w1, final_wide_edit_w1, eval_wide_edit_w1,
#               compare_final_wide_edit_w1, compare_wide_edit_w1   the edit-token arm at w_eff = 1.0 against the start
#               and the edit-token arm: KEEP/summary_final_wide_edit_w1.json (test), KEEP/summary_wide_edit_w1.json
#   grpo_wide_edit_s1_mid … eval_wide_edit_s1, grpo_wide_edit_s2_mid … eval_wide_edit_s2, compare_final_edit_pool,
#               compare_edit_pool   the edit-token arm (w_eff = 0.25, the issue's reference recipe) at seeds 1 and 2,
#               then its three seeds pooled against the start and the twin: KEEP/summary.json (FINAL test tasks, the
#               issue's final table) and KEEP/summary_edit_pool.json (dev)
#   confirm_wide_edit, confirm_wide_edit_s1, confirm_wide_edit_s2, compare_confirm_edit   the reference recipe's
#               confirmatory table: its three seeds on the confirmatory test tasks, pooled against confirm_start:
#               KEEP/summary_confirm_edit.json
#   grpo_wide_w0_s1_mid, eval_wide_w0_s1_mid, grpo_wide_w0_s1, final_wide_w0_s1, eval_wide_w0_s1   the twin with
#               the first replicate's seeds, evaluated the same way
# Sizes: HELDOUT, MID, STEPS, FINAL (environment). KEY=VALUE arguments go to both GRPO arms (e.g. train.lr=1e-4).
#
# Across sessions. OUT holds the working files (demonstrations, merged models, full checkpoints); KEEP (default
# OUT/keep; the benchmark in docs/results/learning/ ran with KEEP=docs/results/learning, committed after each
# stage) holds what a later session needs, all of it small: every stage's metrics, summaries and eval JSON, the
# LoRA adapters in bf16 (about 10 MB each; never a merged model) and the GRPO runs slimmed by
# `python -m ctxrl.train.keep`. A stage whose marker KEEP/.NAME.done exists is skipped; a session with a fresh
# OUT merges the adapters it needs again (`ctxrl export --adapter`) and resumes a kept GRPO run (its AdamW
# moments start at zero there, which the run's log says). UNTIL=NAME stops after that stage, to size a session.
set -euo pipefail
OUT="${1:-runs/learn}"
shift || true
KEEP="${KEEP:-$OUT/keep}"
CTXRL="${CTXRL:-ctxrl}"
PY="${PY:-python}"
HELDOUT="${HELDOUT:-64}"
MID="${MID:-10}"
STEPS="${STEPS:-20}"
UNTIL="${UNTIL:-}"
BASE=smollm2-135m-instruct
mkdir -p "$OUT" "$KEEP"
stage() {  # stage NAME COMMAND...: skipped once KEEP/.NAME.done exists
  local name="$1"
  shift
  if [ -e "$KEEP/.$name.done" ]; then
    echo "== $name: done before, skipped"
    return
  fi
  echo "== $name: $*"
  local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1 || { echo "$name failed; see $OUT/$name.log" >&2; tail -5 "$OUT/$name.log" >&2; exit 1; }
  printf '%s\t%d\n' "$name" $((SECONDS - t0)) >> "$KEEP/times.tsv"
  touch "$KEEP/.$name.done"
  tail -3 "$OUT/$name.log"
  if [ "$UNTIL" = "$name" ]; then
    echo "== stopped after $name (UNTIL=$UNTIL)"
    exit 0
  fi
}
keep() {  # keep NAME FILE...: copy a stage's small outputs into KEEP/NAME
  local name="$1"
  shift
  rm -rf "${KEEP:?}/$name"
  mkdir -p "$KEEP/$name"
  cp -r "$@" "$KEEP/$name/"
}
merged() {  # merged NAME BASE: OUT/NAME/model, merged again from KEEP/NAME/adapter when this OUT lacks it
  if [ ! -e "$OUT/$1/model/config.json" ]; then
    rm -rf "$OUT/$1/model"
    "$CTXRL" export --adapter "$KEEP/$1/adapter" --base "$2" --out "$OUT/$1/model"
  fi
}

DEMOS=("$OUT/demos_mini/trajectories.jsonl" "$OUT/demos_small/trajectories.jsonl")
demos() {
  for spec in mini:96 small:80; do
    "$CTXRL" rollout --config configs/demonstrations.yaml --model "$BASE" --overwrite \
      --out "$OUT/demos_${spec%%:*}" tasks.families=[retention] tasks.difficulty="${spec%%:*}" tasks.count="${spec##*:}"
  done
}
sft() {
  "$CTXRL" sft --config configs/sft_smollm2_ladder.yaml --demos "${DEMOS[@]}" --out "$OUT/sft" --overwrite
  keep sft "$OUT/sft/adapter" "$OUT/sft/summary.json" "$OUT/sft/metrics.jsonl"
}
calib() {
  CTXRL="$CTXRL" bash scripts/calibrate_smollm2.sh "$OUT/calib" "$OUT/sft/model"
  rm -rf "${KEEP:?}/calibration"
  local f
  for f in $(cd "$OUT/calib" && find . -name 'eval.json' -o -name 'eval.md' -o -name 'calibration.*' -o -name times.tsv); do
    mkdir -p "$KEEP/calibration/$(dirname "$f")"
    cp "$OUT/calib/$f" "$KEEP/calibration/$f"
  done
}
if [ ! -e "$KEEP/.sft.done" ] && [ ! -s "${DEMOS[1]}" ]; then
  rm -f "$KEEP/.demos.done"  # the demonstrations live in OUT only: a fresh OUT records them again
fi
stage demos demos
stage sft sft
merged sft "$BASE"
stage calib calib
chosen() { "$PY" -c "import json,sys; c=json.load(open(sys.argv[1]))['chosen']; print(c[sys.argv[2]] if c else '')" "$KEEP/calibration/calibration.json" "$1"; }
LEVEL="$(chosen level)"
MODE="$(chosen mode)"
if [ -z "$LEVEL" ]; then
  echo "the SFT start is inside [25 %, 75 %] at no level; the table is $KEEP/calibration/calibration.md" >&2
  exit 2
fi
echo "== training level: $LEVEL, $MODE mode"
AT=(tasks.difficulty="$LEVEL" rollout.mode="$MODE")
EVAL=(--config configs/eval_smollm2_ladder.yaml eval.difficulty="$LEVEL" eval.modes=["$MODE"])

ei() {
  "$CTXRL" rollout --config configs/eval_smollm2_ladder.yaml --model "$OUT/sft/model" --out "$OUT/self" \
    --overwrite tasks.families=[retention] tasks.split=train tasks.count=64 "${AT[@]}" rollout.group_size=1
  "$CTXRL" sft --config configs/sft_smollm2_ei.yaml --model "$OUT/sft/model" --out "$OUT/sft_ei" --overwrite \
    --demos "$OUT/self/trajectories.jsonl"
  keep sft_ei "$OUT/sft_ei/adapter" "$OUT/sft_ei/summary.json" "$OUT/sft_ei/metrics.jsonl"
  cp "$OUT/self/summary.json" "$KEEP/sft_ei/self_summary.json" 2>/dev/null || true
}
evaluate() {  # evaluate NAME MODEL EPISODES [KEY=VALUE...]: eval MODEL on the first EPISODES dev tasks into KEEP/NAME
  local name="$1" model="$2" episodes="$3"
  shift 3
  "$CTXRL" eval "${EVAL[@]}" eval.episodes="$episodes" "$@" --model "$model" --out "$OUT/$name" --overwrite
  keep "$name" "$OUT/$name/eval.json" "$OUT/$name/eval.md"
}
stage ei ei
merged sft_ei "$OUT/sft/model"
stage eval_sft evaluate eval_sft "$OUT/sft/model" "$HELDOUT"
stage eval_ei evaluate eval_ei "$OUT/sft_ei/model" "$HELDOUT"
success() { "$PY" -c "import json,sys; s=json.load(open(sys.argv[1]))['summary']; print(next(iter(s.values()))['overall']['success'])" "$KEEP/$1/eval.json"; }
START="sft"
if "$PY" -c "import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)" \
  "$(success eval_ei)" "$(success eval_sft)"; then
  START="sft_ei"
fi
echo "== GRPO start: $OUT/$START/model"

restored() {  # restored NAME: OUT/NAME, brought back from KEEP/NAME when this OUT lacks the GRPO run
  if [ ! -e "$OUT/$1/config.yaml" ] && [ -e "$KEEP/$1/checkpoints/latest" ]; then
    rm -rf "${OUT:?}/$1"
    "$PY" -m ctxrl.train.keep --restore "$KEEP/$1" "$OUT/$1"
  fi
}
arm() {  # arm NAME STEPS EXTRA...: GRPO into OUT/NAME (resumed when it has begun, here or in KEEP), then kept
  local name="$1" steps="$2"
  shift 2
  local resume=()
  restored "$name"
  [ -e "$OUT/$name/config.yaml" ] && resume=(--resume)
  "$CTXRL" train --config configs/train_smollm2_ladder.yaml --model "$OUT/$START/model" --out "$OUT/$name" \
    "${resume[@]}" "${AT[@]}" train.steps="$steps" "$@"
  "$PY" -m ctxrl.train.keep "$OUT/$name" "$KEEP/$name"
}
evaluate_run() {  # evaluate_run NAME RUN STEP EPISODES [KEY=VALUE...]: export the RUN's checkpoint STEP, evaluate it
  local name="$1" run="$2" step="$3" episodes="$4"
  shift 4
  restored "$run"
  rm -rf "$OUT/$name.model"  # beside the eval's folder, which its --overwrite empties
  "$CTXRL" export --run "$OUT/$run" --step "$step" --out "$OUT/$name.model"
  evaluate "$name" "$OUT/$name.model" "$episodes" "$@"
}
START_EVAL="$KEEP/eval_$([ "$START" = sft ] && echo sft || echo ei)"
arm_stages() {  # arm_stages NAME "TEST_A TEST_B" "DEV_A DEV_B" KEY=VALUE...: one arm (grpo_NAME) in the order a kept
  # run needs (its step-MID evaluation before the run goes past MID), its test and dev evaluations compared with
  # the start's: KEEP/summary_test_NAME.json (start, TEST_A, TEST_B) and KEEP/summary_NAME.json (start, DEV_A, DEV_B)
  local name="$1" test_pair="$2" dev_pair="$3"
  shift 3
  stage "grpo_${name}_mid" arm "grpo_$name" "$MID" "$@"
  stage "eval_${name}_mid" evaluate_run "eval_${name}_mid" "grpo_$name" "$MID" 32
  stage "grpo_$name" arm "grpo_$name" "$STEPS" "$@"
  stage "test_$name" evaluate_run "test_$name" "grpo_$name" "$STEPS" "$HELDOUT" eval.split=test
  stage "compare_test_$name" "$CTXRL" compare "$KEEP/test_start" "$KEEP/${test_pair% *}" "$KEEP/${test_pair#* }" \
    --out "$KEEP/summary_test_$name.json"
  stage "eval_$name" evaluate_run "eval_$name" "grpo_$name" "$STEPS" "$HELDOUT"
  stage "compare_$name" "$CTXRL" compare "$START_EVAL" "$KEEP/${dev_pair% *}" "$KEEP/${dev_pair#* }" \
    --out "$KEEP/summary_$name.json"
}
merged "$START" "$([ "$START" = sft ] && echo "$BASE" || echo "$OUT/sft/model")"
stage grpo_mid arm grpo "$MID" "$@"
stage grpo_w0_mid arm grpo_w0 "$MID" advantages.w_eff=0 "$@"
stage eval_mid evaluate_run eval_mid grpo "$MID" 32
stage eval_w0_mid evaluate_run eval_w0_mid grpo_w0 "$MID" 32
stage grpo arm grpo "$STEPS" "$@"
stage grpo_w0 arm grpo_w0 "$STEPS" advantages.w_eff=0 "$@"
stage eval_grpo evaluate_run eval_grpo grpo "$STEPS" "$HELDOUT"
stage eval_w0 evaluate_run eval_w0 grpo_w0 "$STEPS" "$HELDOUT"
stage compare "$CTXRL" compare "$START_EVAL" "$KEEP/eval_grpo" "$KEEP/eval_w0" --out "$KEEP/summary_first.json"
stage grpo_act_mid arm grpo_act "$MID" advantages.efficiency_tokens=actions "$@"
stage eval_act_mid evaluate_run eval_act_mid grpo_act "$MID" 32
stage grpo_act arm grpo_act "$STEPS" advantages.efficiency_tokens=actions "$@"
stage eval_act evaluate_run eval_act grpo_act "$STEPS" "$HELDOUT"
stage compare_act "$CTXRL" compare "$START_EVAL" "$KEEP/eval_act" "$KEEP/eval_w0" --out "$KEEP/summary_actions.json"
# The final table on the untouched test split: the start and every arm's last checkpoint, the same HELDOUT tasks.
stage test_start evaluate test_start "$OUT/$START/model" "$HELDOUT" eval.split=test
stage test_grpo evaluate_run test_grpo grpo "$STEPS" "$HELDOUT" eval.split=test
stage test_w0 evaluate_run test_w0 grpo_w0 "$STEPS" "$HELDOUT" eval.split=test
stage test_act evaluate_run test_act grpo_act "$STEPS" "$HELDOUT" eval.split=test
stage compare_test "$CTXRL" compare "$KEEP/test_start" "$KEEP/test_grpo" "$KEEP/test_w0" --out "$KEEP/summary_test.json"
stage compare_test_act "$CTXRL" compare "$KEEP/test_start" "$KEEP/test_act" "$KEEP/test_w0" --out "$KEEP/summary_test_actions.json"
arm_stages rank "test_rank test_act" "eval_rank eval_act" advantages.efficiency_tokens=actions advantages.efficiency=rank "$@"
LR=(advantages.efficiency_tokens=actions train.lr=2e-4)
LR_W0=("${LR[@]}" advantages.w_eff=0)
stage grpo_lr_mid arm grpo_lr "$MID" "${LR[@]}" "$@"
stage eval_lr_mid evaluate_run eval_lr_mid grpo_lr "$MID" 32
stage grpo_lr arm grpo_lr "$STEPS" "${LR[@]}" "$@"
stage test_lr evaluate_run test_lr grpo_lr "$STEPS" "$HELDOUT" eval.split=test
stage compare_test_lr "$CTXRL" compare "$KEEP/test_start" "$KEEP/test_lr" "$KEEP/test_act" --out "$KEEP/summary_test_lr.json"
stage grpo_lr_w0_mid arm grpo_lr_w0 "$MID" "${LR_W0[@]}" "$@"
# A sixth arm: the fifth one with its rate decaying linearly over the STEPS rounds (2e-4 at round 1, 1e-5 at
# round 20). It runs before the twin's last ten steps (which resume from KEEP in a fresh OUT, their AdamW moments
# at zero), and those before the fifth arm's and the twin's step-20 evaluations on dev tasks.
LRD=("${LR[@]}" train.lr_schedule=linear train.lr_schedule_steps="$STEPS")
stage grpo_lrd_mid arm grpo_lrd "$MID" "${LRD[@]}" "$@"
stage eval_lrd_mid evaluate_run eval_lrd_mid grpo_lrd "$MID" 32
stage grpo_lrd arm grpo_lrd "$STEPS" "${LRD[@]}" "$@"
stage test_lrd evaluate_run test_lrd grpo_lrd "$STEPS" "$HELDOUT" eval.split=test
stage compare_test_lrd "$CTXRL" compare "$KEEP/test_start" "$KEEP/test_lrd" "$KEEP/test_lr" --out "$KEEP/summary_test_lrd.json"
stage eval_lrd evaluate_run eval_lrd grpo_lrd "$STEPS" "$HELDOUT"
stage eval_lr_w0_mid evaluate_run eval_lr_w0_mid grpo_lr_w0 "$MID" 32
stage grpo_lr_w0 arm grpo_lr_w0 "$STEPS" "${LR_W0[@]}" "$@"
stage test_lr_w0 evaluate_run test_lr_w0 grpo_lr_w0 "$STEPS" "$HELDOUT" eval.split=test
stage compare_test_lr_w0 "$CTXRL" compare "$KEEP/test_start" "$KEEP/test_lr" "$KEEP/test_lr_w0" --out "$KEEP/summary_test_lr_w0.json"
stage eval_lr evaluate_run eval_lr grpo_lr "$STEPS" "$HELDOUT"
stage compare_lr "$CTXRL" compare "$START_EVAL" "$KEEP/eval_lr" "$KEEP/eval_act" --out "$KEEP/summary_lr.json"
stage compare_lrd "$CTXRL" compare "$START_EVAL" "$KEEP/eval_lrd" "$KEEP/eval_lr" --out "$KEEP/summary_lrd.json"
stage eval_lr_w0 evaluate_run eval_lr_w0 grpo_lr_w0 "$STEPS" "$HELDOUT"
stage compare_lr_w0 "$CTXRL" compare "$START_EVAL" "$KEEP/eval_lr" "$KEEP/eval_lr_w0" --out "$KEEP/summary_lr_w0.json"
# The sixth arm's ablation: the same decaying rate at w_eff = 0 (a full run of its own, 2026-12-05).
LRD_W0=("${LRD[@]}" advantages.w_eff=0)
arm_stages lrd_w0 "test_lrd test_lrd_w0" "eval_lrd eval_lrd_w0" "${LRD_W0[@]}" "$@"
# A seventh arm: the sixth with twice the tasks a step (one run's trajectory was the dominant noise at 2 tasks x
# G = 8), trained in bf16 to pay for them (train.mixed_precision=bf16 needs a CPU with bf16 arithmetic: AMX or
# AVX512-BF16; elsewhere it is slower than float32). Then its w_eff = 0 twin, compared with it, not with fp32 arms.
WIDE=("${LRD[@]}" tasks.count=4 train.mixed_precision=bf16 engine.dtype=bfloat16)
WIDE_W0=("${WIDE[@]}" advantages.w_eff=0)
arm_stages wide "test_wide test_lrd" "eval_wide eval_lrd" "${WIDE[@]}" "$@"
arm_stages wide_w0 "test_wide test_wide_w0" "eval_wide eval_wide_w0" "${WIDE_W0[@]}" "$@"
# The final table on FINAL (128) test tasks, every policy evaluated afresh: at 64 paired tasks the 95 % CI of a
# success difference is about +-0.12 wide each way, more than the goal's 5-point bound. The start, the seventh arm
# and its twin (KEEP/summary_final_wide.json, the final table until the edit-token pool below), then a replicate of the seventh arm that differs in
# its seeds only (engine.seed and train.seed 1: the same tasks each step, other samples), compared on them too.
FINAL="${FINAL:-128}"
stage final_start evaluate final_start "$OUT/$START/model" "$FINAL" eval.split=test
stage final_wide evaluate_run final_wide grpo_wide "$STEPS" "$FINAL" eval.split=test
stage final_wide_w0 evaluate_run final_wide_w0 grpo_wide_w0 "$STEPS" "$FINAL" eval.split=test
stage compare_final "$CTXRL" compare "$KEEP/final_start" "$KEEP/final_wide" "$KEEP/final_wide_w0" \
  --out "$KEEP/summary_final_wide.json"
replicate() {  # replicate NAME KEY=VALUE...: GRPO run grpo_NAME to MID (evaluated on 32 dev tasks) and to STEPS,
  # then evaluated on the first FINAL test tasks (KEEP/final_NAME) and the HELDOUT dev tasks (KEEP/eval_NAME)
  local name="$1"
  shift
  stage "grpo_${name}_mid" arm "grpo_$name" "$MID" "$@"
  stage "eval_${name}_mid" evaluate_run "eval_${name}_mid" "grpo_$name" "$MID" 32
  stage "grpo_$name" arm "grpo_$name" "$STEPS" "$@"
  stage "final_$name" evaluate_run "final_$name" "grpo_$name" "$STEPS" "$FINAL" eval.split=test
  stage "eval_$name" evaluate_run "eval_$name" "grpo_$name" "$STEPS" "$HELDOUT"
}
for seed in 1 2; do  # the seventh arm's replicates, each compared with the start and the seventh arm
  replicate "wide_s$seed" "${WIDE[@]}" engine.seed=$seed train.seed=$seed "$@"
  stage "compare_final_wide_s$seed" "$CTXRL" compare "$KEEP/final_start" "$KEEP/final_wide_s$seed" \
    "$KEEP/final_wide" --out "$KEEP/summary_final_wide_s$seed.json"
  stage "compare_wide_s$seed" "$CTXRL" compare "$START_EVAL" "$KEEP/eval_wide_s$seed" "$KEEP/eval_wide" \
    --out "$KEEP/summary_wide_s$seed.json"
done
# the recipe's result, declared before grpo_wide_s2 ran: the pool of its three seeds against the start, the twin
# with the one seed it has (test; the same on the dev tasks)
POOL=final_wide,final_wide_s1,final_wide_s2
stage compare_final_pool "$CTXRL" compare "$KEEP/final_start" "$KEEP/${POOL//,/,$KEEP/}" "$KEEP/final_wide_w0" \
  --out "$KEEP/summary_final_pool.json"
DEV_POOL=eval_wide,eval_wide_s1,eval_wide_s2
stage compare_pool "$CTXRL" compare "$START_EVAL" "$KEEP/${DEV_POOL//,/,$KEEP/}" "$KEEP/eval_wide_w0" \
  --out "$KEEP/summary_pool.json"
# the confirmatory table, declared before it ran: the start and the recipe's three seeds on the next FINAL test
# tasks (seeds FINAL to 2 FINAL - 1 of the split), which no evaluation had touched, the seeds pooled
AFTER=(eval.split=test eval.offset="$FINAL")
stage confirm_start evaluate confirm_start "$OUT/$START/model" "$FINAL" "${AFTER[@]}"
for run in wide wide_s1 wide_s2; do
  stage "confirm_$run" evaluate_run "confirm_$run" "grpo_$run" "$STEPS" "$FINAL" "${AFTER[@]}"
done
stage compare_confirm "$CTXRL" compare "$KEEP/confirm_start" \
  "$KEEP/confirm_wide,$KEEP/confirm_wide_s1,$KEEP/confirm_wide_s2" --out "$KEEP/summary_confirm.json"
# the recipe with the efficiency advantage on the default edit tokens (the issue's reference design), declared
# before it ran: the seventh arm without advantages.efficiency_tokens=actions, seed 0, against the start and the
# w_eff = 0 twin (which is the same for either token choice) on the first FINAL test tasks: the issue's ablation
WIDE_EDIT=()
for kv in "${WIDE[@]}"; do [ "$kv" = advantages.efficiency_tokens=actions ] || WIDE_EDIT+=("$kv"); done
replicate wide_edit "${WIDE_EDIT[@]}" "$@"
stage compare_final_wide_edit "$CTXRL" compare "$KEEP/final_start" "$KEEP/final_wide_edit" "$KEEP/final_wide_w0" \
  --out "$KEEP/summary_final_wide_edit.json"
stage compare_wide_edit "$CTXRL" compare "$START_EVAL" "$KEEP/eval_wide_edit" "$KEEP/eval_wide_w0" \
  --out "$KEEP/summary_wide_edit.json"
# the edit-token recipe at four times the efficiency weight (w_eff = 1.0), declared before it ran: at 0.25 the
# relative efficiency advantage (the cost difference among a group's successes, about +-0.2) is about a tenth of the
# task advantage, and neither token choice moved compute per success; against the start and the edit-token arm
replicate wide_edit_w1 "${WIDE_EDIT[@]}" advantages.w_eff=1.0 "$@"
stage compare_final_wide_edit_w1 "$CTXRL" compare "$KEEP/final_start" "$KEEP/final_wide_edit_w1" \
  "$KEEP/final_wide_edit" --out "$KEEP/summary_final_wide_edit_w1.json"
stage compare_wide_edit_w1 "$CTXRL" compare "$START_EVAL" "$KEEP/eval_wide_edit_w1" "$KEEP/eval_wide_edit" \
  --out "$KEEP/summary_wide_edit_w1.json"
# the issue's reference recipe as the pool of three seeds, declared 2026-12-05 before its seed 1 ran: the edit-token
# arm (w_eff = 0.25) at seeds 1 and 2, then its seeds 0-2 pooled against the start and the twin (seed 0) on the first
# FINAL test tasks, written as the issue's final table KEEP/summary.json whatever it shows, and on the dev tasks
for seed in 1 2; do
  replicate "wide_edit_s$seed" "${WIDE_EDIT[@]}" engine.seed=$seed train.seed=$seed "$@"
done
EDIT_POOL=final_wide_edit,final_wide_edit_s1,final_wide_edit_s2
stage compare_final_edit_pool "$CTXRL" compare "$KEEP/final_start" "$KEEP/${EDIT_POOL//,/,$KEEP/}" \
  "$KEEP/final_wide_w0" --out "$KEEP/summary.json"
DEV_EDIT_POOL=eval_wide_edit,eval_wide_edit_s1,eval_wide_edit_s2
stage compare_edit_pool "$CTXRL" compare "$START_EVAL" "$KEEP/${DEV_EDIT_POOL//,/,$KEEP/}" "$KEEP/eval_wide_w0" \
  --out "$KEEP/summary_edit_pool.json"
# the reference recipe's confirmatory table, declared 2026-12-06 after its final table and before these ran: its
# three seeds on the same next FINAL test tasks as the action-token recipe's confirmation, pooled against the start
for run in wide_edit wide_edit_s1 wide_edit_s2; do
  stage "confirm_$run" evaluate_run "confirm_$run" "grpo_$run" "$STEPS" "$FINAL" "${AFTER[@]}"
done
CONFIRM_EDIT_POOL=confirm_wide_edit,confirm_wide_edit_s1,confirm_wide_edit_s2
stage compare_confirm_edit "$CTXRL" compare "$KEEP/confirm_start" "$KEEP/${CONFIRM_EDIT_POOL//,/,$KEEP/}" \
  --out "$KEEP/summary_confirm_edit.json"
replicate wide_w0_s1 "${WIDE_W0[@]}" engine.seed=1 train.seed=1 "$@"  # the twin at the first replicate's seeds
echo "== done: $KEEP/summary.json; stage times (s) in $KEEP/times.tsv"
