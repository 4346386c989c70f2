#!/usr/bin/env bash
# bash scripts/test.sh [PYTEST ARGS...]
#
# Sets up .venv (scripts/setup.sh), then runs the checks CI runs: ruff (lint + format check), mypy on
# src/ctxrl, the import-linter layer contract, and the whole pytest suite — every test that can run on a CPU, real vLLM included; only
# `gpu` tests skip without CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV="${CTXRL_VENV:-.venv}"
export WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

echo "[test] ruff check"
"$VENV/bin/ruff" check src tests
echo "[test] ruff format --check"
"$VENV/bin/ruff" format --check src tests
echo "[test] mypy src/ctxrl"
"$VENV/bin/mypy"
echo "[test] lint-imports (the layers: env < rewards < train < evolve < commands < cli)"
"$VENV/bin/lint-imports"
echo "[test] pytest"
set +e
"$VENV/bin/python" -m pytest --durations=15 "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  # Exit 5 means nothing was collected: a collection failure or a filter that matched nothing. Either way
  # the suite did not run, so it must not read as green.
  echo "[test] FAIL: pytest collected no tests (exit 5); check the test paths and -k/-m filters" >&2
fi
exit "$rc"
