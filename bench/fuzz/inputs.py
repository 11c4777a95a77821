"""The inputs the targets draw on: hostile scalars and maps, bit flips, frames and what follows
them on a stream, heartbeats as a decoder lets them through, and the peers whose keys seal records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack
import nacl.signing
from hypothesis import strategies as st

from p2p_trainer.net import direct, envelope, records
from p2p_trainer.net.identity import B58_ALPHABET

U64 = 2**64 - 1
"""msgpack's largest unsigned integer: the largest int a decoder can be handed."""

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=U64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=300),
    st.binary(max_size=300),
)
_values = st.recursive(
    _scalars,
    max_leaves=12,
    extend=lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner, max_size=6)
    ),
)
_peer_ids = st.text(alphabet=B58_ALPHABET, min_size=1, max_size=60)
_flips = st.lists(st.integers(0, 10_000), max_size=4)
"""Bits to flip in a valid input (`_flipped`): changed inputs reach the checks behind the parser."""


def _mutated_map(names: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Maps whose keys are drawn mostly from a decoder's field names, with hostile values."""
    keys = st.one_of(st.sampled_from(names), st.text(max_size=12))
    return st.dictionaries(keys, _values, max_size=len(names) + 3)


def _packed(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    return strategy.map(lambda v: bytes(msgpack.packb(v, use_bin_type=True)))


def _raw_or_packed(names: list[str]) -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=6000), _packed(_mutated_map(names)), _packed(_values))


def _flipped(data: bytes, flips: Sequence[int]) -> bytes:
    """`data` with one bit flipped per entry of `flips` (which names a byte and, mod 8, its bit)."""
    out = bytearray(data)
    for at in flips:
        if out:
            out[at % len(out)] ^= 1 << (at % 8)
    return bytes(out)


def _changed_chars(text: str, flips: Sequence[int]) -> str:
    """`text` with one character changed per entry of `flips` (text statements: base64)."""
    chars = list(text)
    for at in flips:
        if chars:
            chars[at % len(chars)] = chr(ord(chars[at % len(chars)]) ^ 1)
    return "".join(chars)


def frame(data: bytes) -> bytes:
    """A length-prefixed frame, as p2pd streams and the direct data plane both carry them."""
    return len(data).to_bytes(direct.LENGTH_BYTES, direct.BYTEORDER) + data


HEARTBEAT_FIELDS = [f for f in records.Heartbeat.__dataclass_fields__]
LIVENESS_FIELDS = [f for f in records.Liveness.__dataclass_fields__]


def _heartbeats() -> st.SearchStrategy[records.Heartbeat]:
    """Heartbeats as a decoder lets them through: finite, non-negative, any magnitude."""
    big = st.floats(min_value=0.0, max_value=1.7e308, allow_nan=False, allow_infinity=False)
    return st.builds(
        records.Heartbeat,
        peer_id=_peer_ids,
        round=st.integers(min_value=0, max_value=U64),
        tokens_processed=st.integers(min_value=0, max_value=U64),
        loss=st.none() | big,
        throughput_tokens_per_s=big,
        software_version=st.text(min_size=1, max_size=20),
        timestamp=big,
        leaving=st.booleans(),
        round_started=big,
        suspects=st.lists(_peer_ids, max_size=4).map(tuple),
        excludes=st.lists(_votes, max_size=records.MAX_EXCLUDES).map(tuple),
    )


_PEERS = [envelope.Signer(nacl.signing.SigningKey(bytes([60 + i]) * 32)) for i in range(4)]
"""The peers of the targets that store records or open streams: each record is stored under one
peer's name and sealed by one peer's key, the right one or not. `_PEERS[0]` is the joiner."""
_peer_index = st.integers(0, len(_PEERS) - 1)

_votes = st.tuples(
    st.sampled_from([p.peer_id for p in _PEERS]) | _peer_ids,
    st.integers(0, 64) | st.integers(0, records.MAX_STEPS - 2),
    st.integers(1, 64) | st.integers(1, records.MAX_STEPS),
).map(lambda v: (v[0], v[1], min(v[1] + v[2], records.MAX_STEPS - 1)))
"""Votes (`exclusion.py`) as the decoder lets them through (first < end < MAX_STEPS), often naming
the targets' peers over rounds near theirs, so that a liar's votes against honest peers are tried."""

_lengths = st.integers(0, U64).map(lambda n: n.to_bytes(direct.LENGTH_BYTES, direct.BYTEORDER))
"""A frame's declared length, any: its bound must be checked before anything of that size is read."""
_tails = st.one_of(st.binary(max_size=16), st.tuples(_lengths, st.binary(max_size=16)).map(b"".join))
"""What a stream carries after its frames: nothing, junk, or a frame that announces any size."""
