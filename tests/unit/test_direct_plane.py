"""The direct data plane on real loopback sockets: who a message is from, and what is refused."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import nacl.signing
import pytest
import uvloop

from p2p_trainer.net import direct
from p2p_trainer.net.channel import Ephemeral
from p2p_trainer.net.data_plane import data_host
from p2p_trainer.net.direct import DirectError, DirectPlane, Receiver, check_address, format_address
from p2p_trainer.net.envelope import Signer
from p2p_trainer.net.records import Heartbeat, RecordError
from p2p_trainer.net.transport import DIRECT_BACKOFF_MAX_S, RELAYED_FOR_S, DirectBackoff


class Inbox:
    def __init__(self) -> None:
        self.got: list[tuple[str, bytes, bytes | memoryview]] = []
        self.admit_ok = True
        self.accepts_ok = True

    async def admit(self, _sender: str) -> bool:
        return self.admit_ok

    def receiver(self, max_payload: int = 1 << 20, conns: int = 2) -> Receiver:
        return Receiver(
            admit=self.admit,
            accepts=lambda _s: self.accepts_ok,
            deliver=lambda s, h, p: self.got.append((s, h, p)),
            max_header_bytes=1024,
            max_payload_bytes=max_payload,
            read_timeout_s=2.0,
            max_conns_per_sender=conns,
        )


def plane(inbox: Inbox, **kw: Any) -> DirectPlane:
    return DirectPlane(Signer(nacl.signing.SigningKey.generate()), inbox.receiver(**kw))


def run(test: Callable[[], Awaitable[None]]) -> None:
    # the transport's loop: uvloop's sockets and protocols differ from asyncio's in details
    uvloop.run(asyncio.wait_for(test(), 30))


def test_message_arrives_from_the_key_that_dialled() -> None:
    async def go() -> None:
        a_in, b_in = Inbox(), Inbox()
        a, b = plane(a_in), plane(b_in)
        port = await b.listen("127.0.0.1")
        payload = os.urandom(300_000)
        for i in range(3):  # the second and third reuse the first connection
            assert await a.send(b.peer_id, f"127.0.0.1:{port}", b"head%d" % i, payload)
        assert [(s, h) for s, h, _ in b_in.got] == [
            (a.peer_id, b"head0"),
            (a.peer_id, b"head1"),
            (a.peer_id, b"head2"),
        ]
        assert all(p == payload for _, _, p in b_in.got)
        assert len(a._pools[b.peer_id].idle) == 1
        await a.close()
        await b.close()

    run(go)


def test_a_listener_with_another_key_is_not_taken_for_the_peer() -> None:
    async def go() -> None:
        b_in = Inbox()
        a, b, c = plane(Inbox()), plane(b_in), plane(Inbox())
        port = await b.listen("127.0.0.1")
        with pytest.raises(DirectError, match="answers as another peer"):
            await a.send(c.peer_id, f"127.0.0.1:{port}", b"h", b"x")
        assert b_in.got == []
        await a.close()
        await b.close()

    run(go)


def test_refusals_closed_port_and_left_view() -> None:
    async def go() -> None:
        b_in = Inbox()
        a, b = plane(Inbox()), plane(b_in)
        port = await b.listen("127.0.0.1")
        b_in.admit_ok = False
        with pytest.raises(DirectError, match="refused"):
            await a.send(b.peer_id, f"127.0.0.1:{port}", b"h", b"x")
        b_in.admit_ok = True
        b_in.accepts_ok = False  # in view when it connected, out of it by the message
        assert await a.send(b.peer_id, f"127.0.0.1:{port}", b"h", b"x") is False
        assert b_in.got == []
        await b.close()
        with pytest.raises(DirectError, match="cannot connect"):
            await plane(Inbox()).send(b.peer_id, f"127.0.0.1:{port}", b"h", b"x")
        await a.close()

    run(go)


async def _raw_hello(
    port: int, key: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, dict[str, Any]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    hello = msgpack.packb({"pk": key, "n": os.urandom(32), "x": Ephemeral().public})
    writer.write(len(hello).to_bytes(8, "big") + hello)
    await writer.drain()
    answer = await direct.read_frame(reader, 512)
    return reader, writer, msgpack.unpackb(answer)


def test_someone_elses_public_key_without_its_signature_delivers_nothing() -> None:
    async def go() -> None:
        b_in = Inbox()
        victim, b = plane(Inbox()), plane(b_in)
        port = await b.listen("127.0.0.1")
        reader, writer, answer = await _raw_hello(port, victim._public)
        assert answer["pk"] == b._public
        forged = msgpack.packb({"s": os.urandom(64)})  # cannot sign for the victim's key
        writer.write(len(forged).to_bytes(8, "big") + forged)
        await writer.drain()
        assert await reader.read(1) == b""  # closed without a verdict
        assert b_in.got == [] and b.refused == 1
        writer.close()
        await b.close()

    run(go)


def test_connections_per_sender_and_unauthenticated_ones_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct, "MAX_HANDSHAKES", 4)
    monkeypatch.setattr(direct, "HANDSHAKE_TIMEOUT_S", 0.5)

    async def go() -> None:
        b_in = Inbox()
        b = plane(b_in, conns=2)
        port = await b.listen("127.0.0.1")
        a = plane(Inbox(), conns=3)  # asks for more connections than the listener allows
        sends = [a.send(b.peer_id, f"127.0.0.1:{port}", b"h%d" % i, os.urandom(800_000)) for i in range(3)]
        outcomes = await asyncio.gather(*sends, return_exceptions=True)
        assert sum(o is True for o in outcomes) == 2
        assert sum(isinstance(o, DirectError) for o in outcomes) == 1
        # silent connections: 4 may wait in the handshake, the 5th is closed at once
        silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(5)]
        assert await asyncio.wait_for(silent[4][0].read(1), 0.4) == b""
        for reader, _ in silent[:4]:  # and the others once their handshake time is up
            assert await asyncio.wait_for(reader.read(1), 2.0) == b""
        for _, writer in silent:
            writer.close()
        await a.close()
        await b.close()

    run(go)


def test_one_address_cannot_hold_every_handshake_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct, "MAX_HANDSHAKES", 6)
    monkeypatch.setattr(direct, "MAX_HANDSHAKES_PER_IP", 3)
    monkeypatch.setattr(direct, "HANDSHAKE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(direct, "LOOPBACK_EXEMPT", False)  # the test's only address is loopback

    async def go() -> None:
        b_in = Inbox()
        b = plane(b_in)
        port = await b.listen("127.0.0.1")
        # 3 silent connections from one address wait in the handshake; the 4th is closed at once
        silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        assert await asyncio.wait_for(silent[3][0].read(1), 0.5) == b""
        assert b.refused == 1
        # while they wait, the same address's further peers are refused, not queued
        with pytest.raises(DirectError):
            await plane(Inbox()).send(b.peer_id, f"127.0.0.1:{port}", b"h", b"x")
        for _, writer in silent:
            writer.close()
        await asyncio.sleep(1.2)  # closed, or their handshake time up: the slots are free again
        assert await plane(Inbox()).send(b.peer_id, f"127.0.0.1:{port}", b"h", b"x")
        assert len(b_in.got) == 1
        await b.close()

    run(go)


def test_a_refused_dialler_is_told_why() -> None:
    async def go() -> None:
        b_in = Inbox()
        b = plane(b_in, conns=1)
        port = await b.listen("127.0.0.1")
        a = plane(Inbox(), conns=2)
        # two sends at once need two connections; the listener takes one per sender
        outcomes = await asyncio.gather(
            *(a.send(b.peer_id, f"127.0.0.1:{port}", b"h", os.urandom(800_000)) for _ in range(2)),
            return_exceptions=True,
        )
        busy = [o for o in outcomes if isinstance(o, DirectError)]
        assert len(busy) == 1 and "limit of connections" in str(busy[0])
        b_in.admit_ok = False
        with pytest.raises(DirectError, match="not admitted"):
            await plane(Inbox()).send(b.peer_id, f"127.0.0.1:{port}", b"h", b"x")
        await a.close()
        await b.close()

    run(go)


def test_an_oversized_payload_is_dropped_with_its_connection() -> None:
    async def go() -> None:
        b_in = Inbox()
        a, b = plane(Inbox()), plane(b_in, max_payload=1000)
        port = await b.listen("127.0.0.1")
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await a.send(b.peer_id, f"127.0.0.1:{port}", b"h", b"x" * 5000)
        assert b_in.got == []
        assert await a.send(b.peer_id, f"127.0.0.1:{port}", b"h", b"x" * 1000)  # a new connection works
        await a.close()
        await b.close()

    run(go)


@pytest.mark.parametrize("text", ["1.2.3.4:5", "[::1]:31337", "127.0.0.1:65535"])
def test_addresses_taken(text: str) -> None:
    host, port = check_address(text)
    assert format_address(host, port) == text


@pytest.mark.parametrize(
    "text",
    ["example.com:80", "0.0.0.0:5", "1.2.3.4", "1.2.3.4:0", "1.2.3.4:70000", "224.0.0.1:5", "1" * 70 + ":5"],
)
def test_addresses_refused(text: str) -> None:
    with pytest.raises(ValueError):
        check_address(text)


def test_a_heartbeat_with_a_bad_data_address_is_refused() -> None:
    beat = Heartbeat("p", 1, 0, None, 0.0, "v", 1.0, data_address="10.0.0.1:4000")
    assert Heartbeat.decode(beat.encode()).data_address == "10.0.0.1:4000"
    forged = Heartbeat("p", 1, 0, None, 0.0, "v", 1.0, data_address="evil.example:4000")
    with pytest.raises(RecordError, match="data_address"):
        Heartbeat.decode(forged.encode())


def test_a_listener_with_the_peers_public_key_but_not_its_signature_is_refused() -> None:
    async def go() -> None:
        victim = plane(Inbox())

        async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await direct.read_frame(reader, 512)
            fake = {"pk": victim._public, "n": os.urandom(32), "x": Ephemeral().public, "s": os.urandom(64)}
            raw = msgpack.packb(fake)
            writer.write(len(raw).to_bytes(8, "big") + raw)
            await writer.drain()
            await reader.read()  # nothing else must come: the dialler gives up

        server = await asyncio.start_server(impostor, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        a = plane(Inbox())
        with pytest.raises(DirectError, match="bad handshake signature"):
            await a.send(victim.peer_id, f"127.0.0.1:{port}", b"h", b"secret")
        server.close()
        await a.close()

    run(go)


def test_a_byte_changed_on_the_path_is_not_merged_and_nothing_is_readable() -> None:
    """A relay between the two ends that sees every byte: the payload never shows in clear, and a
    flipped bit fails the receiver's tag check, which drops that connection; the message then goes
    again, whole, over a new one."""

    async def go() -> None:
        b_in = Inbox()
        a, b = plane(Inbox()), plane(b_in)
        port = await b.listen("127.0.0.1")
        seen = bytearray()
        flip_after: list[int] = []
        relayed: list[int] = []

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, tamper: bool) -> None:
            while chunk := await src.read(65536):
                seen.extend(chunk)
                if tamper and flip_after and len(seen) > flip_after[0]:
                    chunk = chunk[:-1] + bytes([chunk[-1] ^ 1])
                    flip_after.clear()
                dst.write(chunk)
                await dst.drain()
            dst.close()

        async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            relayed.append(1)
            up_r, up_w = await asyncio.open_connection("127.0.0.1", port)
            await asyncio.gather(pipe(reader, up_w, True), pipe(up_r, writer, False), return_exceptions=True)

        server = await asyncio.start_server(relay, "127.0.0.1", 0)
        via = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        secret = b"gradient-bytes-" * 1000
        assert await a.send(b.peer_id, via, b"h1", secret)
        assert b"gradient-bytes-" not in bytes(seen)
        flip_after.append(len(seen) + 100)  # one bit of the next message's payload flipped
        assert await a.send(b.peer_id, via, b"h2", secret)
        assert [(h, p == secret) for _, h, p in b_in.got] == [(b"h1", True), (b"h2", True)]
        assert len(relayed) == 2  # the tampered connection was dropped
        server.close()
        await a.close()
        await b.close()

    run(go)


def test_a_sweep_closes_stale_idle_connections_and_forgets_peers_no_longer_sent_to() -> None:
    async def go() -> None:
        a = plane(Inbox())
        b, c = plane(Inbox()), plane(Inbox())
        port_b, port_c = await b.listen("127.0.0.1"), await c.listen("127.0.0.1")
        assert await a.send(b.peer_id, f"127.0.0.1:{port_b}", b"h", b"x")
        assert await a.send(c.peer_id, f"127.0.0.1:{port_c}", b"h", b"x")
        old = a._pools[b.peer_id].idle[0]
        old.used_at -= direct.IDLE_S  # b left long ago: its connection is too old to reuse
        assert a.sweep() == 1
        assert old.writer.is_closing()
        assert b.peer_id not in a._pools and len(a._pools[c.peer_id].idle) == 1
        # sends sweep by themselves, at most every SWEEP_S
        a._pools[c.peer_id].idle[0].used_at -= direct.IDLE_S
        a._swept_at -= direct.SWEEP_S
        assert await a.send(b.peer_id, f"127.0.0.1:{port_b}", b"h", b"y")
        assert c.peer_id not in a._pools and len(a._pools[b.peer_id].idle) == 1
        for p in (a, b, c):
            await p.close()

    run(go)


def test_a_pool_in_use_is_not_dropped_by_a_sweep() -> None:
    async def go() -> None:
        a, b = plane(Inbox()), plane(Inbox())
        slow = asyncio.Event()

        async def admit_later(_sender: str) -> bool:
            await slow.wait()
            return True

        b.receiver = dataclasses.replace(b.receiver, admit=admit_later)
        port = await b.listen("127.0.0.1")
        sending = asyncio.create_task(a.send(b.peer_id, f"127.0.0.1:{port}", b"h", b"x"))
        await asyncio.sleep(0.2)  # in its handshake: the pool holds no idle connection yet
        a.sweep()
        assert b.peer_id in a._pools
        slow.set()
        assert await sending
        assert len(a._pools[b.peer_id].idle) == 1  # the connection went back to the same pool
        await a.close()
        await b.close()

    run(go)


def test_the_direct_backoff_doubles_per_address_and_a_new_address_is_tried_at_once() -> None:
    now = [1000.0]
    backoff = DirectBackoff(clock=lambda: now[0])
    waits = [backoff.failed("peer", "10.0.0.1:5000") for _ in range(7)]
    assert waits == [RELAYED_FOR_S * 2**i for i in range(5)] + [DIRECT_BACKOFF_MAX_S] * 2
    assert backoff.waiting("peer", "10.0.0.1:5000")
    # the same peer, restarted on another port: no wait there
    assert not backoff.waiting("peer", "10.0.0.1:6000")
    now[0] += DIRECT_BACKOFF_MAX_S + 1
    assert not backoff.waiting("peer", "10.0.0.1:5000")
    backoff.succeeded("peer", "10.0.0.1:5000")
    assert backoff.failed("peer", "10.0.0.1:5000") == RELAYED_FOR_S  # a success forgot the failures


def test_the_direct_backoff_remembers_a_bounded_number_of_addresses() -> None:
    now = [0.0]
    backoff = DirectBackoff(clock=lambda: now[0])
    for i in range(DirectBackoff.MAX_ENTRIES + 100):  # a peer announcing a new address each time
        now[0] += 1.0
        backoff.failed("liar", f"10.0.0.1:{i}")
    assert len(backoff._until) <= DirectBackoff.MAX_ENTRIES
    assert backoff.waiting("liar", f"10.0.0.1:{DirectBackoff.MAX_ENTRIES + 99}")  # the newest stays


@pytest.mark.parametrize(
    ("host", "announce", "maddrs", "expected"),
    [
        (
            "0.0.0.0",
            None,
            ["/ip6/2001:db8::5/tcp/1", "/ip4/127.0.0.1/tcp/1", "/ip4/10.0.0.7/tcp/1"],
            "10.0.0.7",
        ),
        ("0.0.0.0", None, ["/ip6/2001:db8::5/tcp/1"], None),  # an IPv4 listener cannot answer there
        ("::", None, ["/ip6/fe80::1/tcp/1", "/ip6/2001:db8::5/tcp/1"], "2001:db8::5"),
        ("0.0.0.0", None, ["/ip4/169.254.3.4/tcp/1", "/ip4/127.0.0.1/tcp/1"], "127.0.0.1"),
        ("0.0.0.0", "203.0.113.9", ["/ip4/10.0.0.7/tcp/1"], "203.0.113.9"),
        ("10.0.0.7", None, [], "10.0.0.7"),
    ],
)
def test_the_announced_data_host_is_one_the_listener_answers_on(
    host: str, announce: str | None, maddrs: list[str], expected: str | None
) -> None:
    assert data_host(host, announce, maddrs) == expected
