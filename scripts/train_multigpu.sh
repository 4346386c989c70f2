#!/usr/bin/env bash
# bash scripts/train_multigpu.sh [--accelerate ddp|deepspeed_zero2] [--procs N] -- [ctxrl train arguments]
#
# Launches `ctxrl train` on several ranks with accelerate: one rank per GPU (N defaults to the GPU count),
# using configs/accelerate/<name>.yaml. Each rank rolls out its own tasks with its own engine; DDP (or
# DeepSpeed) averages the gradients. Example:
#
#   bash scripts/train_multigpu.sh --accelerate ddp -- --config configs/train_tiny.yaml --out runs/ddp
#
# With no GPU, ddp runs N (default 2) real gloo processes on the CPU, as `accelerate launch --multi_gpu
# --num_processes N` does with no GPU present (`--cpu --num_processes N` silently runs one), and
# deepspeed_zero2 runs N gloo ranks on DeepSpeed's CPU accelerator (DS_ACCELERATOR=cpu; needs
# `pip install 'ctxrl[deepspeed]'`, and a C++ compiler for the op DeepSpeed builds on its first start).
# PYTHON selects the interpreter (default: python).
set -euo pipefail

name=ddp
procs=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --accelerate) name="$2"; shift 2 ;;
    --procs) procs="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "train_multigpu.sh: unknown option $1 (options: --accelerate NAME, --procs N, then -- and ctxrl train's)" >&2; exit 2 ;;
  esac
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
config="$root/configs/accelerate/$name.yaml"
if [[ ! -f "$config" ]]; then
  echo "train_multigpu.sh: no accelerate config $config (have: $(ls "$root/configs/accelerate" | tr '\n' ' '))" >&2
  exit 2
fi
python="${PYTHON:-python}"
gpus="$("$python" -c 'import torch; print(torch.cuda.device_count())')"

if [[ "$gpus" -eq 0 ]]; then
  case "$name" in
    ddp) ;;  # accelerate finds no GPU and starts gloo processes on the CPU
    deepspeed_zero2) export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}" ;;  # DeepSpeed would look for CUDA
    *) echo "train_multigpu.sh: no GPU here; only --accelerate ddp or deepspeed_zero2 run on the CPU" >&2
       exit 2 ;;
  esac
  gpus=2
fi
exec "$python" -m accelerate.commands.launch --config_file "$config" --num_processes "${procs:-$gpus}" \
  -m ctxrl.cli train "$@"
