"""The reachability check `join` runs at start, alone: run inside a testbed host.

    python reach_check.py --identity K --host H [--port P] [--announce-host A] --initial-peer MADDR

Prints one JSON line: what the check found and the lines `join` would print about it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from p2p_trainer.config.security import SecurityConfig
from p2p_trainer.net import reach
from p2p_trainer.net.dht import DHTConfig, start_node
from p2p_trainer.net.transport import Transport


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--identity", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--announce-host", default=None)
    parser.add_argument("--initial-peer", required=True)
    args = parser.parse_args()
    config = DHTConfig(
        identity_path=args.identity,
        host=args.host,
        port=args.port,
        announce_host=args.announce_host,
        initial_peers=(args.initial_peer,),
    )
    node = start_node(config)
    transport = Transport(node.dht, max_payload_bytes=1024, security=SecurityConfig(defences=False))
    try:
        found = transport.run(reach.check(transport.p2p, node.bootstrap_ids(), node.visible_maddrs()), 60)
        result = {**dataclasses.asdict(found), "advice": reach.advice(found, "auto")}
        sys.stdout.write(json.dumps(result) + "\n")
    finally:
        transport.close()
        node.shutdown()


if __name__ == "__main__":
    main()
