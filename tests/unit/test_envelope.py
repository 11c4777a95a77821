"""Signed envelopes and the DHT record validator: what passes, what is dropped and why."""

from __future__ import annotations

import random
import time

import msgpack
import pytest
from hivemind.dht.validation import DHTRecord
from nacl.signing import SigningKey

from p2p_trainer.net import envelope, records
from p2p_trainer.net.dht import shared_keys
from p2p_trainer.net.envelope import DropCounter, EnvelopeError, Signer
from p2p_trainer.net.record_validator import (
    MAX_RECORDS_PER_SIGNER,
    MAX_TTL_S,
    SignedRecordValidator,
    check_record,
)

pytestmark = pytest.mark.timeout(60)

ALICE, MALLORY = Signer(SigningKey(b"a" * 32)), Signer(SigningKey(b"m" * 32))
RUN_KEY = records.heartbeat_key("run")


def beat_body(peer_id: str) -> bytes:
    return records.Heartbeat(peer_id, 3, 100, 2.0, 50.0, "0.1.0", records.now()).encode()


def record(key: str, subkey: str | None, value: bytes, expiration: float) -> DHTRecord:
    """The record as hivemind hands it to a validator: DHTID key bytes, serialised subkey and value."""
    framed = bytes(msgpack.packb(value, use_bin_type=True))
    return DHTRecord(envelope.dht_key_bytes(key), envelope.subkey_bytes(subkey), framed, expiration)


def sealed(
    signer: Signer = ALICE, key: str = RUN_KEY, subkey: str | None = None, body: bytes | None = None
) -> tuple[str, str | None, bytes, float]:
    subkey = signer.peer_id if subkey is None and key == RUN_KEY else subkey
    expiration = records.now() + 30
    body = beat_body(signer.peer_id) if body is None else body
    return key, subkey, signer.seal(key, subkey, expiration, body), expiration


def reason(key: str, subkey: str | None, value: bytes, expiration: float) -> str | None:
    try:
        check_record(record(key, subkey, value, expiration), time.time())
    except EnvelopeError as e:
        return e.reason
    return None


def test_a_record_sealed_by_its_owner_passes_and_opens() -> None:
    key, subkey, value, expiration = sealed()
    assert reason(key, subkey, value, expiration) is None
    assert envelope.open_verified(value, key, subkey, expiration).body.startswith(b"\x8a")
    liveness = records.Liveness(ALICE.peer_id, "i", "live", "host", 1).encode()
    assert reason(*sealed(key=records.liveness_key(ALICE.peer_id), body=liveness)) is None
    definition = records.RunDefinition({"seed": 0}).encode()
    assert (
        reason(*sealed(key=records.run_definition_key("run"), subkey=ALICE.peer_id, body=definition)) is None
    )


def test_forged_and_replayed_records_are_refused() -> None:
    key, subkey, value, expiration = sealed()
    # someone else's heartbeat, signed with the forger's own key
    assert reason(*sealed(MALLORY, subkey=ALICE.peer_id, body=beat_body(ALICE.peer_id))) == "wrong-owner"
    # the forger's own slot, but a body claiming to be Alice
    assert reason(*sealed(MALLORY, body=beat_body(ALICE.peer_id))) == "body"
    # Alice's valid record replayed under another run's key, another subkey, or a longer expiry
    assert reason(records.heartbeat_key("other"), subkey, value, expiration) == "wrong-key"
    assert reason(key, MALLORY.peer_id, value, expiration) == "wrong-owner"
    assert reason(key, subkey, value, expiration + 100) == "bad-signature"
    # a tampered body (the signature no longer matches)
    fields = msgpack.unpackb(value)
    fields["body"] = beat_body(ALICE.peer_id).replace(b"0.1.0", b"0.1.1")
    assert reason(key, subkey, msgpack.packb(fields, use_bin_type=True), expiration) == "bad-signature"
    # a liveness record for another identity
    liveness = records.Liveness(ALICE.peer_id, "i", "live", "host", 1).encode()
    assert reason(*sealed(MALLORY, key=records.liveness_key(ALICE.peer_id), body=liveness)) == "wrong-owner"


def test_unsigned_oversize_and_foreign_records_are_refused() -> None:
    expiration = records.now() + 30
    assert reason(RUN_KEY, ALICE.peer_id, beat_body(ALICE.peer_id), expiration) == "malformed"
    assert reason(RUN_KEY, ALICE.peer_id, b"x" * 10_000, expiration) == "oversize"
    assert reason("someone-elses/key", None, b"x", expiration) == "malformed"
    foreign = ALICE.seal("someone-elses/key", None, expiration, b"x")
    assert reason("someone-elses/key", None, foreign, expiration) == "foreign-key"
    # a regular value over the peers key would replace the whole subkey map
    plain = ALICE.seal(RUN_KEY, None, expiration, beat_body(ALICE.peer_id))
    assert reason(RUN_KEY, None, plain, expiration) == "foreign-key"
    forever = records.now() + 2 * MAX_TTL_S
    assert (
        reason(RUN_KEY, ALICE.peer_id, ALICE.seal(RUN_KEY, ALICE.peer_id, forever, b""), forever) == "expiry"
    )
    with pytest.raises(EnvelopeError, match="oversize"):
        ALICE.seal(RUN_KEY, ALICE.peer_id, expiration, b"x" * (envelope.MAX_BODY_BYTES + 1))


def test_the_validator_counts_drops_and_logs_once_per_period(caplog: pytest.LogCaptureFixture) -> None:
    drops = DropCounter("test node", log_period_s=3600.0)
    validator = SignedRecordValidator(drops)
    key, subkey, value, expiration = sealed()
    assert validator.validate(record(key, subkey, value, expiration))
    with caplog.at_level("WARNING", logger=envelope.__name__):
        for _ in range(50):
            assert not validator.validate(record(key, MALLORY.peer_id, value, expiration))
        assert not validator.validate(record(key, subkey, b"garbage", expiration))
    assert drops.counts() == {"wrong-owner": 50, "malformed": 1}
    assert len(caplog.records) == 2  # one line per reason, not one per record


def _definition(signer: Signer, run: str, ttl_s: float = 30.0) -> DHTRecord:
    """`signer`'s run definition of `run`: any run name is a new key, as a flood would use."""
    key, expiration = records.run_definition_key(run), records.now() + ttl_s
    body = records.RunDefinition({"seed": 0}).encode()
    return record(key, signer.peer_id, signer.seal(key, signer.peer_id, expiration, body), expiration)


def test_one_signer_fills_at_most_its_quota_of_slots_and_replaces_its_own() -> None:
    drops = DropCounter("test node", log_period_s=3600.0)
    validator = SignedRecordValidator(drops)
    assert MAX_RECORDS_PER_SIGNER == 64
    flood = [_definition(MALLORY, f"run{i}") for i in range(100)]
    passed = [validator.validate(r) for r in flood]
    assert passed == [True] * 64 + [False] * 36
    assert drops.counts() == {"quota": 36}
    assert validator.validate(_definition(MALLORY, "run3"))  # a new record in a slot it holds
    assert validator.validate(_definition(ALICE, "run99"))  # another signer's slots are its own
    assert validator.validate(record(*sealed(ALICE)))
    # the slots come back once their records expire
    later = SignedRecordValidator(DropCounter("t", 3600.0))
    for i in range(64):
        assert later.validate(_definition(MALLORY, f"short{i}", ttl_s=0.5))
    assert not later.validate(_definition(MALLORY, "one-more"))
    time.sleep(0.6)
    assert later.validate(_definition(MALLORY, "one-more"))
    assert later.quota is not None and later.quota.held(MALLORY.peer_id) == 1
    unbounded = SignedRecordValidator(DropCounter("t", 3600.0), max_per_signer=None)
    assert all(unbounded.validate(r) for r in flood)


def test_a_signer_past_its_quota_still_has_its_entry_in_this_nodes_swarm_records() -> None:
    """A refused entry makes hivemind refuse the whole record read from another node: a signer
    that filled its slots must not be able to blank the swarm's heartbeats or run definitions."""
    swarm = shared_keys("run")
    assert len(swarm) == 3
    validator = SignedRecordValidator(DropCounter("t", 3600.0), shared_keys=swarm)
    assert all(validator.validate(_definition(MALLORY, f"junk{i}")) for i in range(MAX_RECORDS_PER_SIGNER))
    assert not validator.validate(_definition(MALLORY, "one-more"))
    assert validator.validate(_definition(MALLORY, "run"))  # the swarm's run definitions
    assert validator.validate(record(*sealed(MALLORY)))  # its heartbeats (RUN_KEY is "run"'s)
    assert not validator.validate(_definition(MALLORY, "other-run"))


def _mutations(rng: random.Random, valid: bytes, n: int) -> list[bytes]:
    """Random bytes, and copies of a valid envelope with bytes flipped, cut or appended."""
    out = []
    for _ in range(n):
        choice = rng.randrange(4)
        if choice == 0:
            out.append(rng.randbytes(rng.randrange(6000)))
        elif choice == 1:
            flipped = bytearray(valid)
            for _ in range(rng.randrange(1, 4)):
                flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
            out.append(bytes(flipped))
        elif choice == 2:
            out.append(valid[: rng.randrange(len(valid))])
        else:
            out.append(valid + rng.randbytes(rng.randrange(1, 64)))
    return out


def test_garbage_and_mutated_envelopes_are_refused_without_raising() -> None:
    rng = random.Random(0)
    key, subkey, value, expiration = sealed()
    validator = SignedRecordValidator(DropCounter("fuzz", log_period_s=3600.0))
    expirations = [expiration, float("nan"), float("inf"), -1.0]
    for i, data in enumerate(_mutations(rng, value, 1500)):
        sub = envelope.subkey_bytes(subkey) if i % 3 else rng.randbytes(rng.randrange(40))
        for framed in (data, bytes(msgpack.packb(data, use_bin_type=True))):
            rec = DHTRecord(envelope.dht_key_bytes(key), sub, framed, expirations[i % 4])
            assert not validator.validate(rec) or (data == value and i % 4 == 0)
    maps = [{name: rng.randbytes(rng.randrange(80)) for name in rng.sample(FIELDS, 5)} for _ in range(300)]
    for fields in maps:
        with pytest.raises(EnvelopeError):
            opened = envelope.open_envelope(bytes(msgpack.packb(fields, use_bin_type=True)))
            envelope.verify(opened, envelope.dht_key_bytes(key), envelope.subkey_bytes(subkey), expiration)


FIELDS = ["v", "key", "pk", "sig", "body", "x"]


# a speed target: a bench (`make bench-check`), since a loaded machine would fail it spuriously
@pytest.mark.bench
def test_sealing_and_verifying_cost_tens_of_microseconds() -> None:
    key, subkey, value, expiration = sealed()
    rec, n = record(key, subkey, value, expiration), 200
    t0 = time.perf_counter()
    for _ in range(n):
        ALICE.seal(key, subkey, expiration, beat_body(ALICE.peer_id))
    t1 = time.perf_counter()
    for _ in range(n):
        check_record(rec, time.time())
    t2 = time.perf_counter()
    seal_us, check_us = (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6
    # a heartbeat every 2 s per peer: even 1 ms per record would be 0.05% of one core
    assert seal_us < 1000 and check_us < 1000, (seal_us, check_us)
