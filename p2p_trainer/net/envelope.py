"""Signed record envelopes: every value we store in the DHT is signed by its owner's Ed25519 key.

An envelope is a msgpack map `{v, key, pk, sig, body}`: the schema version, the record's key as
text, the signer's 32-byte public key, a 64-byte signature and the record body (our own msgpack
bytes). The signature covers a domain-separation prefix, the record's DHT key bytes (the DHTID
hivemind derives from the key), its subkey bytes (the msgpack form hivemind stores), its
expiration time and the body, so a record cannot be replayed under another key or subkey, nor
stored again with a longer expiry.

Binding: the key says whose record it is (`owner`): the subkey of a run's `peers`, `definition`
and `revocations` keys, the peer id in an identity key. The signer's peer id must be that owner, so
anyone can write records only for the identities whose keys it holds.

We sign in our own process before `dht.store` (`Signer.seal`) rather than in the validator's
`sign_value`: the DHT process then never holds the private key, the attack tools can seal a
forged record with any key through the same code, and a node without the validator (defences off)
still publishes signed records. The validator (`record_validator.py`) only verifies.

Decoding is bounded before anything is allocated or verified: the raw size first, then msgpack
with per-type limits, then the field types and sizes, and only then the signature.
"""

from __future__ import annotations

import functools
import logging
import math
import multiprocessing
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgpack
import nacl.exceptions
import nacl.signing
from hivemind.dht.routing import DHTID
from hivemind.utils.serializer import MSGPackSerializer

from p2p_trainer.net.identity import peer_id_from_public_key

logger = logging.getLogger(__name__)

VERSION = 1
DOMAIN = b"p2p-trainer/signed-record/v1\x00"
KEY_PREFIX = "p2p-trainer"
MAX_BODY_BYTES = 4096
"""Largest record body (`records.MAX_RECORD_BYTES`)."""
MAX_KEY_CHARS = 256
MAX_ENVELOPE_BYTES = MAX_BODY_BYTES + MAX_KEY_CHARS + 160
"""Body, key, public key, signature and msgpack framing."""
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
_MAX_SUBKEY_BYTES = 160


class EnvelopeError(ValueError):
    """A value that is not a well-formed, validly signed envelope; the message says why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class Envelope:
    """A decoded envelope (its signature not necessarily checked: see `verify`)."""

    version: int
    key: str
    public_key: bytes
    signature: bytes
    body: bytes

    @property
    def signer(self) -> str:
        """The signer's libp2p peer id."""
        return _peer_id(self.public_key)


@functools.lru_cache(maxsize=4096)
def _peer_id(public_key: bytes) -> str:
    """Cached: base58 costs more than the signature check, and the same few keys sign every period
    (the cache is bounded, so a flood of new keys only evicts)."""
    return peer_id_from_public_key(public_key)


@functools.lru_cache(maxsize=1024)
def _dht_key_bytes(key: str) -> bytes:
    return bytes(DHTID.generate(source=key).to_bytes())


def dht_key_bytes(key: str) -> bytes:
    """The DHTID bytes hivemind stores `key` under (what a validator sees as `record.key`)."""
    return _dht_key_bytes(key)


def subkey_bytes(subkey: str | None) -> bytes:
    """The subkey as hivemind serialises it; None (a value without subkeys) is its regular-value tag."""
    return bytes(MSGPackSerializer.dumps(subkey))


def signed_message(key_bytes: bytes, subkey: bytes, expiration_time: float, body: bytes) -> bytes:
    """What the signature covers: domain, DHT key, subkey, expiration and body (lengths prefixed)."""
    return b"".join(
        [
            DOMAIN,
            struct.pack(">H", len(key_bytes)),
            key_bytes,
            struct.pack(">H", len(subkey)),
            subkey,
            struct.pack(">d", expiration_time),
            body,
        ]
    )


class Signer:
    """Seals record bodies with one node's identity key."""

    def __init__(self, signing_key: nacl.signing.SigningKey) -> None:
        self._key = signing_key
        self.public_key = bytes(signing_key.verify_key)
        self.peer_id = peer_id_from_public_key(self.public_key)

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of `message` (callers add their own domain prefix)."""
        return bytes(self._key.sign(message).signature)

    def seal(self, key: str, subkey: str | None, expiration_time: float, body: bytes) -> bytes:
        """The envelope bytes to store under (`key`, `subkey`) until `expiration_time`."""
        if len(body) > MAX_BODY_BYTES or len(key) > MAX_KEY_CHARS:
            raise EnvelopeError("oversize", f"body of {len(body)} bytes or key of {len(key)} chars")
        message = signed_message(dht_key_bytes(key), subkey_bytes(subkey), expiration_time, body)
        signature = self._key.sign(message).signature
        fields = {"v": VERSION, "key": key, "pk": self.public_key, "sig": signature, "body": body}
        return bytes(msgpack.packb(fields, use_bin_type=True))


def open_envelope(data: object) -> Envelope:
    """Decode (not verify) an envelope; raises `EnvelopeError` for anything malformed."""
    if not isinstance(data, bytes):
        raise EnvelopeError("malformed", f"expected bytes, got {type(data).__name__}")
    if len(data) > MAX_ENVELOPE_BYTES:
        raise EnvelopeError("oversize", f"{len(data)} bytes, more than {MAX_ENVELOPE_BYTES}")
    try:
        fields = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_bin_len=MAX_BODY_BYTES,
            max_str_len=MAX_KEY_CHARS,
            max_array_len=0,
            max_map_len=8,
            max_ext_len=0,
        )
    except Exception as e:  # msgpack raises several types for malformed input
        raise EnvelopeError("malformed", f"not an envelope: {type(e).__name__}") from None
    if not isinstance(fields, dict) or set(fields) != {"v", "key", "pk", "sig", "body"}:
        raise EnvelopeError("malformed", "expected a map of v, key, pk, sig, body")
    version, key, pk, sig, body = (fields[name] for name in ("v", "key", "pk", "sig", "body"))
    if version != VERSION or isinstance(version, bool):
        raise EnvelopeError("malformed", f"schema version {version!r}, expected {VERSION}")
    if not isinstance(key, str) or not isinstance(body, bytes):
        raise EnvelopeError("malformed", "key must be text and body bytes")
    if not isinstance(pk, bytes) or len(pk) != PUBLIC_KEY_BYTES:
        raise EnvelopeError("malformed", "public key is not 32 bytes")
    if not isinstance(sig, bytes) or len(sig) != SIGNATURE_BYTES:
        raise EnvelopeError("malformed", "signature is not 64 bytes")
    return Envelope(version, key, pk, sig, body)


def owner(key: str, subkey: object) -> str:
    """The peer id that must have signed a record under (`key`, `subkey`); raises for foreign keys."""
    if not key.startswith(KEY_PREFIX + "/"):
        raise EnvelopeError("foreign-key", f"key {key[:40]!r} is not one of ours")
    if isinstance(subkey, str) and key.rsplit("/", 1)[-1] in ("peers", "definition", "revocations"):
        return subkey
    identity_prefix = f"{KEY_PREFIX}/identity/"
    if subkey is None and key.startswith(identity_prefix):
        return key[len(identity_prefix) :]
    raise EnvelopeError("foreign-key", f"key {key[:40]!r} with subkey {subkey!r} is not one of ours")


def verify(envelope: Envelope, key_bytes: bytes, subkey: bytes, expiration_time: float) -> None:
    """Raise `EnvelopeError` unless the envelope is signed, for this key, subkey and expiry, by its
    owner. `subkey` is the serialised subkey, as a validator receives it."""
    if len(subkey) > _MAX_SUBKEY_BYTES:
        raise EnvelopeError("malformed", f"subkey of {len(subkey)} bytes")
    if dht_key_bytes(envelope.key) != key_bytes:
        raise EnvelopeError("wrong-key", f"signed for {envelope.key[:40]!r}, stored under another key")
    try:
        subkey_value = msgpack.unpackb(subkey, raw=False, max_str_len=_MAX_SUBKEY_BYTES)
    except Exception:
        raise EnvelopeError("malformed", "subkey is not msgpack") from None
    expected = owner(envelope.key, subkey_value)
    if envelope.signer != expected:
        raise EnvelopeError("wrong-owner", f"record of {expected[-8:]} signed by {envelope.signer[-8:]}")
    if not math.isfinite(expiration_time):
        raise EnvelopeError("malformed", f"expiration time {expiration_time}")
    message = signed_message(key_bytes, subkey, expiration_time, envelope.body)
    try:
        nacl.signing.VerifyKey(envelope.public_key).verify(message, envelope.signature)
    except (nacl.exceptions.BadSignatureError, ValueError, TypeError):
        raise EnvelopeError(
            "bad-signature", f"signature of {expected[-8:]}'s record does not verify"
        ) from None


def open_verified(data: object, key: str, subkey: str | None, expiration_time: float) -> Envelope:
    """`open_envelope` then `verify`, for a value read back as (`key`, `subkey`, `expiration_time`)."""
    envelope = open_envelope(data)
    verify(envelope, dht_key_bytes(key), subkey_bytes(subkey), expiration_time)
    return envelope


REASONS = (
    "malformed",
    "oversize",
    "foreign-key",
    "wrong-key",
    "wrong-owner",
    "bad-signature",
    "body",
    "expiry",
    "implausible",
    "replay",
    "not-admitted",
    "quota",
)
"""Why a record was dropped: the counters' names."""


class DropCounter:
    """Records dropped, by reason, in shared memory (a forked DHT process counts into it too); one
    log line per reason per `log_period_s` at most, so a flood of bad records is not a log flood."""

    def __init__(self, what: str, log_period_s: float = 60.0) -> None:
        self.what, self.log_period_s = what, log_period_s
        self._counts = multiprocessing.get_context("fork").Array("q", len(REASONS))
        self._logged: dict[str, float] = {}
        self._lock = threading.Lock()

    def count(self, reason: str, detail: str) -> None:
        index = REASONS.index(reason) if reason in REASONS else 0
        with self._counts.get_lock():
            self._counts[index] += 1
            total = int(self._counts[index])
        now = time.monotonic()
        with self._lock:
            last = self._logged.get(reason)
            if last is not None and now - last < self.log_period_s:
                return
            self._logged[reason] = now
        logger.warning("%s: dropped a record (%s, %d so far): %s", self.what, reason, total, detail)

    def counts(self) -> dict[str, int]:
        """Drops so far, by reason (reasons with none left out)."""
        with self._counts.get_lock():
            values: Sequence[int] = self._counts[:]
        return {reason: int(n) for reason, n in zip(REASONS, values, strict=True) if n}


class DropTally:
    """What several drop counters counted since the last `take`: the round's share of them."""

    def __init__(self, sources: dict[str, Callable[[], dict[str, int]]]) -> None:
        self._sources = sources
        self._last: dict[tuple[str, str], int] = {}
        self.take()

    def take(self) -> list[tuple[str, str, int]]:
        """(source, reason, count) for each reason counted since the previous call."""
        grown = []
        for source, counts in self._sources.items():
            try:
                found = counts()
            except Exception as exc:  # a metrics line must not fail while the DHT process shuts down
                logger.debug("drop counts of %s unavailable: %s", source, exc)
                continue
            for reason, total in sorted(found.items()):
                before = self._last.get((source, reason), 0)
                self._last[(source, reason)] = total
                if total > before:
                    grown.append((source, reason, total - before))
        return grown


READ_DROPS = DropCounter("records read by this peer")
"""Records this process dropped when it read them (`records.py`)."""
