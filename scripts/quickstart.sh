#!/usr/bin/env bash
# bash scripts/quickstart.sh [ctxrl quickstart ARGS...]
#
# Sets up .venv (scripts/setup.sh), then runs the CPU quickstart on the embedded default: the tiny model
# built offline, and every stage of the pipeline that exists, end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV="${CTXRL_VENV:-.venv}"
export WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$VENV/bin/ctxrl" quickstart "$@"
