#!/usr/bin/env bash
# A real local swarm on one GPU: a bootstrap node and 2 peer processes (hivemind DHT, p2pd) each
# training bench/gpu_swarm.toml's Llama on the same CUDA device. Prints the swarm's summary.
#   bash bench/gpu_swarm.sh [RUN_DIR]
# Where the machine has no package index, the project's dependencies can come as a folder of
# wheels (.devsite/whl) and pure-Python packages (.devsite/pure), installed to /tmp/site here.
set -euo pipefail
RUN="${1:-/tmp/gpu-swarm-$(date +%s)}"
if ! python3 -c "import hivemind" 2>/dev/null && [ -d .devsite/whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .devsite/whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD/.devsite/pure:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -e "$RUN" ] && [ -n "$(ls -A "$RUN")" ]; then
  echo "run directory $RUN is not empty: name a new one" >&2
  exit 2
fi
timeout -k 30 "${SWARM_TIMEOUT_S:-300}" python3 -m p2p_trainer local --config bench/gpu_swarm.toml --peers 2 --no-live \
  --run-dir "$RUN"
