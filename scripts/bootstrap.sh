#!/usr/bin/env bash
# Set up (or reuse) the project's virtual environment in .venv.
#   scripts/bootstrap.sh          runtime dependencies
#   scripts/bootstrap.sh test     plus the test extra and Debian's chromium for the UI test
# torch: on a machine with an NVIDIA GPU pip's default (CUDA) build is installed; without
# one the CPU build is installed first so pip keeps it (TORCH_SPEC / TORCH_INDEX_URL override).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${DATAMASK_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip >/dev/null 2>&1 || true
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    spec=${TORCH_SPEC:-torch}
  else
    # The CPU build: on this project's machines torch 2.13.0 is a local CPU wheel; elsewhere
    # point TORCH_INDEX_URL at PyTorch's CPU wheel index.
    spec=${TORCH_SPEC:-torch==2.13.0}
  fi
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    "${PIP[@]}" install "$spec" --index-url "$TORCH_INDEX_URL"
  else
    "${PIP[@]}" install "$spec"
  fi
fi
if [ "${1:-}" = "test" ]; then
  "${PIP[@]}" install -e ".[test]"
  if ! command -v chromium >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" = "0" ] || SUDO="sudo"
    $SUDO apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium >/dev/null
  fi
else
  "${PIP[@]}" install -e .
fi
