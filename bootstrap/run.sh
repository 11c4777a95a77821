#!/usr/bin/env bash
# Launch a bootstrap node. PUBLIC_HOST: the address other machines dial; PORT: fixed TCP port.
set -euo pipefail
exec p2p-trainer bootstrap --host 0.0.0.0 --port "${PORT:-31337}" \
  ${PUBLIC_HOST:+--announce-host "$PUBLIC_HOST"} \
  --identity "${IDENTITY:-$HOME/.p2p-trainer/bootstrap.key}" "$@"
