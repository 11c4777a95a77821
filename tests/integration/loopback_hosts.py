"""Hosts on loopback for tests of one protocol over real p2p daemons, without a swarm around it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from p2p_trainer.config import SecurityConfig
from p2p_trainer.net.dht import DHTConfig, NetNode, start_node
from p2p_trainer.net.transport import Transport


@contextlib.contextmanager
def loopback_hosts(tmp_path: Path, n: int) -> Iterator[list[tuple[NetNode, Transport]]]:
    """`n` hosts, each a DHT node with its p2p daemon and a transport (the defences on), the first
    one the others' initial peer; everything started is stopped, in reverse, even when a later
    start or stop fails."""
    with contextlib.ExitStack() as stack:
        started: list[tuple[NetNode, Transport]] = []
        for i in range(n):
            peers = tuple(started[0][0].visible_maddrs()) if started else ()
            node = start_node(DHTConfig(str(tmp_path / f"h{i}.key"), host="127.0.0.1", initial_peers=peers))
            stack.callback(node.shutdown)
            transport = Transport(node.dht, 1 << 21, security=SecurityConfig(), signer=node.signer)
            stack.callback(transport.close)
            started.append((node, transport))
        yield started
