"""The direct data plane: exchange messages over TCP connections of our own, beside p2pd.

Why: a message through p2pd goes Python → unix socket → p2pd → TCP → p2pd → unix socket → Python
and opens a new libp2p stream each time; on loopback one exchange of the default model took 12.7 ×
a gloo all-reduce of the same tensor (bench/RESULTS.md). Here each pair of peers keeps persistent
TCP connections; a message is framed as on p2pd (8-byte big-endian length, msgpack header, raw
payload) and acknowledged once it sits in the receiver's mailbox, so "sent" still means delivered.

Authentication. A peer id is its Ed25519 public key (`identity.py`), so a handshake proves both
ends: each side sends a fresh nonce and its public key, and signs (role, its peer's nonce, its own
nonce, its peer's public key). The dialler checks that the key it reached makes the peer id it
meant to reach; the listener takes the dialler's key as the sender of everything on that
connection. A recorded handshake cannot be replayed: the other side's nonce is new each time.
Each hello also carries a fresh X25519 key inside what is signed; every frame after the handshake
is sealed with keys only the two ends can derive (`channel.py`), so no one on the path can read,
change, replay or insert a message.

Where a peer listens: its heartbeat's `data_address` (an IP literal and a port, never a name to
resolve). A peer without one (an older version, `network.data_plane = "p2pd"`) or whose address
does not answer (behind NAT, a firewall) is sent to through p2pd as before, which also tries relays.

Bounds, since anyone who can reach the port may connect: at most `MAX_HANDSHAKES` connections
in their handshake at once, and `MAX_HANDSHAKES_PER_IP` from one address (so one host cannot hold
every slot and keep the others' peers out), each given `HANDSHAKE_TIMEOUT_S`; per authenticated
sender at most `max_conns_per_sender` connections (further ones are refused in the handshake,
saying why: the dialler logs "not admitted" apart from "too many connections"); an idle
connection closes after `IDLE_S`. The dialler's own idle connections are swept on its sends, every
`SWEEP_S` at most, so connections to peers that left are not held for the rest of the run. Each
message then passes the transport's own checks (live view, mailbox quota, read timeout, size
limits).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import msgpack
import nacl.exceptions
import nacl.signing
import numpy as np

from p2p_trainer.net.channel import TAG_BYTES, Ephemeral, Sealer, session
from p2p_trainer.net.envelope import Signer
from p2p_trainer.net.frames import FrameReader
from p2p_trainer.net.identity import peer_id_from_public_key

logger = logging.getLogger(__name__)

LENGTH_BYTES = 8
BYTEORDER: Literal["big"] = "big"
MAX_HELLO_BYTES = 512
NONCE_BYTES = 32
DOMAIN = b"p2p-trainer/direct/2"
"""Signed in every handshake: a peer that seals its frames another way (an older version) fails
the handshake and is sent to through p2pd."""
MAX_HANDSHAKES = 64
MAX_HANDSHAKES_PER_IP = 16
LOOPBACK_EXEMPT = True
"""Whether `MAX_HANDSHAKES_PER_IP` spares loopback: every peer of a local swarm dials from
127.0.0.1, all at once when the first exchange starts."""
HANDSHAKE_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 3.0
IDLE_S = 120.0
"""The listener closes a connection idle this long; the dialler reuses one only if idle for less
than half of it, so it does not write into a connection the other end is closing."""
SWEEP_S = 30.0
"""How often (at most, on a send) the dialler closes idle connections too old to reuse and drops
the pools of peers it no longer sends to (peers that left), which nothing else would look at."""
MAX_ADDRESS_CHARS = 64
ACCEPTED, REFUSED, BUSY = b"\x01", b"\x00", b"\x02"
"""The handshake's verdict: taken; refused (not admitted); refused (this sender already holds
its `max_conns_per_sender` connections). After the handshake, a sealed ACCEPTED or REFUSED
acknowledges each message."""
_REFUSALS = {
    REFUSED: "refused a direct connection (not admitted: not in its live view, or not allowed in)",
    BUSY: "refused a direct connection (it already holds its limit of connections from this peer)",
}


class DirectError(ConnectionError):
    """This peer cannot be reached directly (no answer, wrong key, refused): use p2pd instead."""


def check_address(text: str) -> tuple[str, int]:
    """(host, port) of a `data_address`: an IP literal and a port, `1.2.3.4:5` or `[::1]:5`."""
    if len(text) > MAX_ADDRESS_CHARS:
        raise ValueError(f"address of {len(text)} characters (at most {MAX_ADDRESS_CHARS})")
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"address {text!r} is not host:port")
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is out of range")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    ip = ipaddress.ip_address(host)  # raises ValueError for names: nothing is resolved
    if ip.is_unspecified or ip.is_multicast:
        raise ValueError(f"address {host} cannot be dialled")
    return host, port


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _frame(data: bytes) -> bytes:
    return len(data).to_bytes(LENGTH_BYTES, BYTEORDER) + data


def _sealed_frame(sealer: Sealer, data: bytes) -> memoryview:
    return sealer.seal_framed(data, LENGTH_BYTES, BYTEORDER)


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    size = int.from_bytes(await reader.readexactly(LENGTH_BYTES), BYTEORDER)
    if size > max_bytes:
        raise ValueError(f"frame of {size} bytes exceeds the limit of {max_bytes}")
    return await reader.readexactly(size)


def _peer_ip(conn: FrameReader) -> str:
    """The address a connection comes from; "" where it is not bounded per address (loopback, or
    unknown)."""
    peer = conn.peername()
    try:
        ip = ipaddress.ip_address(peer[0])
    except (TypeError, IndexError, ValueError):
        return ""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return "" if ip.is_loopback and LOOPBACK_EXEMPT else str(ip)


def _signed_part(
    role: bytes, their_nonce: bytes, my_nonce: bytes, their_key: bytes, their_x: bytes, my_x: bytes
) -> bytes:
    """What one side signs: its role, both nonces, the other's identity key and both session keys."""
    return DOMAIN + b"|" + role + b"|" + their_nonce + my_nonce + their_key + their_x + my_x


def _unpack_map(raw: bytes) -> dict[str, object]:
    try:
        value = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types for garbage
        raise ValueError(f"undecodable handshake: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError("handshake must be a map")
    return value


def _hello(raw: bytes, need_signature: bool) -> tuple[bytes, bytes, bytes, bytes]:
    """(public key, nonce, session key, signature) of a handshake message, each checked for type
    and size."""
    hello = _unpack_map(raw)
    key, nonce, sig = hello.get("pk", b""), hello.get("n", b""), hello.get("s", b"")
    x = hello.get("x", b"")
    if not (isinstance(key, bytes) and len(key) == 32):
        raise ValueError("handshake without a 32-byte public key")
    if not (isinstance(x, bytes) and len(x) == 32):
        raise ValueError("handshake without a 32-byte session key")
    if not (isinstance(nonce, bytes) and len(nonce) == NONCE_BYTES):
        raise ValueError("handshake without a nonce")
    if not isinstance(sig, bytes) or (need_signature and len(sig) != 64):
        raise ValueError("handshake without a signature")
    return key, nonce, x, sig


def _verify(key: bytes, message: bytes, sig: bytes) -> None:
    try:
        nacl.signing.VerifyKey(key).verify(message, sig)
    except (nacl.exceptions.BadSignatureError, ValueError) as exc:
        raise ValueError(f"bad handshake signature: {exc}") from None


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    out: Sealer
    inn: Sealer
    used_at: float = field(default_factory=time.monotonic)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()

    def reusable(self, now: float) -> bool:
        """Idle for less than half the listener's `IDLE_S`, and not closed by either end."""
        return now - self.used_at < IDLE_S / 2 and not self.writer.is_closing() and not self.reader.at_eof()


@dataclass
class _Pool:
    """Idle connections to one peer, and a bound on those in use."""

    limit: asyncio.Semaphore
    idle: list[_Conn] = field(default_factory=list)
    sending: int = 0
    """Sends in progress (waiting for a connection or on one): the pool is not dropped meanwhile."""


@dataclass(frozen=True)
class Receiver:
    """What the listener hands messages to (the transport)."""

    admit: Callable[[str], Awaitable[bool]]
    """Whether a new connection from this sender is taken (the live view, with defences on)."""
    accepts: Callable[[str], bool]
    """Whether a message from this sender is taken now (it may have left the view since)."""
    deliver: Callable[[str, bytes, bytes | memoryview], None]
    """Put (sender, header bytes, payload) in the mailbox; raises ValueError for a bad header."""
    max_header_bytes: int
    max_payload_bytes: int
    read_timeout_s: float | None
    """Longest one message may take to arrive whole once its first byte came; None: unbounded."""
    max_conns_per_sender: int


class DirectPlane:
    """Listener and dialler of the direct data plane; runs on the transport's event loop."""

    def __init__(self, signer: Signer, receiver: Receiver) -> None:
        self._signer = signer
        self._public = signer.public_key
        self.peer_id = signer.peer_id
        self.receiver = receiver
        self._server: asyncio.Server | None = None
        self._pools: dict[str, _Pool] = {}
        self._handshaking = 0
        self._handshaking_from: dict[str, int] = {}
        self._by_sender: dict[str, int] = {}
        self._serving: set[asyncio.Task[None]] = set()
        self._swept_at = time.monotonic()
        self.refused = 0
        """Connections refused: handshake failed or timed out, too many, or the sender not admitted."""

    # ----------------------------------------------------------------- listening
    async def listen(self, host: str, port: int = 0) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: FrameReader(LENGTH_BYTES, BYTEORDER, self._on_connection), host, port
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def _on_connection(self, conn: FrameReader) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._serving.add(task)
        sender = None
        ip = _peer_ip(conn)
        try:
            if (
                self._handshaking >= MAX_HANDSHAKES
                or self._handshaking_from.get(ip, 0) >= MAX_HANDSHAKES_PER_IP
            ):
                self.refused += 1
                return
            self._handshaking += 1
            if ip:
                self._handshaking_from[ip] = self._handshaking_from.get(ip, 0) + 1
            try:
                accepted = await asyncio.wait_for(self._accept(conn), HANDSHAKE_TIMEOUT_S)
            finally:
                self._handshaking -= 1
                if ip:
                    self._handshaking_from[ip] -= 1
                    if not self._handshaking_from[ip]:
                        del self._handshaking_from[ip]
            if accepted is None:
                return
            sender, out, inn = accepted
            await self._serve(sender, conn, out, inn)
        except (ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError) as exc:
            self.refused += sender is None
            logger.debug("direct connection from %s closed: %s", (sender or "?")[-8:], exc)
        except asyncio.CancelledError:
            pass  # closing: asyncio would log a cancelled connection task as an error
        finally:
            if sender is not None:
                self._release(sender)
            conn.close()
            if task is not None:
                self._serving.discard(task)

    async def _accept(self, conn: FrameReader) -> tuple[str, Sealer, Sealer] | None:
        """The authenticated sender of a new connection (counted against its bound) and the
        connection's sealers; None if refused."""
        raw = bytes(await conn.request(MAX_HELLO_BYTES))
        their_key, their_nonce, their_x, _ = _hello(raw, need_signature=False)
        nonce, mine = os.urandom(NONCE_BYTES), Ephemeral()
        shared = mine.shared(their_x)
        sig = self._signer.sign(
            _signed_part(b"listener", their_nonce, nonce, their_key, their_x, mine.public)
        )
        conn.write(_frame(msgpack.packb({"pk": self._public, "n": nonce, "x": mine.public, "s": sig})))
        their_sig = _unpack_map(bytes(await conn.request(MAX_HELLO_BYTES))).get("s")
        if not isinstance(their_sig, bytes):
            raise ValueError("handshake without the dialler's signature")
        _verify(
            their_key,
            _signed_part(b"dialler", nonce, their_nonce, self._public, mine.public, their_x),
            their_sig,
        )
        sender = peer_id_from_public_key(their_key)
        # counted before the admission check, which may wait: concurrent dials see each other
        held = self._by_sender.get(sender, 0)
        self._by_sender[sender] = held + 1
        try:
            busy = held >= self.receiver.max_conns_per_sender
            taken = not busy and await self.receiver.admit(sender)
            conn.write(ACCEPTED if taken else BUSY if busy else REFUSED)
        except BaseException:
            self._release(sender)
            raise
        if not taken:
            self._release(sender)
            self.refused += 1
            return None
        return (sender, *session(shared, their_nonce, nonce, dialler=False))

    def _release(self, sender: str) -> None:
        self._by_sender[sender] -= 1
        if not self._by_sender[sender]:
            del self._by_sender[sender]

    async def _serve(self, sender: str, conn: FrameReader, out: Sealer, inn: Sealer) -> None:
        rx = self.receiver
        while True:
            header_frame = conn.request(rx.max_header_bytes + TAG_BYTES)
            assert conn.started is not None
            try:
                await asyncio.wait_for(asyncio.shield(conn.started), IDLE_S)
            except asyncio.TimeoutError:
                return  # idle: closed (a dialler reuses a connection only well within IDLE_S)

            async def rest(
                header_frame: asyncio.Future[np.ndarray] = header_frame,
            ) -> tuple[bytes, memoryview]:
                header = inn.open(bytes(await header_frame))
                return header, inn.open_into(await conn.request(rx.max_payload_bytes + TAG_BYTES))

            try:
                header, payload = await asyncio.wait_for(rest(), rx.read_timeout_s)
            except asyncio.IncompleteReadError:
                return  # the dialler closed between frames (one cut off mid-frame is logged)
            if rx.accepts(sender):
                rx.deliver(sender, header, payload)
                conn.write(_sealed_frame(out, ACCEPTED))
            else:  # as a p2pd stream closed unread: the sender does not resend
                conn.write(_sealed_frame(out, REFUSED))

    # ----------------------------------------------------------------- dialling
    async def _dial(self, peer_id: str, address: str) -> _Conn:
        host, port = check_address(address)
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as exc:
            raise DirectError(f"cannot connect to {address}: {exc!r}") from None
        try:
            nonce, mine = os.urandom(NONCE_BYTES), Ephemeral()
            writer.write(_frame(msgpack.packb({"pk": self._public, "n": nonce, "x": mine.public})))
            await writer.drain()
            raw = await asyncio.wait_for(read_frame(reader, MAX_HELLO_BYTES), HANDSHAKE_TIMEOUT_S)
            their_key, their_nonce, their_x, their_sig = _hello(raw, need_signature=True)
            if peer_id_from_public_key(their_key) != peer_id:
                raise ValueError(f"{address} answers as another peer")
            signed = _signed_part(b"listener", nonce, their_nonce, self._public, mine.public, their_x)
            _verify(their_key, signed, their_sig)
            shared = mine.shared(their_x)
            sig = self._signer.sign(
                _signed_part(b"dialler", their_nonce, nonce, their_key, their_x, mine.public)
            )
            writer.write(_frame(msgpack.packb({"s": sig})))
            await writer.drain()
            verdict = await asyncio.wait_for(reader.readexactly(1), HANDSHAKE_TIMEOUT_S)
        except (ValueError, OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as exc:
            writer.close()
            raise DirectError(f"handshake with {peer_id[-8:]} at {address} failed: {exc!r}") from None
        except BaseException:  # cancelled mid-handshake: the socket is not left open
            writer.close()
            raise
        if verdict != ACCEPTED:
            writer.close()
            raise DirectError(f"{peer_id[-8:]} {_REFUSALS.get(verdict, 'refused a direct connection')}")
        return _Conn(reader, writer, *session(shared, nonce, their_nonce, dialler=True))

    async def send(self, peer_id: str, address: str, header: bytes, payload: bytes) -> bool:
        """Deliver one message; True once in the receiver's mailbox, False if it refused the message.

        Raises `DirectError` when no connection can be made (the caller uses p2pd), and
        ConnectionError / IncompleteReadError when one breaks mid-message (the caller retries).
        """
        if time.monotonic() - self._swept_at >= SWEEP_S:
            self.sweep()
        pool = self._pools.get(peer_id)
        if pool is None:
            pool = self._pools[peer_id] = _Pool(asyncio.Semaphore(self.receiver.max_conns_per_sender))
        pool.sending += 1
        try:
            return await self._send_pooled(pool, peer_id, address, header, payload)
        finally:
            pool.sending -= 1

    def sweep(self) -> int:
        """Close the idle connections too old to reuse (or closed by the other end) and forget the
        pools left with nothing in them; returns how many connections were closed."""
        self._swept_at = now = time.monotonic()
        closed = 0
        for peer_id, pool in list(self._pools.items()):
            keep = []
            for conn in pool.idle:
                if conn.reusable(now):
                    keep.append(conn)
                else:
                    conn.close()
                    closed += 1
            pool.idle[:] = keep
            if not pool.idle and not pool.sending:
                del self._pools[peer_id]
        return closed

    async def _send_pooled(
        self, pool: _Pool, peer_id: str, address: str, header: bytes, payload: bytes
    ) -> bool:
        failures = (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError)
        async with pool.limit:
            while pool.idle:
                conn = pool.idle.pop()
                if conn.reusable(time.monotonic()):
                    try:
                        return await self._send_on(pool, conn, header, payload)
                    except failures:
                        continue  # the other end closed it meanwhile: another one, or a new one
                conn.close()
            conn = await self._dial(peer_id, address)
            try:
                return await self._send_on(pool, conn, header, payload)
            except failures as exc:  # a new connection that breaks mid-message: p2pd may do better
                raise DirectError(f"a new connection to {peer_id[-8:]} broke: {exc!r}") from None

    async def _send_on(self, pool: _Pool, conn: _Conn, header: bytes, payload: bytes) -> bool:
        # the ack comes once the whole payload is in: allow 1 Mbit/s at least, and 10 s more
        ack_timeout_s = 10.0 + len(payload) / 125_000
        try:
            # one system call for both frames where the socket takes them
            conn.writer.writelines([_sealed_frame(conn.out, header), _sealed_frame(conn.out, payload)])
            await conn.writer.drain()
            ack = conn.inn.open(await asyncio.wait_for(read_frame(conn.reader, 64), ack_timeout_s))
        except BaseException:
            conn.close()
            raise
        conn.used_at = time.monotonic()
        pool.idle.append(conn)
        return ack == ACCEPTED

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for pool in self._pools.values():
            for conn in pool.idle:
                conn.close()
        self._pools.clear()
        for task in list(self._serving):
            task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)
