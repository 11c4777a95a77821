"""Targets for what arrives on p2pd streams: the stream header, contribution messages, the values
of every wire format (sized as the header says, so they reach each decoder's inner checks), the
members a part owner's result names, the donor's state header, a relayed message's meta frame,
the relay's routing frame, and dial-back requests and answers (the last two through their
handlers, over fakes)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
from hivemind.p2p import PeerID
from hypothesis import strategies as st

from bench.fuzz.fakes import _P2P, Wire, _stream, _StreamInfo
from bench.fuzz.inputs import _PEERS, _flipped, _mutated_map, _packed, _values, frame
from p2p_trainer.exchange.codecs import MAX_BLOCK, TAGS, decode, payload_size
from p2p_trainer.exchange.interface import Failed
from p2p_trainer.net import direct, message_relay, reach, records
from p2p_trainer.net.allreduce import _included
from p2p_trainer.net.state_sync import check_state_header
from p2p_trainer.net.transport import Message, MessageError, decode_header
from p2p_trainer.net.wire import check_message


def fuzz_stream_header(raw: bytes) -> None:
    with contextlib.suppress(MessageError):
        decode_header(raw)


def fuzz_contribution(header: dict[str, Any], payload: bytes, expected: int) -> None:
    out = check_message(Message("sender", header, payload), expected, 4.0)
    assert isinstance(out, str) or (len(out[0]) == expected and 0 < out[1] <= 4.0), out


def _sized_payloads(draw: Any) -> tuple[dict[str, Any], bytes, int]:
    n = draw(st.integers(0, 300))
    tag = draw(st.sampled_from(sorted(TAGS.values())))
    block = draw(st.one_of(st.integers(1, 64), st.sampled_from([0, MAX_BLOCK, MAX_BLOCK + 1])))
    k = draw(st.one_of(st.integers(1, max(1, block)), st.integers(-2, MAX_BLOCK + 2)))
    size = payload_size(tag, n, max(1, block), max(1, k))
    payload = draw(st.one_of(st.binary(min_size=size, max_size=size), st.binary(max_size=64)))
    return {"dt": tag, "b": block, "k": k}, payload, n


sized_payloads = st.composite(_sized_payloads)()
"""(header, payload, n): a wire format's header fields and, mostly, exactly as many bytes as the
header and `n` call for."""


def fuzz_wire_values(case: tuple[dict[str, Any], bytes, int]) -> None:
    header, payload, n = case
    out = decode(header, payload, n)
    assert isinstance(out, str) or (out.shape == (n,) and bool(np.isfinite(out).all())), out


def fuzz_result_members(members: Any, n: int) -> None:
    """The members an owner's result names decide how it is checked (§10): only distinct indices
    into the group that name the owner (index 0 here) pass."""
    out = _included(Message("owner", {"key": "k", "in": members}, b""), n, 0)
    assert out is None or (
        len(set(out)) == len(out) and 0 in out and all(type(i) is int and 0 <= i < n for i in out)
    ), out


def fuzz_state_header(header: dict[str, Any]) -> None:
    out = check_state_header(header, "12D3KooWfuzz")
    assert isinstance(out, Failed) or (out[0] >= 0 and all(0 <= t < 1e7 for t in out[1])), out


_RELAY_TARGET = _PEERS[2].peer_id
_META = message_relay.seal_meta(_PEERS[1], _RELAY_TARGET, b"header", b"payload")


def fuzz_relayed_meta(raw: bytes, flips: list[int]) -> None:
    """The meta frame a relayed message's target reads: a message passes only as its signer's."""
    meta = _flipped(raw if raw else _META, flips)
    try:
        claimed = message_relay.claimed_sender(meta)
        sender = message_relay.verified_sender(meta, _RELAY_TARGET, b"header", b"payload", claimed)
    except ValueError:
        return
    assert sender == _PEERS[1].peer_id, sender


RELAY_LIMITS = message_relay.RelayLimits(max_frame_bytes=1024, open_timeout_s=5.0, idle_timeout_s=5.0)
_MAX_FORWARDED = 3 * direct.LENGTH_BYTES + message_relay.MAX_META_BYTES + 2 * RELAY_LIMITS.max_frame_bytes


@dataclass(frozen=True)
class Relayed:
    """What a relay did with one stream."""

    service: message_relay.RelayService
    answered: bytes
    """The relay's answers to the sender."""
    forwarded: bytes
    """What reached the target."""


def relay(data: bytes, reachable: bool, eof: bool = True) -> Relayed:
    """Have a relay take one stream from `_PEERS[1]` carrying `data` (then ending, with `eof`);
    every target takes a stream and its message when `reachable`, none does otherwise."""

    async def handle() -> Relayed:
        p2p = _P2P(message_relay.OPEN if reachable else None)
        service = message_relay.RelayService(p2p, RELAY_LIMITS)  # type: ignore[arg-type]
        answered = Wire()
        info = _StreamInfo(PeerID.from_base58(_PEERS[1].peer_id))
        await service.handle(info, _stream(data, eof), answered)  # type: ignore[arg-type]
        return Relayed(service, bytes(answered.written), bytes(p2p.opened.written))

    return asyncio.run(handle())


_ANSWERS = {
    "forwarded": (message_relay.OPEN + message_relay.OPEN,),
    "probes": (message_relay.OPEN,),
    "refused": (b"", message_relay.CLOSED, message_relay.OPEN),
}
"""What the sender may be answered, by how the relay counted its stream."""


def fuzz_relay_route(route: bytes, frames: list[bytes], tail: bytes, reachable: bool) -> None:
    """A stream to a relay: its routing frame, the frames to forward, and any bytes after."""
    data = frame(route) + b"".join(map(frame, frames)) + tail
    out = relay(data, reachable)
    counted = {name: getattr(out.service, name) for name in _ANSWERS}
    # each stream is counted once and gives its slot back: one left held would refuse later senders
    assert sorted(counted.values()) == [0, 0, 1] and out.service._forwarding == 0, counted
    assert out.answered in _ANSWERS[max(counted, key=counted.__getitem__)], (counted, out.answered)
    # the target gets the sender's own bytes, never more than the relay's limits allow
    after_route = data[len(frame(route)) :]
    assert out.forwarded == after_route[: len(out.forwarded)], out.forwarded[:64]
    assert len(out.forwarded) <= _MAX_FORWARDED, len(out.forwarded)


_CHECKER = _PEERS[1].peer_id
_OWN_ADDRESSES = ["/ip4/10.0.0.2/tcp/4001"]


def fuzz_dialback_request(data: bytes) -> None:
    """What a dial-back checker reads from a requester's stream."""

    async def serve() -> Wire:
        answer = Wire()
        info = _StreamInfo(PeerID.from_base58(_CHECKER))
        await reach.serve_dialback(info, _stream(data), answer)  # type: ignore[arg-type]
        return answer

    answer = asyncio.run(serve())
    assert answer.closed
    if answer.written:  # one frame, naming a port in range and why it was not dialled
        size = int.from_bytes(answer.written[: direct.LENGTH_BYTES], direct.BYTEORDER)
        assert size == len(answer.written) - direct.LENGTH_BYTES, answer.written
        reply = msgpack.unpackb(bytes(answer.written[direct.LENGTH_BYTES :]))
        assert type(reply["port"]) is int and 0 < reply["port"] < 65536 and reply["error"], reply


def fuzz_dialback_answer(data: bytes) -> None:
    """A checker's answer (`data` on the stream) as the check and `join`'s advice read it."""
    checker = _P2P(data)
    found = asyncio.run(reach.check(checker, [_CHECKER], _OWN_ADDRESSES, 5.0))  # type: ignore[arg-type]
    assert found.port == 4001 and found.verdict in records.REACHABILITY, found
    assert (found.dialable is None) == (found.checker == ""), found
    assert all(isinstance(line, str) and line for line in reach.advice(found, "auto")), found


_relay_routes = st.one_of(
    _packed(
        st.fixed_dictionaries(
            {"to": st.sampled_from([_RELAY_TARGET, _PEERS[1].peer_id, "QmNotAPeer"]) | _values},
            optional={"probe": st.booleans() | _values},
        )
    ),
    _packed(_mutated_map(["to", "probe"])),
    st.binary(max_size=600),
)
