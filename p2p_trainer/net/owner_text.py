"""Statements a swarm owner signs and hands around as text: invitations and revocations.

Both are the base64 of a msgpack map, read with bounds on every string and byte field before
anything else looks at it, and signed with the owner's Ed25519 key over a domain prefix of their
own and the msgpack of the fields they vouch for, so that one kind of statement can never pass
for the other.
"""

from __future__ import annotations

import base64
from typing import Any

import msgpack
import nacl.exceptions
import nacl.signing

MAX_NAME_CHARS = 128
"""Longest swarm name or peer id a statement carries."""


def encode(fields: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(msgpack.packb(fields, use_bin_type=True)).decode()


def decode(text: object, max_chars: int, noun: str, command: str, error: type[ValueError]) -> dict[Any, Any]:
    """The map in `text`, a `noun` ("an invitation") that `p2p-trainer command` wrote; raises
    `error` for text of the wrong size or anything that is not a bounded msgpack map."""
    if not isinstance(text, str) or not 0 < len(text) <= max_chars:
        raise error(f"{noun} is 1 to {max_chars} characters of text")
    try:
        raw = base64.urlsafe_b64decode(text.strip().encode("ascii"))
        fields = msgpack.unpackb(raw, raw=False, max_str_len=MAX_NAME_CHARS, max_bin_len=64)
    except Exception:  # base64, ascii and msgpack each raise their own types for malformed input
        raise error(f"not {noun} written by `p2p-trainer {command}`") from None
    if not isinstance(fields, dict):
        raise error(f"not {noun} written by `p2p-trainer {command}`")
    return fields


def signed_bytes(domain: bytes, vouched: list[Any]) -> bytes:
    """What the owner signs: the statement kind's domain prefix and the fields it vouches for."""
    return domain + bytes(msgpack.packb(vouched, use_bin_type=True))


def verify(public_key: bytes, message: bytes, signature: bytes, error: type[ValueError]) -> None:
    """Raise `error` unless `public_key` signed `message`."""
    try:
        nacl.signing.VerifyKey(public_key).verify(message, signature)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.CryptoError):
        raise error("its signature does not verify with the owner key it names") from None


def check_names(swarm: str, peer_id: str, error: type[ValueError]) -> None:
    """Raise `error` unless both names fit what `decode` reads back."""
    if not 0 < len(swarm) <= MAX_NAME_CHARS or not 0 < len(peer_id) <= MAX_NAME_CHARS:
        raise error(f"a swarm name and a peer id have 1 to {MAX_NAME_CHARS} characters")
