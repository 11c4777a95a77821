"""Unsigned and forged records written straight into a real DHT: our nodes neither store nor return them."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import hivemind
import pytest
from hivemind.dht.routing import DHTID
from nacl.signing import SigningKey

from p2p_trainer.net import records
from p2p_trainer.net.dht import DHTConfig, NetNode, start_node
from p2p_trainer.net.envelope import Signer
from p2p_trainer.processes import Child
from p2p_trainer.run.launcher import bootstrap_argv, read_initial_peers

pytestmark = pytest.mark.timeout(90)

RUN = "signed"


def beat(peer_id: str) -> records.Heartbeat:
    return records.Heartbeat(peer_id, 2, 100, 2.0, 50.0, "0.1.0", records.now())


async def _stored_subkeys(key: str, _dht: hivemind.DHT, node: Any) -> list[str]:
    """The subkeys this node holds in its own storage under `key` (not what a lookup would find)."""
    found = node.protocol.storage.get(DHTID.generate(source=key))
    if found is None or not hasattr(found.value, "items"):
        return []
    return sorted(str(subkey) for subkey, _ in found.value.items())


def stored_subkeys(node: NetNode, key: str) -> list[str]:
    return list(node.dht.run_coroutine(functools.partial(_stored_subkeys, key)))


def returned_subkeys(node: NetNode, key: str) -> list[str]:
    found = node.get(key, latest=True)
    return sorted(found.value) if found is not None and isinstance(found.value, dict) else []


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[tuple[NetNode, NetNode, hivemind.DHT]]:
    first = start_node(DHTConfig(identity_path=str(tmp_path / "a.key"), host="127.0.0.1"))
    nodes, raw = [first], None
    try:
        peers = tuple(first.visible_maddrs())
        nodes.append(start_node(DHTConfig(str(tmp_path / "b.key"), host="127.0.0.1", initial_peers=peers)))
        # a plain hivemind node without our validator: what any attacker can run
        raw = hivemind.DHT(initial_peers=list(peers), host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
        yield nodes[0], nodes[1], raw
    finally:
        if raw is not None:
            raw.shutdown()
        for node in nodes:
            node.shutdown()


def test_unsigned_and_forged_records_are_neither_stored_nor_returned(
    swarm: tuple[NetNode, NetNode, hivemind.DHT],
) -> None:
    a, b, raw = swarm
    key, expiration = records.heartbeat_key(RUN), records.now() + 60
    mallory, phantom = Signer(SigningKey(b"m" * 32)), Signer(SigningKey(b"p" * 32)).peer_id
    assert records.publish_heartbeat(a, RUN, beat(a.peer_id), 60, a.signer)
    # unsigned: a bare heartbeat body for a phantom peer
    # (a store returns the last replica's answer: False, since our nodes refuse it)
    assert not raw.store(key, beat(phantom).encode(), expiration, subkey=phantom)
    # forged: a tombstone for b, signed with the attacker's key
    tombstone = replace(beat(b.peer_id), leaving=True).encode()
    assert not raw.store(
        key, mallory.seal(key, b.peer_id, expiration, tombstone), expiration, subkey=b.peer_id
    )
    # what the attacker may write: its own heartbeat, signed with its own key (the store path works)
    own = mallory.seal(key, mallory.peer_id, expiration, beat(mallory.peer_id).encode())
    assert raw.store(key, own, expiration, subkey=mallory.peer_id)

    expected = sorted([a.peer_id, mallory.peer_id])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(returned_subkeys(n, key) == expected for n in (a, b)):
        time.sleep(0.5)
    for node in (a, b):
        assert set(stored_subkeys(node, key)) <= set(expected)
        assert returned_subkeys(node, key) == expected
        assert sorted(h.peer_id for h in records.list_live_peers(node, RUN)) == expected
    drops = [n.record_drops() for n in (a, b)]
    assert sum(d.get("malformed", 0) for d in drops) >= 1, drops  # the unsigned one
    assert sum(d.get("wrong-owner", 0) for d in drops) >= 1, drops  # the forged tombstone
    # the raw node holds all of them: the refusal is our validators', not the store path's
    found = raw.get(key, latest=True)
    assert found is not None and {phantom, b.peer_id} <= set(found.value)


@pytest.mark.parametrize("verify", ["on", "off"])
def test_bootstrap_node_keeps_unsigned_records_only_with_verification_off(
    tmp_path: Path, verify: str
) -> None:
    """`bootstrap --verify-records off` (for a swarm run with the defences off) stores what any
    plain DHT node writes; by default it refuses it. The writer leaves before a second plain node
    looks, so only the bootstrap node can still hold the record."""
    argv = bootstrap_argv(tmp_path / "boot.key", extra=["--verify-records", verify])
    boot = Child("bootstrap", argv, tmp_path / "boot.log")
    writer = reader = None
    try:
        line = read_initial_peers(boot.proc, tmp_path / "boot.log", 60)
        peers = [word for word in line.split() if word != "--initial-peers"]
        writer = hivemind.DHT(initial_peers=peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
        phantom = Signer(SigningKey(b"p" * 32)).peer_id
        key, expiration = records.heartbeat_key(RUN), records.now() + 60
        writer.store(key, beat(phantom).encode(), expiration, subkey=phantom)
        writer.shutdown()
        writer = None
        reader = hivemind.DHT(initial_peers=peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
        found = reader.get(key, latest=True)
        kept = found is not None and phantom in found.value
        assert kept == (verify == "off"), f"--verify-records {verify}: stored {found}"
    finally:
        for node in (writer, reader):
            if node is not None:
                node.shutdown()
        boot.stop(timeout_s=15)
