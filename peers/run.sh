#!/usr/bin/env bash
# Launch a training peer. INITIAL_PEERS: what `p2p-trainer bootstrap` printed (the multiaddr).
# CONFIG: a run config TOML (default: the packaged default run; `p2p-trainer config` prints it).
set -euo pipefail
: "${INITIAL_PEERS:?set INITIAL_PEERS to the multiaddr printed by p2p-trainer bootstrap}"
exec p2p-trainer join --initial-peers "$INITIAL_PEERS" \
  ${CONFIG:+--config "$CONFIG"} \
  --identity "${IDENTITY:-$HOME/.p2p-trainer/peer.key}" \
  --run-dir "${RUN_DIR:-runs/peer}" "$@"
