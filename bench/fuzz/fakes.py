"""Fakes the handlers run over: a socket or stream end that keeps what is written (`Wire`, `feed`),
a stream's reading end, the p2pd under a relay or dial-back check, and a dict-backed DHT."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from hivemind.p2p import PeerID

from bench.fuzz.inputs import _PEERS, _flipped
from p2p_trainer.net import envelope, records
from p2p_trainer.net.frames import FrameReader


class Wire:
    """A socket under a `FrameReader`, or a stream's writing end: keeps what is written."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.paused = False

    def write(self, data: bytes | memoryview) -> None:
        self.written += data

    async def drain(self) -> None:
        """Nothing to wait for: what is written is kept."""

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("192.0.2.7", 40_000) if name == "peername" else default


async def feed(conn: FrameReader, data: bytes) -> Wire:
    """Have `conn` receive `data` as a socket hands it over, then close once its server waits for
    bytes that will not come; returns when the server task has ended, with what it wrote on the
    returned wire. The waits are counted in loop turns, not seconds: the same input, the same run."""
    wire = Wire()
    conn.connection_made(wire)  # type: ignore[arg-type]
    assert conn.task is not None
    sent, waits = 0, 0
    while sent < len(data) and waits < 1000:
        await asyncio.sleep(0)  # the server runs: it asks for its next frame, or closes
        if wire.closed:
            break
        if wire.paused:  # a socket hands nothing over until the reader asks for more
            waits += 1
            continue
        buffer = conn.get_buffer(-1)
        n = min(len(buffer), len(data) - sent)
        buffer[:n] = data[sent : sent + n]
        conn.buffer_updated(n)
        sent += n
    # the server takes in what it has (and answers it) before the other end closes
    while not conn.task.done() and (conn.started is None or conn.started.done()) and waits < 1000:
        waits += 1
        await asyncio.sleep(0)
    conn.connection_lost(None)
    await asyncio.wait_for(conn.task, 30.0)
    return wire


def _stream(data: bytes, eof: bool = True) -> asyncio.StreamReader:
    """A stream's reading end that holds `data` (then ends, with `eof`); inside a running loop."""
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


@dataclass(frozen=True)
class _StreamInfo:
    """What p2pd tells a stream handler of the stream's opener."""

    peer_id: PeerID
    addr: str = "/ip4/198.51.100.7/tcp/4001/p2p-circuit"
    """Relayed: a dial-back checker answers without dialling (that would open a real socket)."""


class _P2P:
    """The p2pd under a relay or a dial-back check: every stream it opens reads `answer` (with
    None none opens) and keeps what is written to it on `opened`."""

    def __init__(self, answer: bytes | None) -> None:
        self.answer = answer
        self.opened = Wire()

    async def call_binary_stream_handler(
        self, peer_id: PeerID, protocol: str
    ) -> tuple[None, asyncio.StreamReader, Wire]:
        if self.answer is None:
            raise ConnectionError(f"{peer_id} is out of reach")
        return None, _stream(self.answer), self.opened


class DictDHT:
    """A dict with hivemind's shapes: an entry has `.value` and `.expiration_time`; a key with
    subkeys holds a map of them."""

    @dataclass
    class Entry:
        value: Any
        expiration_time: float

    def __init__(self) -> None:
        self.data: dict[str, DictDHT.Entry] = {}

    def store(self, key: Any, value: Any, expiration_time: float, subkey: Any = None) -> bool:
        if subkey is None:
            self.data[key] = self.Entry(value, expiration_time)
        else:
            entry = self.data.setdefault(key, self.Entry({}, expiration_time))
            entry.value[subkey] = self.Entry(value, expiration_time)
        return True

    def get(self, key: Any, latest: bool = False) -> Any:
        return self.data.get(key)


def _store(
    dht: DictDHT, key: str, owner: int, sealer: int, body: bytes, flips: list[int], subkey: bool = True
) -> bool:
    """Store `body` for peer `owner` (under its subkey of `key`, or `key` itself), sealed by peer
    `sealer` and then bit-flipped; True if what is stored is what the owner's key sealed. A body
    no envelope can carry is not stored (cut short, it would be a record no one sealed whole)."""
    if len(body) > envelope.MAX_BODY_BYTES:
        return False
    expiration = records.now() + 600.0
    name = _PEERS[owner].peer_id if subkey else None
    sealed = _PEERS[sealer].seal(key, name, expiration, body)
    value = _flipped(sealed, flips)
    dht.store(key, value, expiration, subkey=name)
    return owner == sealer and value == sealed
