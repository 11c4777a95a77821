"""Pieces of the NAT support that need no network: relayed-message signatures, the reachability
advice, multiaddr parsing, the dial-back request check, and NAT layouts in the testbed config."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import msgpack
import nacl.signing
import pytest
from hivemind.p2p import P2P

from bench.fuzz.fakes import Wire
from p2p_trainer.lab.testbed import HostSpec, TestbedConfig, TestbedConfigError
from p2p_trainer.lab.testbed import nat as tb_nat
from p2p_trainer.net import message_relay as relay
from p2p_trainer.net import reach
from p2p_trainer.net.envelope import Signer

TARGET = "12D3KooWQnzt8fuWAkZdLjt9HiEYGPEP1oSy6yFy4TSk4nRr1ZUr"


def _signer() -> Signer:
    return Signer(nacl.signing.SigningKey.generate())


def test_relayed_message_names_its_signer_and_nothing_can_be_changed() -> None:
    alice, mallory = _signer(), _signer()
    meta = relay.seal_meta(alice, TARGET, b"header", b"payload")
    assert relay.claimed_sender(meta) == alice.peer_id
    assert relay.verified_sender(meta, TARGET, b"header", b"payload", alice.peer_id) == alice.peer_id
    for target, header, payload in ((mallory.peer_id, b"header", b"payload"), (TARGET, b"other", b"payload"),
                                    (TARGET, b"header", b"changed")):  # fmt: skip
        with pytest.raises(ValueError, match="bad signature"):  # redirected, or altered on the way
            relay.verified_sender(meta, target, header, payload, alice.peer_id)
    with pytest.raises(ValueError, match="not its claimed sender"):
        relay.verified_sender(meta, TARGET, b"header", b"payload", mallory.peer_id)
    forged = relay.seal_meta(mallory, TARGET, b"header", b"payload")  # a relay signing as itself
    assert relay.claimed_sender(forged) == mallory.peer_id != alice.peer_id
    for junk in (b"", b"\x81\xa2pk\x01", b"\xc1" * 10):
        with pytest.raises(ValueError, match="unreadable"):
            relay.claimed_sender(junk)


def test_multiaddr_parts() -> None:
    assert reach.ip_of("/ip4/10.1.2.3/tcp/5/p2p/" + TARGET) == "10.1.2.3"
    assert reach.ip_of("/ip6/::1/tcp/5") == "::1"
    assert reach.ip_of(f"/ip4/10.1.2.3/tcp/5/p2p/{TARGET}/p2p-circuit") is None
    assert reach.ip_of("garbage") is None
    assert reach.port_of("/ip4/10.1.2.3/tcp/31337") == 31337 and reach.port_of("/ip4/10.1.2.3") is None


def test_advice_says_what_was_found_and_what_to_do() -> None:
    ok = reach.Reachability(True, 4000, ("203.0.113.5",), "203.0.113.5", "x" * 8 + "CHECKER1")
    assert reach.advice(ok, "auto") == [
        "reachability: bootstrap node CHECKER1 dialled 203.0.113.5:4000: peers reach this node directly"
    ]
    natted = reach.Reachability(False, 4000, ("192.168.1.7",), "198.51.100.9", "CHECKER1", "refused")
    lines = reach.advice(natted, "auto")
    assert natted.behind_nat and len(lines) == 3
    assert "behind NAT: bootstrap node CHECKER1 sees it as 198.51.100.9" in lines[0] and "refused" in lines[0]
    assert "through the bootstrap nodes' relay" in lines[1]
    assert "forward TCP port 4000" in lines[2] and "--port 4000 --announce-host <public ip>" in lines[2]
    public = reach.Reachability(False, 4000, ("10.0.0.2",), "8.8.4.4", "CHECKER1", "timed out")
    assert "--announce-host 8.8.4.4" in reach.advice(public, "auto")[2]
    assert "with --relay off" in reach.advice(natted, "off")[1]
    unknown = reach.Reachability(None, 4000, (), detail="no dial-back answer (no bootstrap node to ask)")
    assert reach.advice(unknown, "auto")[0].startswith("reachability: not checked: no dial-back answer")


def _dialback(port: object, monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[str, int]], Wire]:
    """Have a checker serve one dial-back request naming `port` over a direct connection; returns
    the dials it tried (none is made: `_dial` is replaced) and its answer."""
    dialled: list[tuple[str, int]] = []

    async def dial(ip: str, port: int) -> str:
        dialled.append((ip, port))
        return ""

    monkeypatch.setattr(reach, "_dial", dial)

    async def serve() -> Wire:
        request = msgpack.packb({"port": port})
        reader = asyncio.StreamReader()
        reader.feed_data(len(request).to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER) + request)
        reader.feed_eof()
        writer = Wire()
        info = SimpleNamespace(addr="/ip4/192.0.2.7/tcp/4001")
        await reach.serve_dialback(info, reader, writer)  # type: ignore[arg-type]
        return writer

    return dialled, asyncio.run(serve())


def test_a_dialback_request_with_a_port_is_dialled_and_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    dialled, writer = _dialback(4001, monkeypatch)
    assert dialled == [("192.0.2.7", 4001)] and writer.closed
    reply = msgpack.unpackb(bytes(writer.written[P2P.HEADER_LEN :]))
    assert reply == {"seen": "/ip4/192.0.2.7/tcp/4001", "ip": "192.0.2.7", "port": 4001, "error": ""}


@pytest.mark.parametrize("port", [True, False, "4001", 4001.0, 0, 65536])
def test_a_dialback_request_whose_port_is_no_port_number_is_refused_without_a_dial(
    port: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    dialled, writer = _dialback(port, monkeypatch)  # a bool too, though Python takes it for an int
    assert dialled == [] and writer.written == b"" and writer.closed, (dialled, bytes(writer.written))


def test_nat_layouts_are_validated() -> None:
    router = HostSpec("rtr", None, None, None, nat=True)
    lan = HostSpec("lan", None, None, None, behind="rtr")
    TestbedConfig(hosts=(router, lan)).validate()
    assert (
        TestbedConfig.lan_address(0, 0) == "192.168.100.1"
        and TestbedConfig.lan_address(2, 1) == "192.168.102.2"
    )
    bad = [
        ((lan, router), "must name a host with nat=True listed before it"),
        ((HostSpec("rtr", None, None, None), lan), "must name a host with nat=True"),
        ((router, HostSpec("lan", behind="rtr", delay_ms=5.0)), "neither a router nor delayed"),
    ]
    for hosts, message in bad:
        with pytest.raises(TestbedConfigError, match=message):
            TestbedConfig(hosts=hosts).validate()


def test_without_iptables_nat_tests_skip_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tb_nat.shutil, "which", lambda _tool: None)
    assert tb_nat.support_problem() == "`iptables` is not installed (Debian: apt-get install iptables)"
