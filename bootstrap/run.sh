#!/usr/bin/env bash
# Launch a bootstrap node. PUBLIC_HOST: the address other machines dial (an IP or a name that
# resolves); PORT: fixed TCP port; ADDRESS_FILE: also write the multiaddr there for peers' --initial-peers-file.
# As a service: bootstrap/p2p-trainer-bootstrap.service (systemd).
set -euo pipefail
exec p2p-trainer bootstrap --host 0.0.0.0 --port "${PORT:-31337}" \
  ${PUBLIC_HOST:+--announce-host "$PUBLIC_HOST"} \
  ${ADDRESS_FILE:+--address-file "$ADDRESS_FILE"} \
  --identity "${IDENTITY:-$HOME/.p2p-trainer/bootstrap.key}" "$@"
