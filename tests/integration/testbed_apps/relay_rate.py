"""One end of a message sent through a bootstrap node's relay, for the relay rate test.

    python relay_rate.py recv --identity K --host H --initial-peer MADDR --sender ID [--keep]
    python relay_rate.py send --identity K --host H --initial-peer MADDR --target ID --bytes N

Both print {"ready": true} once their node runs. A receiver with --keep then reads a line from
stdin, starts its connection keeper for the sender and prints {"kept": ...} once it has dialled
it. The receiver waits for the sender's message and prints its size and how it came; the sender
waits for a line on stdin, sends `--bytes` once (direct if it can open a stream, else through
the relay) and prints the time it took until delivery was confirmed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from p2p_trainer.config.security import SecurityConfig
from p2p_trainer.net.dht import DHTConfig, start_node
from p2p_trainer.net.keeper import ConnectionKeeper
from p2p_trainer.net.transport import Transport

KEY = "relay-rate"


def _say(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["recv", "send"])
    parser.add_argument("--identity", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--initial-peer", required=True)
    parser.add_argument("--sender", default="")
    parser.add_argument("--target", default="")
    parser.add_argument("--bytes", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep a connection to the sender")
    args = parser.parse_args()
    node = start_node(
        DHTConfig(identity_path=args.identity, host=args.host, initial_peers=(args.initial_peer,))
    )
    transport = Transport(
        node.dht, max_payload_bytes=args.bytes + 1024 if args.bytes else 1 << 28,
        security=SecurityConfig(defences=False), signer=node.signer,
    )  # fmt: skip
    transport.relays = node.bootstrap_ids()
    keeper: ConnectionKeeper | None = None
    try:
        _say({"ready": True, "peer_id": node.peer_id})
        if args.keep:
            sys.stdin.readline()
            keeper = ConnectionKeeper(transport, lambda: [args.sender], period_s=0.5)
            deadline = time.monotonic() + 30
            while args.sender not in keeper.connected and time.monotonic() < deadline:
                time.sleep(0.1)
            _say({"kept": args.sender in keeper.connected, "dialled": args.sender in keeper.dialled})
        if args.role == "recv":
            msg = transport.run(transport.mailbox.get(f"{KEY}|{args.sender}", 120.0), timeout_s=130)
            _say({"bytes": len(msg.payload) if msg else 0, "relayed": transport.relayed_received})
        else:
            payload = os.urandom(args.bytes)
            sys.stdin.readline()
            started = time.monotonic()
            transport.run(transport.send(args.target, {"key": KEY}, payload), timeout_s=120)
            _say({"elapsed_s": time.monotonic() - started, "relayed": transport.relayed_sent})
    finally:
        if keeper is not None:
            keeper.close()
        transport.close()
        node.shutdown()


if __name__ == "__main__":
    main()
