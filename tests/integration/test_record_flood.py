"""A flood of validly signed records under new keys, from one identity, into a real DHT node.

Keys are free to make up (a run name is any string), so signatures alone do not stop one peer
from filling every node's record storage. The attacker is a plain hivemind node (any software can speak the DHT protocol). The victim's
validator holds at most
`MAX_RECORDS_PER_SIGNER` records per signer; the test measures the memory of the victim's DHT
process and its p2pd (their resident set from /proc) and their open descriptors, with the bound
and, to show the flood is real, without it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import hivemind
import pytest
from nacl.signing import SigningKey

from p2p_trainer import processes
from p2p_trainer.net import records
from p2p_trainer.net.dht import DHTConfig, NetNode, start_node
from p2p_trainer.net.envelope import Signer
from p2p_trainer.net.record_validator import MAX_RECORDS_PER_SIGNER

pytestmark = pytest.mark.timeout(240)

FLOOD = 6000
"""Records the attacker stores, each under a new key."""
PAD = 3500
"""Characters of padding in each record's body (a body holds at most `envelope.MAX_BODY_BYTES`)."""
BATCH = 100
SWARM = "run"
"""The victim's swarm: the bound never refuses its shared records (`dht.shared_keys`)."""


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _sample(node: NetNode) -> dict[str, tuple[float, int]]:
    pids = {"dht": node.dht.pid, **{f"p2pd{i}": p for i, p in enumerate(node.daemon_pids)}}
    return {name: (_rss_mib(pid), _fds(pid)) for name, pid in pids.items()}


@contextlib.contextmanager
def _victim(tmp_path: Path, bound: int | None) -> Iterator[NetNode]:
    with contextlib.ExitStack() as stack:
        victim = start_node(
            DHTConfig(str(tmp_path / "victim.key"), host="127.0.0.1", swarm=SWARM, records_per_signer=bound)
        )
        stack.callback(victim.shutdown)
        yield victim


@contextlib.contextmanager
def _attacker(victim: NetNode) -> Iterator[hivemind.DHT]:
    """A plain hivemind node, no validator: it stores whatever it likes. Its p2pd is tracked by
    PID and stopped even if hivemind's shutdown leaves it."""
    dht = hivemind.DHT(
        initial_peers=victim.visible_maddrs(), host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True
    )
    daemons = processes.find_daemons(dht.pid)
    try:
        yield dht
    finally:
        dht.shutdown()
        # stopped if still running (checked by its command line, in case the PID was reused);
        # its socket files removed
        processes.cleanup_daemons(daemons, grace_s=2.0)


def _flood(attacker: hivemind.DHT, signer: Signer, runs: range) -> float:
    """Store one run definition signed by `signer` per run of `runs`, each under that run's key
    (a new key each); seconds taken."""
    body = records.RunDefinition({"seed": 0, "pad": "x" * PAD}).encode()
    t0 = time.monotonic()
    for start in range(runs.start, runs.stop, BATCH):
        futures = []
        for i in range(start, min(start + BATCH, runs.stop)):
            key, expiration = records.run_definition_key(f"flood-{i}"), records.now() + 600
            sealed = signer.seal(key, signer.peer_id, expiration, body)
            futures.append(attacker.store(key, sealed, expiration, subkey=signer.peer_id, return_future=True))
        for future in futures:
            future.result(timeout=60)
    return time.monotonic() - t0


@pytest.mark.parametrize("bound", [MAX_RECORDS_PER_SIGNER, None], ids=["bounded", "unbounded"])
def test_one_identity_cannot_fill_a_nodes_record_storage(tmp_path: Path, bound: int | None) -> None:
    """Memory is sampled before the flood, after its first half and after the second: what a
    process holds per sender grows with the second half; what it needs to carry traffic at all
    (p2pd's buffers and heap) does not."""
    signer, half = Signer(SigningKey(b"f" * 32)), FLOOD // 2
    with _victim(tmp_path, bound) as victim, _attacker(victim) as attacker:
        before = _sample(victim)
        took = _flood(attacker, signer, range(half))
        time.sleep(1.0)  # the last replies are out before the sample
        middle = _sample(victim)
        took += _flood(attacker, signer, range(half, FLOOD))
        time.sleep(1.0)
        after = _sample(victim)
        grew = {name: round(after[name][0] - before[name][0], 1) for name in before}
        second = {name: round(after[name][0] - middle[name][0], 1) for name in before}
        fds = {name: after[name][1] - before[name][1] for name in before}
        drops = victim.record_drops().get("quota", 0)
        print(
            f"\n{bound=}: {FLOOD} records ({FLOOD * PAD / 2**20:.1f} MiB of padding) in {took:.1f} s;"
            f" RSS growth MiB {grew}, in the second half {second}; descriptors {fds}; quota drops {drops}"
        )
        half_mib = half * PAD / 2**20
        if bound is None:
            assert second["dht"] > 0.6 * half_mib, "the flood did not reach the victim's storage"
            return
        assert drops >= FLOOD - bound, drops
        assert grew["dht"] < 0.1 * half_mib, grew  # the bound's records and allocator noise
        assert all(g < 0.5 * half_mib for g in second.values()), second
        assert all(f < 16 for f in fds.values()), fds
        # the victim still stores and serves everyone else's records
        honest = victim.signer
        beat = records.Heartbeat(honest.peer_id, 1, 0, None, 1.0, "0.1.0", records.now())
        assert records.publish_heartbeat(victim, SWARM, beat, 60.0, honest)
        # and the attacker's own heartbeat in the victim's swarm, though its slots are full: a
        # refused entry would make the victim refuse the whole heartbeats record read from a node
        # that holds it, every honest peer's entry with it
        own = records.Heartbeat(signer.peer_id, 1, 0, None, 1.0, "0.1.0", records.now())
        key, expiration = records.heartbeat_key(SWARM), records.now() + 60
        sealed = signer.seal(key, signer.peer_id, expiration, own.encode())
        attacker.store(key, sealed, expiration, subkey=signer.peer_id)
        read = sorted(b.peer_id for b, _ in records.read_heartbeats(victim, SWARM))
        assert read == sorted([honest.peer_id, signer.peer_id]), read
        # the attacker's records past its bound are not served
        last = victim.get(records.run_definition_key(f"flood-{FLOOD - 1}"), latest=True)
        assert last is None or not getattr(last, "value", None), last
