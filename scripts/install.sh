#!/usr/bin/env bash
# Create (or reuse) a virtualenv and install the package with what the tests and demo need.
# Usage: scripts/install.sh [VENV_DIR] [EXTRAS]      e.g. scripts/install.sh .venv dev,bench
# On a machine without a GPU, the CPU build of torch goes in first, so the pyproject's torch
# range is already satisfied and pip does not fetch a multi-GB CUDA build.
set -euo pipefail
venv="${1:-.venv}"
extras="${2:-dev}"
python="${PYTHON:-python3}"

"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
  { echo "packing_collators needs Python >= 3.10 (found $("$python" --version)); set PYTHON=..." >&2; exit 1; }
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade pip

if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "${pip[@]}" install -q 'torch>=2.6,<3'
  else
    "${pip[@]}" install -q 'torch==2.13.0' ||
      "${pip[@]}" install -q torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi
"${pip[@]}" install -q -e ".[${extras}]"
# The tests run the chunked loss's Triton kernel on the CPU under Triton's interpreter (tests/loss/test_chunked.py).
# CUDA builds of torch bring Triton; the CPU build does not. Linux x86-64 wheels only.
if [[ ",${extras}," == *",dev,"* ]] && [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ]; then
  "$venv/bin/python" -c 'import triton' 2>/dev/null || "${pip[@]}" install -q 'triton>=3.2'
fi
touch "$venv/.installed-${extras//,/-}"
