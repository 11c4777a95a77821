#!/usr/bin/env bash
# One prepared check for a machine with one H200 (issue 15): tokens/s and MFU of a ~125M and a
# ~350M Llama-style model in one peer and two peers exchanging on the one GPU (outer state
# offloaded to pinned host memory, then kept on the GPU), each against bare torch in the same run;
# peak GPU and host memory per arm. At most 8 minutes. Run from the repository root:
#   bash bench/gpu_check.sh [OUT_DIR]
set -euo pipefail
OUT="${1:-${OUT:-bench/results/gpu}}"
PY=python3
if [ ! -x .venv/bin/python ]; then
  $PY -m venv .venv
  # the machine's CUDA build of torch if it has one, else the pinned release from PyPI
  .venv/bin/pip install -q "torch>=2.4" || true
  .venv/bin/pip install -q -e .
fi
nvidia-smi --query-gpu=name,memory.total,utilization.gpu --format=csv || true
timeout 480 .venv/bin/python -m bench.gpu_check --out "$OUT"
