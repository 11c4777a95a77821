"""The hostile node's pieces without a swarm: attack names, message tampering, forged records."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from nacl.signing import SigningKey

from bench.fuzz.fakes import DictDHT
from p2p_trainer.lab.adversary.attacks import ATTACKS, parse_attack
from p2p_trainer.lab.adversary.forger import Forger, Seen
from p2p_trainer.lab.adversary.tamper import phase_of, tamper
from p2p_trainer.net import records
from p2p_trainer.net.envelope import Signer, open_envelope, open_verified

KEY = "run/mix2/3/0/abc123"
VALUES = np.array([0.5, -1.0, 2.0], dtype=np.float16)


def _sent(name: str, phase: str = "c") -> tuple[dict[str, object], np.ndarray] | None:
    header = {"key": f"{KEY}|{phase}|1", "w": 100.0, "dt": "f2", "n": VALUES.size}
    changed = tamper(parse_attack(name), header, VALUES.tobytes())
    if changed is None:
        return None
    out, payload = changed
    assert out["dt"] == "f4" and out["key"] == header["key"]
    return out, np.frombuffer(payload, dtype=np.float32)


def test_parse_attack_takes_defaults_and_refuses_unknown_names() -> None:
    assert parse_attack("scale").arg == ATTACKS["scale"][1]
    assert str(parse_attack("scale:1e6")) == "scale:1e+06"
    with pytest.raises(ValueError, match="unknown attack"):
        parse_attack("bogus")
    with pytest.raises(ValueError, match="must be a number"):
        parse_attack("flip:x")


def test_phase_of_reads_contributions_and_results() -> None:
    assert phase_of({"key": f"{KEY}|c|0"}) == "c"
    assert phase_of({"key": f"{KEY}|r|2"}) == "r"
    assert phase_of({"key": "state"}) == ""


def test_contribution_attacks_change_only_contributions() -> None:
    sent = _sent("scale:1e3")
    assert sent is not None and np.allclose(sent[1], VALUES.astype(np.float32) * 1e3)
    sent = _sent("flip:10")
    assert sent is not None and np.allclose(sent[1], VALUES.astype(np.float32) * -10)
    sent, again = _sent("drift:5"), _sent("drift:5")
    assert sent is not None and again is not None
    norm = float(np.linalg.norm(VALUES.astype(np.float64)))
    assert np.linalg.norm(sent[1]) == pytest.approx(5 * norm, rel=1e-5)
    assert not np.allclose(sent[1] / np.linalg.norm(sent[1]), VALUES / norm)
    assert np.array_equal(sent[1], again[1])  # the same direction every time
    sent = _sent("nan")
    assert sent is not None and np.isnan(sent[1]).all()
    sent = _sent("weight")
    assert sent is not None and sent[0]["w"] == pytest.approx(399.6) and np.allclose(sent[1], -VALUES)
    assert _sent("scale:1e3", phase="r") is None


def test_owner_attack_changes_only_results() -> None:
    assert _sent("owner:10") is None
    sent = _sent("owner:10", phase="r")
    assert sent is not None and np.allclose(sent[1], VALUES.astype(np.float32) * -10)


def test_forged_heartbeats_under_a_victim_id_carry_the_attackers_key() -> None:
    victim = Forger(parse_attack("flood:1"), []).own.peer_id  # any well-formed peer id
    forger = Forger(parse_attack("tombstone"), [victim])
    (rec,) = forger.forge(Seen())
    key, expiration = records.heartbeat_key("default"), records.now() + 60
    value = rec.value(key, expiration)
    beat = records.Heartbeat.decode(open_envelope(value).body)
    assert beat.peer_id == victim and beat.leaving
    with pytest.raises(ValueError, match="wrong-owner"):
        open_verified(value, key, victim, expiration)


def test_records_of_own_keys_verify_and_flood_holds_a_key_per_phantom() -> None:
    forged = Forger(parse_attack("flood:5"), []).forge(Seen())
    key, expiration = records.heartbeat_key("default"), records.now() + 60
    assert len({rec.subkey for rec in forged}) == 5
    for rec in forged:
        open_verified(rec.value(key, expiration), key, rec.subkey, expiration)
    (huge,) = Forger(parse_attack("huge-round:1e9"), []).forge(Seen())
    assert records.Heartbeat.decode(open_envelope(huge.value(key, expiration)).body).round == 10**9


def test_replay_leave_stores_the_tombstone_a_victim_left_exactly_as_sealed() -> None:
    victim = Signer(SigningKey(bytes([7]) * 32))
    dht = DictDHT()
    first = records.Heartbeat(victim.peer_id, 3, 100, 2.0, 50.0, "0.1.0", records.now())
    assert records.publish_heartbeat(dht, "default", first, 60, victim)
    seen = Seen()
    seen.read(dht, "default")
    forger = Forger(parse_attack("replay-leave"), [victim.peer_id])
    assert forger.forge(seen) == []  # nothing to replay while the victim has not left
    gone = dataclasses.replace(first, round=9, leaving=True, timestamp=records.now())
    assert records.publish_heartbeat(dht, "default", gone, 60, victim)
    sealed = dht.data[records.heartbeat_key("default")].value[victim.peer_id].value
    back = dataclasses.replace(first, round=10, timestamp=records.now())
    seen.read(dht, "default")
    assert records.publish_heartbeat(dht, "default", back, 60, victim)  # it came back
    seen.read(dht, "default")
    (rec,) = forger.forge(seen)
    assert rec.subkey == victim.peer_id and rec.value("any key", 0.0) == sealed
    assert records.Heartbeat.decode(open_envelope(sealed).body).leaving
