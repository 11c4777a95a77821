"""Endless streams over real p2p daemons: a sender that keeps hundreds open to a peer has all
but its bound refused at the peer's stream gate, the peer holds a bounded number of connections,
and an honest sender's messages still arrive. (With the defences off, the same attack holds a
descriptor per stream: tests/integration/test_attacks.py, `streams:200`.)

The descriptors are counted from the kernel's table of Unix sockets (/proc/net/unix): every
connection p2pd hands this process for the exchange protocol is a socket bound to the gate's path,
so the count does not rely on the gate's own bookkeeping. The victim's event loop is stalled now
and then, as a busy training process's is, so the attacker's reopened streams queue and arrive
together: the burst that an accept loop without a bound takes whole.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from p2p_trainer.config import SecurityConfig
from p2p_trainer.lab.adversary.streams import _open
from p2p_trainer.net.dht import NetNode
from p2p_trainer.net.stream_gate import MAX_PENDING
from p2p_trainer.net.transport import Transport
from tests.conftest import wait_until
from tests.integration.loopback_hosts import loopback_hosts
from tests.integration.unix_sockets import sampling

pytestmark = pytest.mark.timeout(180)

ENDLESS = 200
"""Streams the attacker keeps open to the victim, reopening each one the victim closes."""
ATTACK_S = 8.0
STALL_S = 0.5


@pytest.fixture()
def hosts(tmp_path: Path) -> Iterator[list[tuple[NetNode, Transport]]]:
    with loopback_hosts(tmp_path, 3) as started:
        yield started


async def _attack(attacker: Transport, victim: str, stop: threading.Event) -> int:
    """Keep ENDLESS streams open to `victim` until `stop`; returns how many were opened."""
    held: list[Any] = []
    opened = 0
    while not stop.is_set():
        held = [(r, w) for r, w in held if not (r.at_eof() or w.is_closing())]
        results = await asyncio.gather(
            *(asyncio.wait_for(_open(attacker, victim), 5.0) for _ in range(ENDLESS - len(held))),
            return_exceptions=True,
        )
        fresh = [s for s in results if not isinstance(s, BaseException)]
        opened += len(fresh)
        held += fresh
        await asyncio.sleep(0.05)
    for _, writer in held:
        writer.close()
    return opened


async def _stall(seconds: float) -> None:
    """Block the victim's event loop, as a busy training process does now and then: the
    attacker's streams queue meanwhile, and reach the gate together when it runs again."""
    time.sleep(seconds)


def test_endless_streams_hold_a_bounded_number_of_descriptors(
    hosts: list[tuple[NetNode, Transport]], tmp_path: Path
) -> None:
    (victim_node, victim), (_, attacker), (honest_node, honest) = hosts
    gate_path = victim.gate.path
    # the honest host reaches the victim before the attack starts
    honest.run(honest.send(victim_node.peer_id, {"key": "warm"}), timeout_s=30)
    victim.run(victim.mailbox.get(f"warm|{honest_node.peer_id}", 30.0), timeout_s=35)

    stop = threading.Event()
    attack = attacker.submit(_attack(attacker, victim_node.peer_id, stop))
    delivered = 0
    with sampling(gate_path, tmp_path / "peaks.txt", ATTACK_S + 30) as peaks:
        try:
            start = time.monotonic()
            while time.monotonic() - start < ATTACK_S:
                victim.run(_stall(STALL_S), timeout_s=10)
                time.sleep(0.5)  # the queued streams arrive
                key = f"m{delivered}"
                honest.run(honest.send(victim_node.peer_id, {"key": key}, b"x" * 1000), timeout_s=20)
                msg = victim.run(victim.mailbox.get(f"{key}|{honest_node.peer_id}", 20.0), timeout_s=25)
                assert msg is not None and bytes(msg.payload) == b"x" * 1000
                delivered += 1
        finally:
            stop.set()
        opened = attack.result(timeout=30)
        queued, peak = peaks()

    bound = SecurityConfig().sender_open_streams
    print(f"\nopened {opened} endless streams; {queued} queued at most, {peak} held; {delivered} delivered")
    assert opened > 2 * ENDLESS, f"the attack never kept its streams up ({opened} opened)"
    assert queued > MAX_PENDING, f"the stalls never queued a burst ({queued}): the test shows nothing"
    # the pending accepts, the attacker's bound, the honest sender's stream
    assert peak <= MAX_PENDING + bound + 1, f"{peak} connections held at once for one attacker"
    assert victim.gate.refused > ENDLESS


def test_a_full_gate_still_takes_the_live_views_members(hosts: list[tuple[NetNode, Transport]]) -> None:
    """Many identities, each within its bound, can fill the gate's total; a sender outside the live
    view is then refused, a member of it is still taken."""
    (victim_node, victim), (attacker_node, attacker), (honest_node, honest) = hosts
    victim.accept_from = lambda sender: sender == honest_node.peer_id  # the attacker: not in the view
    victim.view_wait_s = 30.0  # its streams are held, waiting for the view, the whole test
    victim.gate.max_open = 4
    stop = threading.Event()
    attack = attacker.submit(_attack(attacker, victim_node.peer_id, stop))
    try:
        assert wait_until(lambda: victim.gate.refused > 50, timeout_s=30, poll_s=0.1), victim.gate.refused
        honest.run(honest.send(victim_node.peer_id, {"key": "still"}, b"ok"), timeout_s=20)
        msg = victim.run(victim.mailbox.get(f"still|{honest_node.peer_id}", 20.0), timeout_s=25)
        assert msg is not None and bytes(msg.payload) == b"ok"
    finally:
        stop.set()
        attack.result(timeout=30)
    assert attacker_node.peer_id not in victim.heard_within(60.0)
