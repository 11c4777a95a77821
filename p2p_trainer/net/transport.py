"""Messages between peers over the hivemind p2p daemon: msgpack headers, raw tensor bytes.

Composes hivemind's public P2P API (a replica of the DHT's daemon, binary stream handlers); the
sender of every message is the libp2p-authenticated peer id of its stream, never a claimed field.
An asyncio loop (uvloop) runs in a daemon thread so the training thread never blocks on I/O.
Received messages wait in a bounded mailbox until the exchange that expects them collects them.

With the direct data plane started (`direct.py`), a message to a peer whose heartbeat gives a
`data_address` goes over a persistent, key-authenticated TCP connection of our own instead; a
peer that cannot be reached that way is sent to through p2pd for `RELAYED_FOR_S`.

A peer this one cannot open a stream to (behind NAT, say) is tried through `relays`
(`message_relay.py`): the message is signed for it, so the relay cannot forge its sender.

With `security.defences` on, no one sender can hold more than a bounded share of that: a quota of
bytes and messages per sender in the mailbox (its own oldest messages make room for its new
ones, so a flood displaces only the flooder's), a bound on its open streams, and a read timeout
on each; exchange messages are taken only from peers in the live view (`accept_from`).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack
import uvloop
from hivemind import DHT
from hivemind.p2p import P2P, PeerID

from p2p_trainer.config.security import SecurityConfig
from p2p_trainer.heap import keep_freed_memory
from p2p_trainer.net import message_relay as relay
from p2p_trainer.net.direct import DirectError, DirectPlane, Receiver
from p2p_trainer.net.envelope import Signer
from p2p_trainer.net.stream_gate import StreamGate, open_gate, remove_all
from p2p_trainer.processes import own_unix_socket_paths, remove_files

logger = logging.getLogger(__name__)

T = TypeVar("T")
MAX_HEADER_BYTES = 16 * 1024
PROTOCOL = "p2p-trainer/mix/1"
HELLO_PROTOCOL = relay.HELLO_PROTOCOL
MAX_HELLOS_KEPT = 4096
"""Openers of HELLO streams remembered (the newest; each a libp2p host that dialled this one)."""
MAX_RELAY_PROBES = 4
"""Probes through relays at once: a relay serves each sender a few streams, which relayed
messages need more (a probe of a peer nobody runs is tried through the relays too)."""
RELAYED_FOR_S = 30.0
"""After a direct stream to a peer failed, send to it through a relay for this long before
trying directly again (a dial to an address behind NAT can take seconds to fail)."""
DIRECT_BACKOFF_MAX_S = 600.0
"""Longest wait before a peer that could not be dialled directly is tried that way again."""
RELAY_STREAMS_FACTOR = 4
"""A relay may have this many times `security.sender_open_streams` relayed streams open at once."""
HEARD_MEMORY = 3.0
"""`heard_within`: how many times its window a peer's own last message may be old for a delivery
to it to count as hearing from it."""
VIEW_WAIT_S = 2.0
"""How long a stream from a peer not (yet) in the live view is held, unread, before it is closed:
the view refreshes every view period, so a peer that has just joined enters it meanwhile. Its
sender takes a closed stream for a delivery and does not send again, so a refusal loses the
message."""


class MessageError(ValueError):
    """A message from the network that is malformed; it is dropped, never merged."""


@dataclass(frozen=True)
class Message:
    sender: str
    header: dict[str, Any]
    payload: bytes | memoryview
    """A memoryview where it was decrypted into memory of its own (the direct plane)."""


def encode_header(header: dict[str, Any]) -> bytes:
    return msgpack.packb(header, use_bin_type=True)


def decode_header(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_HEADER_BYTES:
        raise MessageError(f"header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types for garbage; all mean "malformed"
        raise MessageError(f"undecodable header: {exc}") from exc
    if not isinstance(header, dict) or not isinstance(header.get("key"), str):
        raise MessageError("header must be a map with a string 'key'")
    return header


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    """One length-prefixed frame (hivemind's framing), refusing frames over `max_bytes`."""
    size = int.from_bytes(await reader.readexactly(P2P.HEADER_LEN), P2P.BYTEORDER)
    if size > max_bytes:
        raise MessageError(f"frame of {size} bytes exceeds the limit of {max_bytes}")
    return await reader.readexactly(size)


@dataclass(frozen=True)
class SenderQuota:
    """What one sender may have waiting in a mailbox (its oldest messages go first past it)."""

    max_bytes: int
    max_messages: int


class Mailbox:
    """Messages by key, waiting for their reader; bounded in entries and bytes (oldest dropped),
    and per sender where a `quota` is given."""

    def __init__(
        self, max_entries: int = 4096, max_bytes: int = 2 << 30, quota: SenderQuota | None = None
    ) -> None:
        self._entries: OrderedDict[str, asyncio.Future[Message]] = OrderedDict()
        self._stamp: dict[str, float] = {}
        self.max_entries, self.max_bytes, self.quota = max_entries, max_bytes, quota
        self._bytes = 0
        self._by_sender: dict[str, OrderedDict[str, int]] = {}
        """Sender -> its messages waiting here (key -> payload bytes), oldest first."""

    def held_by(self, sender: str) -> tuple[int, int]:
        """Payload bytes and messages from `sender` waiting here."""
        held = self._by_sender.get(sender, OrderedDict())
        return sum(held.values()), len(held)

    def _future(self, key: str) -> asyncio.Future[Message]:
        fut = self._entries.get(key)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._entries[key] = fut
            self._stamp[key] = time.monotonic()
        return fut

    def put(self, key: str, message: Message) -> None:
        fut = self._future(key)
        if fut.done():
            logger.debug("duplicate message for %s from %s dropped", key, message.sender)
            return
        fut.set_result(message)
        self._bytes += len(message.payload)
        held = self._by_sender.setdefault(message.sender, OrderedDict())
        held[key] = len(message.payload)
        if self.quota is not None:
            while len(held) > 1 and (
                len(held) > self.quota.max_messages or sum(held.values()) > self.quota.max_bytes
            ):
                oldest = next(iter(held))
                logger.debug("mailbox quota of %s: its message for %s dropped", message.sender[-8:], oldest)
                self._drop(oldest)
        self._evict()

    async def get(self, key: str, timeout_s: float) -> Message | None:
        """The message for `key` once it is here; None when `timeout_s` passes first or the entry
        is dropped while waiting (evicted, or discarded by its exchange): nothing will come then."""
        fut = self._future(key)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), max(0.0, timeout_s))
        except asyncio.TimeoutError:
            return None
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if fut.cancelled() and (me is None or me.cancelling() == 0):
                return None  # only the entry went: the reader itself was not cancelled
            raise

    def has(self, key: str) -> bool:
        """Whether the message for `key` is here (a reader would get it at once)."""
        fut = self._entries.get(key)
        return fut is not None and fut.done() and not fut.cancelled()

    def senders_under(self, prefix: str, exclude_prefix: str) -> set[str]:
        """Senders of messages whose key starts with `prefix` but not `exclude_prefix`.

        Keys end in `|<sender>`; an exchange uses this to see members that joined the same
        exchange under another view of the group (they will not contribute to ours).
        """
        return {
            key.rsplit("|", 1)[1]
            for key in self._entries
            if key.startswith(prefix) and not key.startswith(exclude_prefix)
        }

    def discard(self, prefix: str) -> None:
        """Forget everything under an exchange's key prefix once it is finished."""
        for key in [k for k in self._entries if k.startswith(prefix)]:
            self._drop(key)

    def _drop(self, key: str) -> None:
        fut = self._entries.pop(key)
        self._stamp.pop(key, None)
        if fut.done() and not fut.cancelled():
            message = fut.result()
            self._bytes -= len(message.payload)
            held = self._by_sender.get(message.sender)
            if held is not None:
                held.pop(key, None)
                if not held:
                    del self._by_sender[message.sender]
        else:
            fut.cancel()

    def _evict(self, max_age_s: float = 600.0) -> None:
        now = time.monotonic()
        while self._entries and (
            len(self._entries) > self.max_entries
            or self._bytes > self.max_bytes
            or now - self._stamp[next(iter(self._entries))] > max_age_s
        ):
            self._drop(next(iter(self._entries)))


class DirectBackoff:
    """When to try a peer's direct address again after it could not be reached there.

    A peer behind NAT stays undiallable: each failure at an address doubles its wait, from
    `RELAYED_FOR_S` up to `DIRECT_BACKOFF_MAX_S`, so retries cost a connect timeout rarely; a
    success forgets the address's failures. Keyed by (peer, address), so a peer that restarts on a
    new port is dialled there at once rather than after its old address's wait. At most
    `MAX_ENTRIES` addresses are remembered: waits long over are forgotten first."""

    MAX_ENTRIES = 4096

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failures: dict[tuple[str, str], int] = {}
        self._until: dict[tuple[str, str], float] = {}

    def waiting(self, peer_id: str, address: str) -> bool:
        return self._until.get((peer_id, address), -math.inf) > self._clock()

    def failed(self, peer_id: str, address: str) -> float:
        """Count a failure at `address`; returns how long it is now left alone."""
        key, now = (peer_id, address), self._clock()
        if key not in self._until and len(self._until) >= self.MAX_ENTRIES:
            for old in [k for k, until in self._until.items() if until + DIRECT_BACKOFF_MAX_S < now]:
                self.succeeded(*old)
            if len(self._until) >= self.MAX_ENTRIES:  # all recent: the oldest wait goes
                self.succeeded(*min(self._until, key=self._until.__getitem__))
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        wait_s = min(DIRECT_BACKOFF_MAX_S, RELAYED_FOR_S * 2 ** (failures - 1))
        self._until[key] = now + wait_s
        return wait_s

    def succeeded(self, peer_id: str, address: str) -> None:
        self._failures.pop((peer_id, address), None)
        self._until.pop((peer_id, address), None)


class Transport:
    """A peer's messaging endpoint on the DHT's p2p daemon."""

    def __init__(
        self,
        dht: DHT,
        max_payload_bytes: int,
        security: SecurityConfig = SecurityConfig(),
        signer: Signer | None = None,
    ) -> None:
        self.max_payload_bytes = max_payload_bytes
        self.security = security
        self.signer = signer
        """Signs messages sent through a relay; without one, nothing is relayed."""
        self.relays: list[str] = []
        """Peer ids of relays to try, in order, when a direct stream cannot be opened."""
        self._relayed_until: dict[str, float] = {}
        self.relayed_sent = 0
        """Messages delivered through a relay (also counted in `messages_sent`)."""
        self.relayed_received = 0
        quota = None
        if security.defences:
            quota = SenderQuota(
                int(security.sender_mailbox_payloads * max_payload_bytes), security.sender_mailbox_messages
            )
        self.mailbox = Mailbox(quota=quota)
        self.accept_from: Callable[[str], bool] = lambda _: True
        """Whether to take exchange messages from a peer (the live view, with defences on)."""
        self.view_wait_s = VIEW_WAIT_S
        self._open: dict[str, int] = {}
        """Sender -> its incoming streams being read now."""
        self.refused = 0
        """Incoming streams closed unread or cut off (unknown sender, too many open, too slow)."""
        self.bytes_sent = 0
        self.bytes_received = 0
        self.messages_sent = 0
        """Exchange messages delivered (payload-free ones too, which `bytes_sent` does not show)."""
        self.messages_received = 0
        self.direct: DirectPlane | None = None
        """The direct data plane, once `start_direct` ran."""
        self.direct_address: Callable[[str], str | None] = lambda _: None
        """A peer's `data_address` from its heartbeat, or None (the swarm view, once wired)."""
        self._direct_backoff = DirectBackoff()
        self.direct_sent = 0
        """Messages delivered over the direct data plane (also counted in `messages_sent`)."""
        self._last_heard: dict[str, float] = {}
        """Peer id -> monotonic time a message from it arrived."""
        self._last_reached: dict[str, float] = {}
        """Peer id -> monotonic time a message to it was delivered (`heard_within`)."""
        self._hello_at: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._relay_probes: asyncio.Semaphore | None = None
        """Created on the transport's loop, at the first probe."""
        """Peer id -> monotonic time it opened a HELLO stream to this one (`hellos_within`)."""
        keep_freed_memory()  # exchange buffers are reused, not faulted in afresh each time
        self._loop = uvloop.new_event_loop()  # its sockets and callbacks cost less CPU per message
        self._thread = threading.Thread(target=self._loop.run_forever, name="p2p-transport", daemon=True)
        self._thread.start()
        self._handlers: dict[
            str, Callable[[str, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
        ] = {}
        self.gate: StreamGate
        """Takes this peer's incoming streams, a bounded number per sender (`stream_gate.py`)."""
        self.p2p: P2P = self.run(self._start(dht), timeout_s=60)
        self.peer_id = self.p2p.peer_id.to_base58()

    async def _start(self, dht: DHT) -> P2P:
        p2p = await dht.replicate_p2p()

        async def register(gate: StreamGate) -> None:
            gate.favoured = lambda sender: self.accept_from(sender)
            await gate.add_handler(PROTOCOL, self._on_stream, self._stream_bound())
            # a relay forwards the messages of every peer behind it, so it may have more open at once
            relayed = self._stream_bound(RELAY_STREAMS_FACTOR)
            await gate.add_handler(relay.RELAYED_PROTOCOL, self._on_relayed, relayed)
            await gate.add_handler(HELLO_PROTOCOL, self._on_hello, self._stream_bound())

        self.gate = await open_gate(p2p, register, bounded=self.security.defences)
        return p2p

    def _stream_bound(self, factor: int = 1) -> int | None:
        """Streams one sender may have open at once on a protocol (None: the defences are off)."""
        return factor * self.security.sender_open_streams if self.security.defences else None

    # ----------------------------------------------------------------- running coroutines
    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        return self.submit(coro).result(timeout_s)

    def start_direct(self, host: str, port: int = 0) -> int:
        """Listen for direct connections on (host, port); returns the port (`direct.py`)."""
        assert self.signer is not None, "the direct data plane authenticates with the identity key"
        sec = self.security
        receiver = Receiver(
            admit=self._admit,
            accepts=lambda sender: not sec.defences or self.accept_from(sender),
            deliver=self._deliver_raw,
            max_header_bytes=MAX_HEADER_BYTES,
            max_payload_bytes=self.max_payload_bytes,
            read_timeout_s=sec.stream_read_timeout_s if sec.defences else None,
            max_conns_per_sender=sec.sender_open_streams,
        )
        self.direct = DirectPlane(self.signer, receiver)
        return self.run(self.direct.listen(host, port), timeout_s=10)

    # ----------------------------------------------------------------- sending
    async def send(self, peer_id: str, header: dict[str, Any], payload: bytes = b"") -> None:
        if self.direct is not None and await self._send_direct(peer_id, header, payload):
            return
        relays = self.relays if self.signer is not None else []
        if relays and self._relayed_until.get(peer_id, 0.0) > time.monotonic():
            await self._send_relayed(relays, peer_id, header, payload)
            return
        try:
            opened = await self.p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), PROTOCOL)
        except Exception as exc:  # p2pd reports a peer it cannot dial with several error types
            if not relays:
                raise
            logger.debug(
                "no direct stream to %s (%s): trying relays", peer_id[-8:], str(exc).splitlines()[:1]
            )
            await self._send_relayed(relays, peer_id, header, payload)
            self._relayed_until[peer_id] = time.monotonic() + RELAYED_FOR_S
            return
        _, reader, writer = opened
        try:
            await P2P.send_raw_data(encode_header(header), writer)
            await P2P.send_raw_data(payload, writer)
            await reader.read(1)  # the receiver closes after reading: delivery, not just buffering
            self._sent(peer_id, payload)
        finally:
            writer.close()

    async def _send_direct(self, peer_id: str, header: dict[str, Any], payload: bytes) -> bool:
        """Whether the message went over the direct data plane; False: use p2pd for it."""
        assert self.direct is not None
        address = self.direct_address(peer_id)
        if address is None or self._direct_backoff.waiting(peer_id, address):
            return False
        try:
            taken = await self.direct.send(peer_id, address, encode_header(header), payload)
        except DirectError as exc:
            wait_s = self._direct_backoff.failed(peer_id, address)
            logger.debug("no direct connection to %s (%s): p2pd for %.0f s", peer_id[-8:], exc, wait_s)
            return False
        self._direct_backoff.succeeded(peer_id, address)
        if not taken:
            logger.debug("%s closed a direct message unread (this peer is not in its view)", peer_id[-8:])
        self._sent(peer_id, payload)
        self.direct_sent += 1
        return True

    def _sent(self, peer_id: str, payload: bytes) -> None:
        self.bytes_sent += len(payload)
        self.messages_sent += 1
        self._last_reached[peer_id] = time.monotonic()

    async def _send_relayed(
        self, relays: list[str], peer_id: str, header: dict[str, Any], payload: bytes
    ) -> None:
        """Through the first relay that delivers; raises the last relay's error if none does."""
        assert self.signer is not None
        header_raw, error = encode_header(header), None
        for relay_id in relays:
            if relay_id == peer_id:
                continue
            try:
                await relay.send_relayed(self.p2p, relay_id, peer_id, self.signer, header_raw, payload)
            except Exception as exc:  # a relay that is down or refuses: the next one
                error = exc
                continue
            self._sent(peer_id, payload)
            self.relayed_sent += 1
            return
        raise error or relay.RelayError(f"no relay to reach {peer_id[-8:]}")

    async def connect(self, peer_id: str) -> None:
        """Open (and close) a stream to `peer_id`: p2pd keeps the connection, which the peer can
        then use to reach this one even when it cannot dial this one (behind NAT)."""
        _, _, writer = await self.p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), HELLO_PROTOCOL)
        writer.close()

    async def probe(self, peer_id: str, dial_timeout_s: float = 3.0) -> bool:
        """Whether a host holding `peer_id`'s key answers: a stream opened to it directly, or
        else through each relay in turn (`probation.py`). A dial to an address behind NAT can
        hang until its timeout; the relays are tried after `dial_timeout_s`."""
        try:
            await asyncio.wait_for(self.connect(peer_id), dial_timeout_s)
            return True
        except Exception as exc:  # p2pd reports a peer it cannot dial with several error types
            error: Exception = exc
        if self._relay_probes is None:
            self._relay_probes = asyncio.Semaphore(MAX_RELAY_PROBES)
        if self.relays and self._relay_probes.locked():
            return False  # tried again after the prober's backoff
        async with self._relay_probes:
            for relay_id in self.relays:
                if relay_id == peer_id:
                    continue
                try:
                    if await relay.probe_relayed(self.p2p, relay_id, peer_id):
                        return True
                except Exception as exc:  # a relay that is down or refuses: the next one
                    error = exc
        logger.debug("%s did not answer a probe: %s", peer_id[-8:], str(error).splitlines()[:1])
        return False

    async def connected_peers(self) -> set[str]:
        """Peers p2pd has a connection with now."""
        return {info.peer_id.to_base58() for info in await self.p2p.list_peers()}

    # ----------------------------------------------------------------- receiving
    async def add_request_handler(
        self,
        protocol: str,
        handler: Callable[[str, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    ) -> None:
        async def on_stream(info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await handler(info.peer_id.to_base58(), reader, writer)
            except (MessageError, asyncio.IncompleteReadError, ConnectionError) as exc:
                logger.warning("request on %s from %s dropped: %s", protocol, info.peer_id, exc)
            finally:
                writer.close()

        await self.gate.add_handler(protocol, on_stream, self._stream_bound())

    async def _admit(self, sender: str) -> bool:
        """Whether to take a direct connection from `sender` (held a while for the view, as a stream)."""
        if self.security.defences and not self.accept_from(sender):
            await self._wait_for_view(sender)
            return self.accept_from(sender)
        return True

    def _deliver_raw(self, sender: str, header_raw: bytes, payload: bytes | memoryview) -> None:
        try:
            header = decode_header(header_raw)
        except MessageError as exc:
            logger.warning("message from %s dropped: %s", sender, exc)
            return
        self._deliver(sender, header, payload)

    def _deliver(self, sender: str, header: dict[str, Any], payload: bytes | memoryview) -> None:
        self.bytes_received += len(payload)
        self.messages_received += 1
        self._last_heard[sender] = time.monotonic()
        self.mailbox.put(f"{header['key']}|{sender}", Message(sender, header, payload))

    def _refusal(self, sender: str) -> str | None:
        """Why a new stream from `sender` is closed unread, or None (defences on only)."""
        if not self.security.defences:
            return None
        if not self.accept_from(sender):
            return "not in the live view"
        if self._open.get(sender, 0) >= self.security.sender_open_streams:
            return f"already {self.security.sender_open_streams} streams open"
        return None

    async def _wait_for_view(self, sender: str) -> None:
        """Hold a stream from `sender` until the live view takes it in or `view_wait_s` passes;
        held streams count against the sender's bound on open streams, so none piles up."""
        if self._open.get(sender, 0) >= self.security.sender_open_streams:
            return
        self._open[sender] = self._open.get(sender, 0) + 1
        try:
            deadline = time.monotonic() + self.view_wait_s
            while not self.accept_from(sender) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        finally:
            self._release(sender)

    def _release(self, sender: str) -> None:
        """One of `sender`'s open streams is done with."""
        self._open[sender] -= 1
        if not self._open[sender]:
            del self._open[sender]

    async def _read_message(self, reader: asyncio.StreamReader) -> tuple[dict[str, Any], bytes]:
        header = decode_header(await read_frame(reader, MAX_HEADER_BYTES))
        return header, await read_frame(reader, self.max_payload_bytes)

    async def _on_hello(self, info: Any, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A probe, or a peer behind NAT opening a connection: closed at once. libp2p authenticated
        the opener with its peer id's key, so a host of that id runs: evidence for a view's
        probation (`hellos_within`), though not for the live view itself (anyone may open one)."""
        opener = info.peer_id.to_base58()
        self._hello_at.pop(opener, None)
        self._hello_at[opener] = time.monotonic()  # newest last
        while len(self._hello_at) > MAX_HELLOS_KEPT:
            self._hello_at.popitem(last=False)
        writer.close()

    def hellos_within(self, seconds: float) -> set[str]:
        """Peers that opened a HELLO stream to this one within the last `seconds`."""
        since = time.monotonic() - seconds
        return {p for p, t in list(self._hello_at.items()) if t >= since}

    async def _on_stream(self, info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._receive(info.peer_id.to_base58(), reader, writer, self._read_message)

    async def _on_relayed(
        self, info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """A message a relay forwards: its sender is whoever signed it, not the relay."""
        try:
            meta = await asyncio.wait_for(read_frame(reader, relay.MAX_META_BYTES), 30.0)
            claimed = relay.claimed_sender(meta)
        except (
            MessageError,
            ValueError,
            asyncio.TimeoutError,
            asyncio.IncompleteReadError,
            ConnectionError,
        ) as exc:
            logger.warning("relayed message via %s dropped: %s", info.peer_id.to_base58()[-8:], exc)
            writer.close()
            return

        async def read_verified(reader: asyncio.StreamReader) -> tuple[dict[str, Any], bytes]:
            header_raw = await read_frame(reader, MAX_HEADER_BYTES)
            payload = await read_frame(reader, self.max_payload_bytes)
            try:
                relay.verified_sender(meta, self.peer_id, header_raw, payload, claimed)
            except ValueError as exc:
                raise MessageError(str(exc)) from None
            self.relayed_received += 1
            return decode_header(header_raw), payload

        await self._receive(claimed, reader, writer, read_verified)

    async def _receive(
        self,
        sender: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        read: Callable[[asyncio.StreamReader], Awaitable[tuple[dict[str, Any], bytes]]],
    ) -> None:
        if self.security.defences and not self.accept_from(sender):
            await self._wait_for_view(sender)
        refusal = self._refusal(sender)
        if refusal is not None:
            self.refused += 1
            logger.debug("stream from %s closed unread: %s", sender[-8:], refusal)
            writer.close()
            return
        self._open[sender] = self._open.get(sender, 0) + 1
        try:
            timeout = self.security.stream_read_timeout_s if self.security.defences else None
            header, payload = await asyncio.wait_for(read(reader), timeout)
            self._deliver(sender, header, payload)
        except (MessageError, asyncio.IncompleteReadError, ConnectionError) as exc:
            logger.warning("message from %s dropped: %s", sender, exc)
        except asyncio.TimeoutError:
            self.refused += 1
            logger.warning("message from %s dropped: not whole within the read timeout", sender)
        finally:
            self._release(sender)
            writer.close()

    @property
    def direct_refused(self) -> int:
        """Direct-plane connections refused in their handshake (0 with the plane off)."""
        return self.direct.refused if self.direct is not None else 0

    def heard_within(self, seconds: float) -> set[str]:
        """Peers that sent this one a message within the last `seconds`, and those that took one
        from it within them and sent one within HEARD_MEMORY times them.

        A peer whose uplink is full sends late, its heartbeat too, while what this peer sends it
        still arrives: a delivery keeps it live. But a delivery alone is no sign of taking part:
        a host that takes every message and sends none (a member that never contributes) would
        stay live in the view of each peer whose groups it is drawn into, for good, renewed by
        their own sends. So a delivery counts only for a peer that has itself sent lately."""
        now = time.monotonic()
        since, memory = now - seconds, now - HEARD_MEMORY * seconds
        talked = {p: t for p, t in list(self._last_heard.items()) if t >= memory}
        heard = {p for p, t in talked.items() if t >= since}
        return heard | {p for p, t in list(self._last_reached.items()) if t >= since and p in talked}

    def close(self) -> None:
        if self.direct_sent:
            logger.info("over the direct data plane: %d messages sent", self.direct_sent)
        if self.refused or self.direct_refused or self.gate.refused:
            logger.info(
                "refused %d message streams, %d direct connections and %d streams at the gate "
                "(at most %d held at once)",
                self.refused,
                self.direct_refused,
                self.gate.refused,
                self.gate.peak_open,
            )
        if self.relayed_sent or self.relayed_received:
            logger.info(
                "through relays: %d messages sent, %d received", self.relayed_sent, self.relayed_received
            )
        # hivemind's client socket files are ours to remove: p2pd does not unlink them on shutdown
        own_sockets = own_unix_socket_paths()

        async def stop() -> None:
            await remove_all(self.gate)  # first: p2pd stops handing streams to a closing peer
            # background sends to peers that never answered: cancel them, do not leave them pending
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)
            if self.direct is not None:
                await self.direct.close()
            with contextlib.suppress(Exception):  # the daemon may already be gone at shutdown
                await self.p2p.shutdown()

        if self._loop.is_running():
            with contextlib.suppress(concurrent.futures.TimeoutError):
                self.run(stop(), timeout_s=5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        remove_files(own_sockets)
