#!/usr/bin/env bash
# One prepared check for a machine with one H200 (issue 15): tokens/s and MFU of a ~125M and a
# ~350M Llama-style model in one peer and two peers exchanging on the one GPU (outer state
# offloaded to pinned host memory, then kept on the GPU), each against bare torch in the same run;
# peak GPU and host memory per arm. At most 8 minutes. Run from the repository root:
#   bash bench/gpu_check.sh [OUT_DIR]
# A python3 whose torch already sees CUDA is used as it is, with the checkout on PYTHONPATH (an
# offline GPU image: the measurement needs only torch, numpy and safetensors); otherwise a .venv.
set -euo pipefail
OUT="${1:-${OUT:-bench/results/gpu}}"
if python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  PY=python3
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
    # the machine's CUDA build of torch if it has one, else the pinned release from PyPI
    .venv/bin/pip install -q "torch>=2.4" || true
    .venv/bin/pip install -q -e .
  fi
  PY=.venv/bin/python
fi
nvidia-smi --query-gpu=name,memory.total,utilization.gpu --format=csv || true
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
timeout -k 30 480 "$PY" -m bench.gpu_check --out "$OUT"
