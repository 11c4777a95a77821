"""Targets for the decoders of records and signed statements: DHT record bodies, signed envelopes,
invitations, revocations, and the DHT record validator."""

from __future__ import annotations

import contextlib
import math

import msgpack
import nacl.signing
from hivemind.dht.validation import DHTRecord
from hypothesis import strategies as st

from bench.fuzz.inputs import _PEERS, _changed_chars, _flipped, _mutated_map, _peer_ids
from p2p_trainer.config.security import SecurityConfig
from p2p_trainer.net import envelope, records, revocation
from p2p_trainer.net.admission import Admission, Invitation, InvitationError, issue
from p2p_trainer.net.record_validator import MAX_TTL_S, check_record


def fuzz_heartbeat_record(raw: bytes) -> None:
    with contextlib.suppress(records.RecordError):
        records.Heartbeat.decode(raw)


def fuzz_liveness_record(raw: bytes) -> None:
    with contextlib.suppress(records.RecordError):
        records.Liveness.decode(raw)


def fuzz_run_definition(raw: bytes) -> None:
    with contextlib.suppress(records.RecordError):
        records.RunDefinition.decode(raw)


_SIGNER = nacl.signing.SigningKey(bytes(range(32)))
_VALID = envelope.Signer(_SIGNER).seal("p2p-trainer/fuzz/peers", None, 1e9, b"body")


def fuzz_envelope(raw: bytes, flips: list[int]) -> None:
    data = _flipped(raw if raw else _VALID, flips)
    with contextlib.suppress(envelope.EnvelopeError):
        envelope.open_verified(data, "p2p-trainer/fuzz/peers", None, 1e9)


_OWNER = nacl.signing.SigningKey(bytes(range(1, 33)))
_OWNER_ID = envelope.Signer(_OWNER).peer_id
_INVITATION = issue(_OWNER, "fuzz", "12D3KooWfuzz", 4e9).encode()
_CLOSED_SWARM = SecurityConfig(admission="invitations", owners=(_OWNER_ID,))
_ADMISSION = Admission(_CLOSED_SWARM, "fuzz")


def fuzz_invitation(text: str, flips: list[int]) -> None:
    mutated = _changed_chars(text if text else _INVITATION, flips)
    with contextlib.suppress(InvitationError):
        Invitation.decode(mutated).verify()
    why = _ADMISSION.refusal("12D3KooWfuzz", mutated, now=1e9)
    assert why is None or isinstance(why, str), why


_REVOKED = revocation.revoke(_OWNER, "fuzz", _PEERS[2].peer_id)
"""The one revocation an owner of the fuzzed swarm signed."""
_REVOCATIONS = [
    _REVOKED.encode(),
    revocation.revoke(_OWNER, "elsewhere", _PEERS[3].peer_id).encode(),  # the owner's, another swarm
    revocation.revoke(_SIGNER, "fuzz", _PEERS[1].peer_id).encode(),  # signed by no owner
]


def fuzz_revocation(text: str, flips: list[int]) -> None:
    mutated = _changed_chars(text if text else _REVOKED.encode(), flips)
    with contextlib.suppress(revocation.RevocationError):
        # only the owner's own statement passes, however its text was changed on the way
        assert revocation.check(mutated, [_OWNER_ID], "fuzz") == _REVOKED, mutated


_NOW = 1e9
"""The validator's clock in `fuzz_record_validator`."""
_SLOTS = ("peers", "definition", "revocations", "identity", "foreign")
"""Where a record is stored: a run's keys (subkey: its owner), an identity key, a key not ours."""


def _slot(slot: str, owner: int) -> tuple[str, str | None]:
    peer = _PEERS[owner].peer_id
    if slot == "identity":
        return records.liveness_key(peer), None
    if slot == "foreign":
        return f"elsewhere/{peer}", None
    return f"{records.KEY_PREFIX}/fuzz/{slot}", peer


def fuzz_record_validator(
    slot: str, owner: int, sealer: int, body: int | bytes, expires_in: float, flips: list[int]
) -> None:
    """A record as hivemind hands it to the validator: built (stored for `owner`, sealed by
    `sealer`, a body naming peer `body` or raw bytes, bits of key, subkey and value flipped);
    exactly the sound ones pass."""
    key, subkey = _slot(slot, owner)
    named = body if isinstance(body, int) else None
    if isinstance(body, int):
        body = records.Liveness(_PEERS[body].peer_id, "i", "live", "h", 1).encode()
    expiration = _NOW + expires_in
    sealed = _PEERS[sealer].seal(key, subkey, expiration, body[: envelope.MAX_BODY_BYTES])
    parts = [envelope.dht_key_bytes(key), envelope.subkey_bytes(subkey), msgpack.packb(sealed)]
    whole = b"".join(parts)
    changed = _flipped(whole, flips)
    cut1, cut2 = len(parts[0]), len(parts[0]) + len(parts[1])
    record = DHTRecord(changed[:cut1], changed[cut1:cut2], changed[cut2:], expiration)
    try:
        check_record(record, _NOW)
        accepted = True
    except envelope.EnvelopeError:
        accepted = False
    sound = (
        slot != "foreign"
        and sealer == owner
        and changed == whole
        and math.isfinite(expiration)
        and expiration <= _NOW + MAX_TTL_S
        and (slot not in ("peers", "identity") or named == owner)  # such bodies name their signer
    )
    assert accepted == sound, (slot, owner, sealer, named, expires_in, flips)


def fuzz_raw_record(key: bytes, subkey: bytes, value: bytes, expiration: float) -> None:
    """A record of arbitrary bytes passes no validator: none is signed for where it is stored."""
    with contextlib.suppress(envelope.EnvelopeError):
        check_record(DHTRecord(key, subkey, value, expiration), _NOW)
        raise AssertionError(f"the validator took an unsigned record {value[:40]!r}")


_revocation_maps = st.one_of(
    _mutated_map(["s", "p", "o", "g"]),
    st.fixed_dictionaries(
        {"s": st.text(max_size=20), "p": _peer_ids, "o": st.binary(min_size=32, max_size=32)},
        optional={"g": st.binary(min_size=64, max_size=64)},
    ),
)
