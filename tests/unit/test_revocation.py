"""Revocations: an owner withdrawing an invitation before it expires, by config and over the DHT."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from nacl.signing import SigningKey

from bench.fuzz.fakes import DictDHT
from p2p_trainer.cli import main
from p2p_trainer.config import ConfigError, RunConfig, SecurityConfig
from p2p_trainer.net import envelope, records, revocation
from p2p_trainer.net.admission import Admission, InvitationError, check_entry, check_self, issue
from p2p_trainer.net.envelope import Signer
from p2p_trainer.net.records import Heartbeat
from p2p_trainer.net.revocation import Revocation, RevocationError, revoke

pytestmark = pytest.mark.timeout(60)

OWNER = SigningKey(bytes([70]) * 32)
OWNER_ID = Signer(OWNER).peer_id
STRANGER = SigningKey(bytes([71]) * 32)
PEERS = [Signer(SigningKey(bytes([80 + i]) * 32)) for i in range(3)]
ALICE, BOB, EVE = (s.peer_id for s in PEERS)
LATER = time.time() + 3600


def config(*revoked: str) -> SecurityConfig:
    return SecurityConfig(admission="invitations", owners=(OWNER_ID,), revoked=revoked)


def invited(peer: str) -> str:
    return issue(OWNER, "swarm", peer, LATER).encode()


def test_a_revoked_peer_is_refused_like_an_uninvited_one_and_is_told_so() -> None:
    text = revoke(OWNER, "swarm", BOB).encode()
    assert len(text) <= revocation.MAX_REVOCATION_CHARS
    adm = Admission(config(text), "swarm")
    assert adm.refusal(ALICE, invited(ALICE)) is None
    assert "revoked by owner" in (adm.refusal(BOB, invited(BOB)) or "")
    before = envelope.READ_DROPS.counts().get("not-admitted", 0)
    assert not adm.admits(BOB, invited(BOB))
    assert envelope.READ_DROPS.counts().get("not-admitted", 0) == before + 1
    with pytest.raises(InvitationError, match="its invitation was revoked"):
        check_self(adm, BOB, invited(BOB))
    # a fresh invitation does not lift it: the revocation names the peer, not one invitation
    assert adm.refusal(BOB, issue(OWNER, "swarm", BOB, LATER + 60).encode()) is not None


def test_forged_revocations_are_ignored(caplog: pytest.LogCaptureFixture) -> None:
    good = revoke(OWNER, "swarm", BOB)
    forged = [
        revoke(STRANGER, "swarm", BOB).encode(),  # not an owner of this swarm
        replace(good, peer_id=ALICE).encode(),  # the owner's signature does not cover Alice
        revoke(OWNER, "elsewhere", BOB).encode(),  # another swarm's
        "not a revocation",
        "A" * 401,
    ]
    with caplog.at_level("WARNING"):
        adm = Admission(config(*forged[:4]), "swarm")
    assert caplog.text.count("ignoring security.revoked entry") == 4
    assert adm.refusal(BOB, invited(BOB)) is None and adm.refusal(ALICE, invited(ALICE)) is None
    assert list(adm.learn(forged)) == [forged[4]]  # each text is checked once
    fresh = Admission(config(), "swarm").learn(forged)
    assert "not by an owner" in fresh[forged[0]] and "signature" in fresh[forged[1]]
    assert "for swarm 'elsewhere'" in fresh[forged[2]] and len(fresh) == 5
    # an open swarm or an allow-list holds no revocations
    assert Admission(SecurityConfig(), "swarm").learn([good.encode()]) == {}
    for bad in ["", "x" * 500, "AAAA"]:
        with pytest.raises(RevocationError):
            Revocation.decode(bad)


def test_revoked_is_checked_and_not_part_of_the_run_definition() -> None:
    text = revoke(OWNER, "swarm", BOB).encode()
    closed = RunConfig(security=config())
    assert RunConfig(security=config(text)).run_id() == closed.run_id()
    with pytest.raises(ConfigError, match=r"security\.revoked"):
        config("x" * 401)
    with pytest.raises(ConfigError, match="at most 1024"):
        config(*["x"] * 1025)


class SharedNode:
    """One peer's node over a dict DHT that several peers share."""

    def __init__(self, dht: DictDHT, signer: Signer) -> None:
        self.dht, self.signer, self.peer_id = dht, signer, signer.peer_id

    def store(self, *args: object, **kwargs: object) -> object:
        return self.dht.store(*args, **kwargs)  # type: ignore[arg-type]

    def get(self, *args: object, **kwargs: object) -> object:
        return self.dht.get(*args, **kwargs)  # type: ignore[arg-type]

    def bootstrap_ids(self) -> list[str]:
        return []

    def ping_peers(self, peer_ids: list[str], timeout_s: float = 10.0) -> int:
        return 0


def test_published_revocations_reach_peers_whose_config_lacks_them() -> None:
    dht = DictDHT()
    text = revoke(OWNER, "swarm", BOB).encode()
    alice, bob, eve = PEERS
    revocation.publish(dht, "swarm", [text], 30, alice)
    # Eve publishes a stranger's revocation of Alice, and an oversized record
    revocation.publish(dht, "swarm", [revoke(STRANGER, "swarm", ALICE).encode()], 30, eve)
    assert sorted(revocation.read(dht, "swarm")) == sorted([text, revoke(STRANGER, "swarm", ALICE).encode()])
    key = revocation.revocations_key("swarm")
    body = records.pack({"revoked": [text] * (revocation.MAX_PER_RECORD + 1)})
    records.seal_and_store(dht, eve, key, eve.peer_id, body, records.now() + 30)
    # and a record under Alice's subkey that Eve signed: the DHT validator refuses it, a reader too
    dht.store(key, eve.seal(key, ALICE, records.now() + 30, body), records.now() + 30, ALICE)
    assert revocation.read(dht, "swarm") == []
    revocation.publish(dht, "swarm", [text], 30, alice)
    revocation.publish(dht, "swarm", [revoke(STRANGER, "swarm", ALICE).encode()], 30, eve)
    adm = Admission(config(), "swarm")
    with pytest.raises(InvitationError, match="its invitation was revoked"):
        check_entry(adm, SharedNode(dht, bob), invited(BOB))
    check_entry(adm, SharedNode(dht, alice), invited(ALICE))  # the stranger's revocation counts for nothing


def test_the_view_passes_revocations_on_drops_the_peer_and_tells_it() -> None:
    from p2p_trainer.net.swarm_view import SwarmView

    dht = DictDHT()
    alice, bob, _ = PEERS
    text = revoke(OWNER, "swarm", BOB).encode()
    hb = Heartbeat(BOB, 3, 100, 2.0, 10.0, "0.1.0", records.now(), invitation=invited(BOB))
    records.publish_heartbeat(dht, "swarm", hb, 30, bob)
    holder = SwarmView(SharedNode(dht, alice), "swarm", 60.0, 8.0, config(text), invited(ALICE))  # type: ignore[arg-type]
    revoked = SwarmView(SharedNode(dht, bob), "swarm", 60.0, 8.0, config(), invited(BOB))  # type: ignore[arg-type]
    try:
        assert BOB not in holder.live_peers()
        assert set(revocation.read(dht, "swarm")) == {text}  # republished, by Bob's view too
        assert revoked.refused_self is not None and "revoked" in revoked.refused_self
        assert holder.refused_self is None
    finally:
        holder.close()
        revoked.close()


def test_the_revoke_command_writes_what_the_config_takes(tmp_path: Path) -> None:
    runner = CliRunner()
    owner_key = tmp_path / "owner.key"
    owner_id = runner.invoke(main, ["identity", "--identity", str(owner_key)]).stdout.strip()
    out = tmp_path / "bob.revocation"
    args = ["revoke", BOB, "--owner-key", str(owner_key), "--swarm", "s", "--revocation", str(out)]
    got = runner.invoke(main, args)
    assert got.exit_code == 0, got.output
    text = out.read_text().strip()
    assert f'revoked = ["{text}"]' in got.output
    adm = Admission(SecurityConfig(admission="invitations", owners=(owner_id,), revoked=(text,)), "s")
    assert "revoked" in (adm.refusal(BOB, "") or "")
    missing = runner.invoke(main, [*args[:3], str(tmp_path / "none.key"), *args[4:]])
    assert missing.exit_code != 0 and not (tmp_path / "none.key").exists()
    bad = runner.invoke(main, ["revoke", "bob", "--owner-key", str(owner_key), "--revocation", str(out)])
    assert bad.exit_code != 0 and "Ed25519 peer id" in bad.output
    # publishing to a swarm: a malformed address is refused before anything is signed or written
    elsewhere = tmp_path / "elsewhere.revocation"
    unpublished = runner.invoke(main, [*args[:-1], str(elsewhere), "--initial-peers", "203.0.113.5:31337"])
    assert unpublished.exit_code == 1 and "malformed initial peer '203.0.113.5:31337'" in unpublished.output
    assert not elsewhere.exists()


def test_the_dht_validator_stores_a_peers_own_revocation_record_only() -> None:
    from p2p_trainer.net.record_validator import check_record
    from tests.unit.test_envelope import record

    alice, _, eve = PEERS
    key, expiration = revocation.revocations_key("swarm"), time.time() + 60
    body = records.pack({"revoked": [revoke(OWNER, "swarm", BOB).encode()]})
    check_record(record(key, ALICE, alice.seal(key, ALICE, expiration, body), expiration), time.time())
    with pytest.raises(envelope.EnvelopeError, match="wrong-owner"):
        check_record(record(key, ALICE, eve.seal(key, ALICE, expiration, body), expiration), time.time())


def test_admitted_publishers_are_read_before_strangers_who_fill_the_bound() -> None:
    dht = DictDHT()
    text = revoke(OWNER, "swarm", BOB).encode()
    alice = PEERS[0]
    # strangers whose peer ids sort before Alice's, enough to fill the publishers a read looks at
    signers = (Signer(SigningKey(i.to_bytes(2, "big") * 16)) for i in range(1000, 2000))
    strangers = [s for s in signers if s.peer_id < ALICE][: revocation.MAX_PUBLISHERS]
    assert len(strangers) == revocation.MAX_PUBLISHERS
    for s in strangers:
        revocation.publish(dht, "swarm", [], 30, s)
    revocation.publish(dht, "swarm", [text], 30, alice)
    assert revocation.read(dht, "swarm") == []  # Alice's record is past the bound
    assert revocation.read(dht, "swarm", prefer={ALICE}) == [text]


def test_successive_shares_carry_every_held_revocation() -> None:
    dht = DictDHT()
    held = [
        revoke(OWNER, "swarm", Signer(SigningKey(bytes([120 + i]) * 32)).peer_id).encode() for i in range(20)
    ]
    learned: set[str] = set()
    for turn in range(3):  # 3 records of 8 cover 20
        revocation.publish(dht, "swarm", held, 30, PEERS[0], turn)
        learned |= set(revocation.read(dht, "swarm"))
    assert learned == set(held)
    revocation.publish(dht, "swarm", held[:3], 30, PEERS[0], turn=5)  # fewer than a record holds
    assert sorted(revocation.read(dht, "swarm")) == sorted(held[:3])
