#!/usr/bin/env bash
# Launch a training peer. INITIAL_PEERS: what `p2p-trainer bootstrap` printed (the multiaddr).
set -euo pipefail
: "${INITIAL_PEERS:?set INITIAL_PEERS to the multiaddr printed by p2p-trainer bootstrap}"
exec p2p-trainer join --initial-peers "$INITIAL_PEERS" \
  --config "${CONFIG:-$(dirname "$0")/default.toml}" \
  --identity "${IDENTITY:-$HOME/.p2p-trainer/peer.key}" \
  --run-dir "${RUN_DIR:-runs/peer}" "$@"
