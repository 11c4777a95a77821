"""Probation over real p2p daemons: an open swarm's view shows a phantom's signed heartbeat to
nobody, and a peer that runs answers its probe, directly and through a relay."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from nacl.signing import SigningKey

from p2p_trainer.config import SecurityConfig
from p2p_trainer.net import message_relay, records
from p2p_trainer.net.dht import DHTConfig, NetNode, start_node
from p2p_trainer.net.envelope import Signer
from p2p_trainer.net.swarm_view import SwarmView
from p2p_trainer.net.transport import Transport
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(120)

RUN = "probation"


@dataclass
class Host:
    node: NetNode
    transport: Transport


def _beat(peer_id: str, rnd: int = 3) -> records.Heartbeat:
    return records.Heartbeat(peer_id, rnd, 100, 2.0, 50.0, "0.1.0", records.now())


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Host]]:
    tmp_path = tmp_path_factory.mktemp("hosts")
    started: list[Host] = []
    try:
        first = start_node(DHTConfig(identity_path=str(tmp_path / "h0.key"), host="127.0.0.1"))
        started.append(Host(first, Transport(first.dht, 1024, signer=first.signer)))
        peers = tuple(first.visible_maddrs())
        for i in (1, 2):
            node = start_node(DHTConfig(str(tmp_path / f"h{i}.key"), host="127.0.0.1", initial_peers=peers))
            started.append(Host(node, Transport(node.dht, 1024, signer=node.signer)))
        yield started
    finally:
        for host in started:
            host.transport.close()
            host.node.shutdown()


def test_an_open_swarms_view_shows_peers_that_answer_and_not_phantoms(hosts: list[Host]) -> None:
    a, b, _ = hosts
    phantoms = [Signer(SigningKey(bytes([90 + i]) * 32)) for i in range(3)]
    assert records.publish_heartbeat(b.node, RUN, _beat(b.node.peer_id), 60, b.node.signer)
    for phantom in phantoms:  # validly signed by keys nobody runs a host with
        assert records.publish_heartbeat(a.node, RUN, _beat(phantom.peer_id), 60, phantom)
    phantom_ids = {p.peer_id for p in phantoms}

    unprobed = SwarmView(a.node, RUN, period_s=60.0, ttl_s=30.0, security=SecurityConfig(defences=False))
    try:  # what every view showed before: whoever signed a heartbeat
        assert phantom_ids <= set(unprobed.live_peers())
    finally:
        unprobed.close()

    view = SwarmView(a.node, RUN, period_s=60.0, ttl_s=30.0, security=SecurityConfig())
    try:
        view.probe_with(a.transport.probe, a.transport.submit)  # waits for the first answers
        assert set(view.live_peers()) == {a.node.peer_id, b.node.peer_id}
        assert {h.peer_id for h in view.heartbeats()} == {a.node.peer_id, b.node.peer_id}
        prober = view._prober
        assert prober is not None
        # the view waits for the live peers' answers, not for every phantom's probe to time out
        assert wait_until(lambda: prober.probation.failed >= len(phantoms), timeout_s=20, poll_s=0.2), (
            prober.probation.failed
        )
        # b saw a's probe arrive: evidence for b's own view that a runs (libp2p authenticated it).
        # a's probe returns once its daemon opened the stream; b's daemon hands the stream to b's
        # handler a moment later, so on a busy machine the hello lands after the probe's answer.
        assert wait_until(lambda: a.node.peer_id in b.transport.hellos_within(60.0), timeout_s=10, poll_s=0.1)
        assert not phantom_ids & b.transport.hellos_within(60.0)
    finally:
        view.close()


def test_a_closed_swarm_or_undefended_view_runs_no_probes(hosts: list[Host]) -> None:
    a = hosts[0]
    for sec in (
        SecurityConfig(defences=False),
        SecurityConfig(admission="allow-list", allow=(a.node.peer_id,)),
    ):
        view = SwarmView(a.node, RUN, period_s=60.0, ttl_s=30.0, security=sec)
        try:
            view.probe_with(a.transport.probe, a.transport.submit)
            assert view._prober is None
        finally:
            view.close()


def test_a_relay_answers_whether_its_target_runs(hosts: list[Host]) -> None:
    relay_host, target, asker = hosts
    service = message_relay.RelayService(relay_host.transport.p2p)
    relay_host.transport.run(service.start(relay_host.transport.gate), timeout_s=30)
    relay_id, p2p = relay_host.node.peer_id, asker.transport.p2p
    phantom = Signer(SigningKey(bytes([99]) * 32)).peer_id
    assert asker.transport.run(message_relay.probe_relayed(p2p, relay_id, target.node.peer_id), timeout_s=30)
    assert not asker.transport.run(message_relay.probe_relayed(p2p, relay_id, phantom), timeout_s=30)
    assert service.probes == 1 and service.forwarded == 0
    # the transport falls back on its relays when it cannot open a stream itself
    asker.transport.relays = [relay_id]
    try:
        assert asker.transport.run(asker.transport.probe(target.node.peer_id), timeout_s=30)
        assert not asker.transport.run(asker.transport.probe(phantom), timeout_s=30)
    finally:
        asker.transport.relays = []
