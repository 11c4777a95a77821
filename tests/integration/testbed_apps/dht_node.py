"""A hivemind DHT node for the testbed tests; run inside a testbed host.

    python dht_node.py store --address A --port P --key K --value V
    python dht_node.py get --address A --port P --key K --initial-peer MADDR --timeout-s T

Each prints one JSON line (its visible multiaddrs, or the value found), then waits until its stdin
closes and shuts the DHT down cleanly.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import hivemind
from hivemind.utils import get_dht_time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["store", "get"])
    parser.add_argument("--address", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--value", default="")
    parser.add_argument("--initial-peer", action="append", default=[])
    parser.add_argument("--timeout-s", type=float, default=30.0)
    args = parser.parse_args()
    dht = hivemind.DHT(
        initial_peers=args.initial_peer,
        host_maddrs=[f"/ip4/0.0.0.0/tcp/{args.port}"],
        announce_maddrs=[f"/ip4/{args.address}/tcp/{args.port}"],
        start=True,
    )
    try:
        if args.mode == "store":
            stored = dht.store(args.key, args.value, expiration_time=get_dht_time() + 600)
            result = {"stored": bool(stored), "maddrs": [str(m) for m in dht.get_visible_maddrs()]}
        else:
            found, deadline = None, time.monotonic() + args.timeout_s
            while found is None and time.monotonic() < deadline:
                found = dht.get(args.key, latest=True)
                if found is None:
                    time.sleep(0.2)
            result = {"value": None if found is None else found.value}
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
        sys.stdin.read()
    finally:
        dht.shutdown()


if __name__ == "__main__":
    main()
