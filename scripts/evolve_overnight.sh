#!/usr/bin/env bash
# bash scripts/evolve_overnight.sh OUT [ctxrl evolve ARGS...]
#   e.g. bash scripts/evolve_overnight.sh runs/night1 --config configs/evolve/overnight.yaml --hours 10
#
# A night of skill evolution that survives crashes: runs `ctxrl evolve ... --out OUT` (with --resume once OUT
# holds a run: `--resume` of a folder that is not a run is an error) again and again until it exits 0 (all rounds done, the --hours spent, or a STOP file ended it), each rerun resuming from OUT's lineage
# store. `touch OUT/STOP` ends the night after the current batch (the test comparison still runs); the loop
# here does not restart a run while OUT/STOP exists. It gives up after CTXRL_MAX_RESTARTS (default 20)
# consecutive failures, waiting CTXRL_RESTART_WAIT seconds (default 30) between tries.
set -uo pipefail
if [ $# -lt 1 ]; then
  echo "usage: bash scripts/evolve_overnight.sh OUT [ctxrl evolve ARGS...]" >&2
  exit 2
fi
OUT="$1"
shift
CTXRL="${CTXRL:-ctxrl}"
MAX="${CTXRL_MAX_RESTARTS:-20}"
WAIT="${CTXRL_RESTART_WAIT:-30}"
export WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
failures=0
while true; do
  resume=()
  if [ -e "$OUT/config.yaml" ] || [ -e "$OUT/night.json" ]; then
    resume=(--resume)
  fi
  $CTXRL evolve "$@" --out "$OUT" "${resume[@]}"
  status=$?
  if [ "$status" -eq 0 ]; then
    exit 0
  fi
  if [ -e "$OUT/STOP" ]; then
    echo "evolve_overnight: $OUT/STOP exists; not restarting (exit $status)" >&2
    exit "$status"
  fi
  failures=$((failures + 1))
  if [ "$failures" -ge "$MAX" ]; then
    echo "evolve_overnight: $failures failures in a row; giving up (last exit $status)" >&2
    exit "$status"
  fi
  echo "evolve_overnight: ctxrl evolve exited $status; resuming in ${WAIT}s (failure $failures of $MAX)" >&2
  sleep "$WAIT"
done
