"""The DHT record validator every node of ours installs: only signed, owner-bound records pass.

hivemind calls `validate` when another node asks this one to store a record and when a node
returns a record this one asked for, so an unsigned or forged record is neither stored here nor
returned to our code. A record passes only as a valid envelope (`envelope.py`) whose signer owns
the key, and whose body, for heartbeats and liveness records, names that same peer. Signing
happens in our own process before the store (see `envelope.py` for why), so `sign_value` and
`strip_value` are hivemind's defaults: the value stays the envelope, and `records.py` opens it.

The validator runs inside the DHT process; its drops go to a `DropCounter` in shared memory that
the node reads (`NetNode.record_drops`).
"""

from __future__ import annotations

import time

import msgpack
from hivemind.dht.validation import DHTRecord, RecordValidatorBase

from p2p_trainer.net import envelope
from p2p_trainer.net.envelope import DropCounter, EnvelopeError

MAX_TTL_S = 7 * 24 * 3600.0
"""Longest lifetime a record may ask for; longer ones are refused (a record that never expires)."""
_MAX_VALUE_BYTES = envelope.MAX_ENVELOPE_BYTES + 8
"""The envelope inside hivemind's msgpack bin framing."""


def body_owner(key: str, body: bytes) -> str | None:
    """The peer id a heartbeat or liveness body names (None for bodies that name none)."""
    if key.startswith(f"{envelope.KEY_PREFIX}/identity/") or key.endswith("/peers"):
        try:
            fields = msgpack.unpackb(body, raw=False, max_bin_len=0, max_str_len=envelope.MAX_BODY_BYTES)
        except Exception:
            raise EnvelopeError("body", "body is not msgpack") from None
        peer = fields.get("peer_id") if isinstance(fields, dict) else None
        if not isinstance(peer, str):
            raise EnvelopeError("body", "body names no peer id")
        return peer
    return None


def check_record(record: DHTRecord, now: float) -> None:
    """Raise `EnvelopeError` unless `record` (as hivemind hands it to a validator) is ours and sound."""
    if not isinstance(record.value, bytes) or len(record.value) > _MAX_VALUE_BYTES:
        raise EnvelopeError("oversize", "value larger than an envelope")
    if record.expiration_time > now + MAX_TTL_S:
        raise EnvelopeError("expiry", f"expires {record.expiration_time - now:.0f} s from now")
    try:
        data = msgpack.unpackb(
            record.value, raw=False, max_bin_len=envelope.MAX_ENVELOPE_BYTES, max_str_len=0
        )
    except Exception:
        raise EnvelopeError("malformed", "value is not a msgpack bin") from None
    sealed = envelope.open_envelope(data)
    envelope.verify(sealed, record.key, record.subkey, record.expiration_time)
    named = body_owner(sealed.key, sealed.body)
    if named is not None and named != sealed.signer:
        raise EnvelopeError("body", f"body names {named[-8:]}, signed by {sealed.signer[-8:]}")


class SignedRecordValidator(RecordValidatorBase):
    """Accepts only records sealed by their owner (`check_record`); counts the rest."""

    def __init__(self, drops: DropCounter) -> None:
        self.drops = drops

    def validate(self, record: DHTRecord) -> bool:
        try:
            check_record(record, time.time())
        except EnvelopeError as e:
            self.drops.count(e.reason, str(e))
            return False
        except Exception as e:  # a validator that raises would break the DHT's request handling
            self.drops.count("malformed", f"{type(e).__name__}: {e}")
            return False
        return True
