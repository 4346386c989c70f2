set -e  # run from the repository root, after scripts/learn_smollm2.sh has made runs/ladder/sft/model
A=(--config configs/train_smollm2_ladder.yaml --model runs/ladder/sft/model tasks.difficulty=small rollout.mode=file advantages.efficiency_tokens=actions train.lr=2e-4 train.lr_schedule=linear train.lr_schedule_steps=20 train.steps=3 train.save_every=0)
for arm in bf16 fp32; do
  extra=()
  [ "$arm" = bf16 ] && extra=(train.mixed_precision=bf16 engine.dtype=bfloat16)
  rm -rf runs/bf16_check/$arm
  /usr/bin/time -v .venv/bin/ctxrl train "${A[@]}" --out runs/bf16_check/$arm "${extra[@]}" > runs/bf16_check/$arm.log 2>&1
done
echo DONE
