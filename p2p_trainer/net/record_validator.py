"""The DHT record validator every node of ours installs: only signed, owner-bound records pass.

hivemind calls `validate` when another node asks this one to store a record and when a node
returns a record this one asked for, so an unsigned or forged record is neither stored here nor
returned to our code. A record passes only as a valid envelope (`envelope.py`) whose signer owns
the key, and whose body, for heartbeats and liveness records, names that same peer. Signing
happens in our own process before the store (see `envelope.py` for why), so `sign_value` and
`strip_value` are hivemind's defaults: the value stays the envelope, and `records.py` opens it.

The validator also bounds what any one signer can make this node hold: at most
`max_per_signer` distinct (key, subkey) slots with an unexpired record at a time. Keys are cheap
to make up (a run name is any string), so without the bound one identity could fill a node's
storage with a flood of valid records under new keys. An honest peer holds a few slots per run
(heartbeat, run definition, revocations) and one liveness record; a record that replaces one in
a slot the signer already holds always passes.

The bound never applies to the keys of this node's own swarm (`shared_keys`: its heartbeats, run
definitions and revocations). Those records hold one entry per peer, and hivemind refuses a whole
record read from another node when one entry fails: a signer whose slots here were filled with
junk could otherwise add its entry to the swarm's heartbeats and blank the whole view, or the run
definition a joiner needs. Their subkey is the signer's own id, so each holds one entry per signer
anyway; what the bound limits is the number of keys.

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


MAX_RECORDS_PER_SIGNER = 64
"""Distinct unexpired (key, subkey) slots one signer's records may fill on a node (about 300 KB of
envelopes): room for an honest peer in a dozen runs at once."""
_SWEEP_EVERY = 1024
"""Validations between two sweeps that forget signers whose every record has expired."""


def check_record(record: DHTRecord, now: float) -> str:
    """The signer of `record` (as hivemind hands it to a validator); raises `EnvelopeError` unless
    the record is ours and sound."""
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
    return sealed.signer


class SignerQuota:
    """The slots each signer's unexpired records fill (see the module docstring)."""

    def __init__(self, max_per_signer: int) -> None:
        if max_per_signer < 1:
            raise ValueError(f"max_per_signer must be at least 1, got {max_per_signer}")
        self.max_per_signer = max_per_signer
        self._slots: dict[str, dict[tuple[bytes, bytes], float]] = {}
        self._checks = 0

    def admit(self, signer: str, record: DHTRecord, now: float) -> None:
        """Count `record` in its signer's slots; raises `EnvelopeError` if it needs a new slot and
        the signer's are full."""
        self._checks += 1
        if self._checks % _SWEEP_EVERY == 0:
            self._sweep(now)
        slots = self._slots.setdefault(signer, {})
        slot = (record.key, record.subkey)
        if slot not in slots:
            for held in [s for s, expiration in slots.items() if expiration < now]:
                del slots[held]
            if len(slots) >= self.max_per_signer:
                raise EnvelopeError(
                    "quota",
                    f"{signer[-8:]} already holds {len(slots)} records here (at most {self.max_per_signer})",
                )
        slots[slot] = max(slots.get(slot, 0.0), record.expiration_time)

    def _sweep(self, now: float) -> None:
        for signer in [s for s, slots in self._slots.items() if all(e < now for e in slots.values())]:
            del self._slots[signer]

    def held(self, signer: str) -> int:
        """Slots `signer` holds (expired ones included until they are swept)."""
        return len(self._slots.get(signer, {}))


class SignedRecordValidator(RecordValidatorBase):
    """Accepts only records sealed by their owner (`check_record`), up to `max_per_signer` slots per
    signer outside `shared_keys` (`SignerQuota`; None: no bound); counts the rest."""

    def __init__(
        self,
        drops: DropCounter,
        max_per_signer: int | None = MAX_RECORDS_PER_SIGNER,
        shared_keys: frozenset[bytes] = frozenset(),
    ) -> None:
        """`shared_keys`: DHT keys (`envelope.dht_key_bytes`) the bound never applies to."""
        self.drops = drops
        self.quota = None if max_per_signer is None else SignerQuota(max_per_signer)
        self.shared_keys = shared_keys

    def validate(self, record: DHTRecord) -> bool:
        try:
            now = time.time()
            signer = check_record(record, now)
            if self.quota is not None and record.key not in self.shared_keys:
                self.quota.admit(signer, record, now)
        except EnvelopeError as e:
            self.drops.count(e.reason, str(e))
            return False
        except Exception as e:  # a validator that raises would break the DHT's request handling
            self.drops.count("malformed", f"{type(e).__name__}: {e}")
            return False
        return True
