#!/usr/bin/env bash
# Launch a training peer. INITIAL_PEERS: what `p2p-trainer bootstrap` printed (the multiaddr), or
# INITIAL_PEERS_FILE: the file a bootstrap node writes with --address-file (waited for).
# CONFIG: a run config TOML (default: the packaged default run; `p2p-trainer config` prints it).
set -euo pipefail
if [[ -z "${INITIAL_PEERS:-}" && -z "${INITIAL_PEERS_FILE:-}" ]]; then
  echo "set INITIAL_PEERS to the multiaddr printed by p2p-trainer bootstrap, or INITIAL_PEERS_FILE" >&2
  exit 2
fi
exec p2p-trainer join ${INITIAL_PEERS:+--initial-peers "$INITIAL_PEERS"} \
  ${INITIAL_PEERS_FILE:+--initial-peers-file "$INITIAL_PEERS_FILE"} \
  ${CONFIG:+--config "$CONFIG"} \
  --identity "${IDENTITY:-$HOME/.p2p-trainer/peer.key}" \
  --run-dir "${RUN_DIR:-runs/peer}" "$@"
