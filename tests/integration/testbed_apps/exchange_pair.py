"""One member of a two-peer butterfly exchange, for the byte-counter test; run inside a testbed host.

    python exchange_pair.py --address A --port P [--initial-peer MADDR] --floats N --codec C

Prints one JSON line with its peer id and multiaddrs, then reads the partner's peer id from
stdin, runs one exchange of N values, prints the result's and the transport's byte counts, and
shuts down when stdin closes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import hivemind
import torch

from p2p_trainer.config.security import SecurityConfig
from p2p_trainer.exchange.codecs import Codec
from p2p_trainer.exchange.interface import Ok
from p2p_trainer.net.allreduce import GroupSpec, butterfly_average
from p2p_trainer.net.transport import Transport


def _say(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--initial-peer", action="append", default=[])
    parser.add_argument("--floats", type=int, required=True)
    parser.add_argument("--codec", default="float32")
    args = parser.parse_args()
    dht = hivemind.DHT(
        initial_peers=args.initial_peer,
        host_maddrs=[f"/ip4/0.0.0.0/tcp/{args.port}"],
        announce_maddrs=[f"/ip4/{args.address}/tcp/{args.port}"],
        start=True,
    )
    transport = Transport(
        dht, max_payload_bytes=4 * args.floats + 1024, security=SecurityConfig(defences=False)
    )
    try:
        _say({"peer_id": transport.peer_id, "maddrs": [str(m) for m in dht.get_visible_maddrs()]})
        # counted before the partner is named: its first part can arrive before this peer's
        # own exchange starts, and belongs to the exchange all the same
        before = (transport.bytes_sent, transport.bytes_received)
        partner = sys.stdin.readline().strip()
        codec = Codec(args.codec)
        spec = GroupSpec(
            key="bytes/mix2/0/0/test",
            members=sorted([transport.peer_id, partner]),
            me=transport.peer_id,
            quorum_wait_s=60.0,
            grace_s=60.0,
            result_wait_s=60.0,
            view_prefix="bytes/mix2/0/0/",
            codec=codec,
            result_codec=codec,
        )
        flat = torch.randn(args.floats, generator=torch.Generator().manual_seed(len(partner)))
        late: list[int] = []
        exchange = butterfly_average(
            transport, spec, flat, 1.0, time.monotonic() + 120, on_sent_late=late.append
        )
        res = transport.submit(exchange).result(timeout=150)
        time.sleep(1.0)  # the last sends' acknowledgements
        _say(
            {
                "ok": isinstance(res, Ok),
                "result_sent": (res.bytes_sent if isinstance(res, Ok) else 0) + sum(late),
                "result_received": res.bytes_received if isinstance(res, Ok) else 0,
                "transport_sent": transport.bytes_sent - before[0],
                "transport_received": transport.bytes_received - before[1],
            }
        )
        sys.stdin.read()
    finally:
        transport.close()
        dht.shutdown()


if __name__ == "__main__":
    main()
