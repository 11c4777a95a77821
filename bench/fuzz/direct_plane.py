"""Targets for the direct data plane, driven through its listener over a fake socket: the dialler's
handshake frames and the sealed frames after a handshake."""

from __future__ import annotations

import asyncio
import contextlib

import msgpack
import nacl.public
import nacl.signing
from hypothesis import strategies as st

from bench.fuzz.fakes import Wire, _stream, feed
from bench.fuzz.inputs import _PEERS, _flipped, _packed, frame
from p2p_trainer.net import channel, direct
from p2p_trainer.net.frames import FrameReader

_DIALLER_X = bytes(nacl.public.PrivateKey(bytes(range(7, 39))).public_key)
_HELLO = bytes(msgpack.packb({"pk": _PEERS[1].public_key, "n": bytes(32), "x": _DIALLER_X, "s": bytes(64)}))
"""A dialler's hello, well formed (the listener takes it up to the signature of the answer)."""
_ANSWER = bytes(msgpack.packb({"s": bytes(64)}))
_SESSION = (bytes(range(64, 96)), bytes(32), bytes(range(32)))
"""The shared secret and the dialler's and listener's nonces of a handshake taken as done."""


def _receiver(delivered: list[tuple[bytes, bytes]]) -> direct.Receiver:
    async def admit(sender: str) -> bool:
        return True

    def deliver(sender: str, header: bytes, payload: bytes | memoryview) -> None:
        delivered.append((bytes(header), bytes(payload)))

    return direct.Receiver(admit, lambda sender: True, deliver, 1024, 4096, None, 2)


class _Handshaken(direct.DirectPlane):
    """A listener whose every handshake has succeeded with `_PEERS[1]`: what comes after is fuzzed."""

    async def _accept(self, conn: FrameReader) -> tuple[str, channel.Sealer, channel.Sealer] | None:
        sender = _PEERS[1].peer_id
        self._by_sender[sender] = self._by_sender.get(sender, 0) + 1  # as the real one counts it
        return (sender, *channel.session(*_SESSION, dialler=False))


async def _connect(plane: direct.DirectPlane, data: bytes) -> Wire:
    return await feed(FrameReader(direct.LENGTH_BYTES, direct.BYTEORDER, plane._on_connection), data)


async def _dialler_reads(data: bytes) -> None:
    """What `DirectPlane._dial` does with a listener's answer, short of the socket."""
    with contextlib.suppress(ValueError, asyncio.IncompleteReadError):
        raw = await direct.read_frame(_stream(data), direct.MAX_HELLO_BYTES)
        key, _, x, signature = direct._hello(raw, need_signature=True)
        direct._verify(key, b"what the listener signs", signature)
        channel.Ephemeral().shared(x)


def fuzz_direct_handshake(hello: bytes, answer: bytes, flips: list[int], raw: bytes | None) -> None:
    """A dialler's two handshake frames (or any bytes) reach a listener, then the connection closes."""
    data = raw if raw is not None else _flipped(frame(hello) + frame(answer), flips)
    plane = direct.DirectPlane(_PEERS[0], _receiver([]))

    async def both() -> Wire:
        await _dialler_reads(data)
        return await _connect(plane, data)

    wire = asyncio.run(both())
    # refused once, closed, and every slot given back: one left held would lock later diallers
    # out (`MAX_HANDSHAKES`, `MAX_HANDSHAKES_PER_IP`, `max_conns_per_sender`)
    assert plane.refused == 1 and wire.closed, (plane.refused, wire.closed)
    assert plane._handshaking == 0 and not plane._handshaking_from and not plane._by_sender


_ACK_BYTES = direct.LENGTH_BYTES + len(direct.ACCEPTED) + channel.TAG_BYTES


def fuzz_direct_frames(messages: list[tuple[bytes, bytes]], flips: list[int], raw: bytes | None) -> None:
    """Sealed (header, payload) frames after a handshake, with bits flipped (or any bytes)."""
    out, _ = channel.session(*_SESSION, dialler=True)
    frames = [part for message in messages for part in message]
    sent = b"".join(bytes(out.seal_framed(f, direct.LENGTH_BYTES, direct.BYTEORDER)) for f in frames)
    data = raw if raw is not None else _flipped(sent, flips)
    delivered: list[tuple[bytes, bytes]] = []
    plane = _Handshaken(_PEERS[0], _receiver(delivered))
    wire = asyncio.run(_connect(plane, data))
    # messages arrive whole, in order and unchanged, or the connection closes: nothing changed,
    # inserted or replayed on the path is delivered, and each delivered one is acknowledged once
    assert delivered == messages[: len(delivered)], (delivered, messages)
    assert data != sent or delivered == messages, (delivered, messages)
    assert len(wire.written) == _ACK_BYTES * len(delivered), len(wire.written)
    assert wire.closed and not plane._by_sender


_LOW_ORDER = [bytes(32), b"\x01" + bytes(31)]
"""X25519 points that give no shared secret."""
_hellos = _packed(
    st.fixed_dictionaries(
        {
            "pk": st.just(_PEERS[1].public_key) | st.binary(min_size=32, max_size=32),
            "n": st.binary(min_size=32, max_size=32),
            "x": st.sampled_from([_DIALLER_X, *_LOW_ORDER]) | st.binary(min_size=32, max_size=32),
            "s": st.binary(min_size=64, max_size=64),
        }
    )
)
"""Hellos of the right shape (each field its size), so that they reach the key agreement."""
