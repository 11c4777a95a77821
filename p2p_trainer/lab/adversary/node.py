"""The separate attacker's DHT node: plain hivemind, none of the checks our nodes install.

A real attacker runs whatever code it likes; a plain `hivemind.DHT` with the swarm's bootstrap
nodes as initial peers is the least it needs to store records in the swarm's DHT and to open
streams to its peers (through a `Transport` on the node's p2p daemon).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import hivemind

from p2p_trainer.net.addresses import host_maddr
from p2p_trainer.net.envelope import Signer
from p2p_trainer.net.identity import decode_private_key, load_or_create_identity

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def attacker_dht(
    initial_peers: list[str], identity: Path | None = None, host: str = "127.0.0.1"
) -> Iterator[hivemind.DHT]:
    """A started DHT node joined to `initial_peers` (under `identity`'s key if given, created on
    first use); shut down on leaving the block."""
    path = None if identity is None else str(load_or_create_identity(identity).path)
    dht = hivemind.DHT(
        initial_peers=initial_peers,
        host_maddrs=[host_maddr(host, 0)],
        identity_path=path,
        check_if_identity_free=False,  # hivemind's check assumes RSA keys
        start=True,
    )
    logger.warning("adversary: attacker node %s is up", dht.peer_id.to_base58())
    try:
        yield dht
    finally:
        dht.shutdown()


def every(period_s: float, stop: threading.Event) -> Iterator[int]:
    """0, 1, 2, ... once per `period_s` until `stop` is set."""
    tick = 0
    while not stop.is_set():
        yield tick
        tick += 1
        stop.wait(period_s)


def identity_signer(identity: Path) -> Signer:
    """A signer with the key of the identity file `identity` (the attacker's own node key)."""
    path = load_or_create_identity(identity).path
    return Signer(decode_private_key(path.read_bytes(), path))
