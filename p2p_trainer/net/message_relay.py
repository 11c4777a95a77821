"""Relayed messages: a peer that cannot be dialled is reached through a node that can be.

p2pd's circuit relay (libp2p circuit v2) does not do for this: the p2pd that hivemind 1.1.12
ships serves relay hops with libp2p's default limits, and measured in the NAT testbed it resets
every relayed connection after 131072 bytes in one direction (and after 2 minutes), while one
copy of even the tiny test model's parameters is 136 kB (README, "Peers behind NAT").

So a reachable node (every bootstrap node, by default) forwards our own messages on our own
streams, full size. A sender that cannot open a stream to peer B opens one to relay R
(RELAY_PROTOCOL) and names B; R opens a stream to B (RELAYED_PROTOCOL) over the connection B
keeps to R (B dialled R when it joined), answers one byte (OPEN: go on; CLOSED: B is not
reachable from R either, or R is at its total of relayed streams; a sender past its own share
of R's streams has the stream closed unanswered), then copies the sender's three frames to B in
bounded chunks and, once B has closed the stream after taking the message, answers OPEN once
more: delivered.

R is not trusted with the sender's identity. The sender signs, with its identity key, the target
and the sha256 of the header and of the payload; B checks the signature against the public key
in the meta frame, whose peer id must be the claimed sender. A relay can drop or delay a message
but neither forge nor redirect one; a replay lands on an exchange key already finished or seen,
which the mailbox ignores.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import struct
from dataclasses import dataclass

import msgpack
import nacl.exceptions
import nacl.signing
from hivemind.p2p import P2P, PeerID

from p2p_trainer.net.envelope import Signer
from p2p_trainer.net.identity import peer_id_from_public_key
from p2p_trainer.net.stream_gate import StreamGate

logger = logging.getLogger(__name__)

RELAY_PROTOCOL = "p2p-trainer/relay/1"
"""Sender -> relay: forward this message to the peer named in the first frame."""
RELAYED_PROTOCOL = "p2p-trainer/relayed/1"
"""Relay -> target: a message someone else signed."""
HELLO_PROTOCOL = "p2p-trainer/hello/1"
"""Answers nothing: a stream that opens proves a host holding the peer id's key runs there (a
probe), and a peer behind NAT opens one to have a connection that others can use."""
OPEN, CLOSED = b"\x01", b"\x00"
PROBE_OPEN_S = 3.0
"""How long a relay tries to reach a probe's target (`probe_relayed`)."""
MAX_META_BYTES = 512
_DOMAIN = b"p2p-trainer/relayed-message/v1\x00"
_CHUNK_BYTES = 1 << 20


class RelayError(ConnectionError):
    """A relay refused, could not reach the target, or lost the message on the way."""


@dataclass(frozen=True)
class RelayLimits:
    """What one relay forwards at once; a sender past its share is refused, not queued."""

    max_frame_bytes: int = 1 << 30
    """Largest frame forwarded (a payload); the target applies its own, smaller, limit."""
    max_streams: int = 64
    per_sender_streams: int = 8
    open_timeout_s: float = 10.0
    """How long the relay tries to open the stream to the target."""
    idle_timeout_s: float = 30.0
    """Longest wait for the next chunk from either side."""


def _signed_part(target: str, header_raw: bytes, payload: bytes) -> bytes:
    target_bytes = target.encode()
    digests = hashlib.sha256(header_raw).digest() + hashlib.sha256(payload).digest()
    return _DOMAIN + struct.pack(">H", len(target_bytes)) + target_bytes + digests


def seal_meta(signer: Signer, target: str, header_raw: bytes, payload: bytes) -> bytes:
    """The meta frame of a relayed message: who sends it, signed for `target` and these bytes."""
    signature = signer.sign(_signed_part(target, header_raw, payload))
    return bytes(msgpack.packb({"pk": signer.public_key, "sig": signature}, use_bin_type=True))


def _meta(meta_raw: bytes) -> tuple[bytes, bytes]:
    try:
        meta = msgpack.unpackb(meta_raw, raw=False)
        public_key, signature = meta["pk"], meta["sig"]
    except Exception as exc:  # msgpack raises several types for garbage
        raise ValueError(f"relayed message with an unreadable meta frame: {exc}") from None
    if not isinstance(public_key, bytes) or not isinstance(signature, bytes):
        raise ValueError("relayed message with an unreadable meta frame")
    return public_key, signature


def claimed_sender(meta_raw: bytes) -> str:
    """The peer id a relayed message says it is from (not yet checked: `verified_sender`)."""
    public_key, _ = _meta(meta_raw)
    try:
        return peer_id_from_public_key(public_key)
    except ValueError as exc:
        raise ValueError(f"relayed message with a bad public key: {exc}") from None


def verified_sender(meta_raw: bytes, target: str, header_raw: bytes, payload: bytes, claimed: str) -> str:
    """`claimed`, if its key signed this message for `target`; raises ValueError otherwise."""
    public_key, signature = _meta(meta_raw)
    if claimed_sender(meta_raw) != claimed:
        raise ValueError("relayed message whose key is not its claimed sender's")
    try:
        nacl.signing.VerifyKey(public_key).verify(_signed_part(target, header_raw, payload), signature)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.CryptoError, ValueError, TypeError) as exc:
        raise ValueError(f"relayed message from {claimed[-8:]} with a bad signature: {exc}") from None
    return claimed


async def _read_exactly(reader: asyncio.StreamReader, n: int, timeout_s: float) -> bytes:
    return await asyncio.wait_for(reader.readexactly(n), timeout_s)


async def _copy_frame(
    src: asyncio.StreamReader, dst: asyncio.StreamWriter, max_bytes: int, idle_s: float
) -> None:
    """Copy one length-prefixed frame, chunk by chunk, refusing frames over `max_bytes`."""
    prefix = await _read_exactly(src, P2P.HEADER_LEN, idle_s)
    size = int.from_bytes(prefix, P2P.BYTEORDER)
    if size > max_bytes:
        raise RelayError(f"frame of {size} bytes exceeds the relay's limit of {max_bytes}")
    dst.write(prefix)
    while size:
        chunk = await asyncio.wait_for(src.read(min(size, _CHUNK_BYTES)), idle_s)
        if not chunk:
            raise RelayError("the sender closed the stream in the middle of a frame")
        size -= len(chunk)
        dst.write(chunk)
        await asyncio.wait_for(dst.drain(), idle_s)


class RelayService:
    """The relay's side: forwards RELAY_PROTOCOL streams to their targets (see the module doc)."""

    def __init__(self, p2p: P2P, limits: RelayLimits = RelayLimits()) -> None:
        self.p2p = p2p
        self.limits = limits
        self._forwarding = 0
        """Streams being forwarded now, all senders together (each sender's share: the gate's)."""
        self.forwarded = 0
        """Messages delivered through this relay."""
        self.probes = 0
        """Probes a target answered through this relay (`probe_relayed`)."""
        self.refused = 0
        """Streams refused: over a limit, malformed, or the target out of reach."""

    async def start(self, gate: StreamGate) -> None:
        """Take RELAY_PROTOCOL streams through `gate`: a sender past its share is closed there,
        unread (a sender that reopens streams as fast as they close would otherwise have each one
        handed over and answered first); `handle` answers CLOSED past the relay's total."""
        await gate.add_handler(RELAY_PROTOCOL, self.handle, self.limits.per_sender_streams)

    async def handle(self, info: object, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sender = info.peer_id.to_base58()  # type: ignore[attr-defined]
        if self._forwarding >= self.limits.max_streams:
            self.refused += 1
            await _answer(writer, CLOSED)
            return
        self._forwarding += 1
        try:
            await self._forward(sender, reader, writer)
        except (
            RelayError,
            ValueError,
            asyncio.TimeoutError,
            asyncio.IncompleteReadError,
            ConnectionError,
        ) as exc:
            self.refused += 1
            logger.info("relay from %s dropped: %s", sender[-8:], str(exc) or type(exc).__name__)
        finally:
            self._forwarding -= 1
            writer.close()

    async def _forward(self, sender: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        limits = self.limits
        size = int.from_bytes(
            await _read_exactly(reader, P2P.HEADER_LEN, limits.idle_timeout_s), P2P.BYTEORDER
        )
        if size > MAX_META_BYTES:
            raise RelayError(f"routing frame of {size} bytes")
        route = msgpack.unpackb(await _read_exactly(reader, size, limits.idle_timeout_s), raw=False)
        target = route.get("to") if isinstance(route, dict) else None
        if not isinstance(target, str) or target == sender:
            raise RelayError(f"bad routing frame {route!r}")
        probe = route.get("probe") is True  # only whether the target answers: nothing to forward
        try:
            protocol = HELLO_PROTOCOL if probe else RELAYED_PROTOCOL
            opened = self.p2p.call_binary_stream_handler(PeerID.from_base58(target), protocol)
            # a probe's sender gives up after a few seconds: its slot here must not outlast that
            wait_s = min(limits.open_timeout_s, PROBE_OPEN_S) if probe else limits.open_timeout_s
            _, target_reader, target_writer = await asyncio.wait_for(opened, wait_s)
        except Exception as exc:  # p2pd reports an unreachable target with several error types
            await _answer(writer, CLOSED)
            reason = str(exc).splitlines()[0] if str(exc) else repr(exc)
            raise RelayError(f"target {target[-8:]} out of reach: {reason}") from None
        if probe:
            target_writer.close()
            await _answer(writer, OPEN)
            self.probes += 1
            return
        try:
            await _answer(writer, OPEN)
            # meta, header, payload; the target applies its own, tighter limits to the last two
            for max_bytes in (MAX_META_BYTES, limits.max_frame_bytes, limits.max_frame_bytes):
                await _copy_frame(reader, target_writer, max_bytes, limits.idle_timeout_s)
            await asyncio.wait_for(target_reader.read(1), limits.idle_timeout_s)  # target took it
            await _answer(writer, OPEN)
            self.forwarded += 1
        finally:
            target_writer.close()


async def _answer(writer: asyncio.StreamWriter, byte: bytes) -> None:
    writer.write(byte)
    await writer.drain()


async def _answer_of(relay: str, reader: asyncio.StreamReader) -> bytes:
    """The relay's one-byte answer; a stream it closed unanswered (this sender past its share of
    the relay's streams) or broke is a RelayError too."""
    try:
        answer = await reader.read(1)
    except ConnectionError as exc:
        raise RelayError(f"relay {relay[-8:]} broke the stream: {exc!r}") from None
    if not answer:
        raise RelayError(
            f"relay {relay[-8:]} closed the stream unanswered (busy: too many streams from here)"
        )
    return answer


async def probe_relayed(p2p: P2P, relay: str, target: str) -> bool:
    """Whether `target` answers a probe (`HELLO_PROTOCOL`) opened by `relay` (for a peer this one
    cannot dial: behind NAT, it keeps a connection to its relays); RelayError if the relay itself
    did not answer."""
    _, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(relay), RELAY_PROTOCOL)
    try:
        await P2P.send_raw_data(bytes(msgpack.packb({"to": target, "probe": True})), writer)
        return await _answer_of(relay, reader) == OPEN
    finally:
        writer.close()


async def send_relayed(
    p2p: P2P, relay: str, target: str, signer: Signer, header_raw: bytes, payload: bytes
) -> None:
    """Deliver one message to `target` through `relay`; raises RelayError if it was not delivered."""
    _, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(relay), RELAY_PROTOCOL)
    try:
        await P2P.send_raw_data(bytes(msgpack.packb({"to": target})), writer)
        if await _answer_of(relay, reader) != OPEN:
            raise RelayError(f"relay {relay[-8:]} cannot reach {target[-8:]}")
        await P2P.send_raw_data(seal_meta(signer, target, header_raw, payload), writer)
        await P2P.send_raw_data(header_raw, writer)
        await P2P.send_raw_data(payload, writer)
        if await reader.read(1) != OPEN:
            raise RelayError(f"relay {relay[-8:]} lost the message to {target[-8:]}")
    finally:
        writer.close()
