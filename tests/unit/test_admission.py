"""Admission: invitations, allow-lists, and a closed swarm's view over a real DHT."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import hivemind
import pytest
from click.testing import CliRunner
from nacl.signing import SigningKey

from p2p_trainer.cli import main
from p2p_trainer.config import ConfigError, SecurityConfig
from p2p_trainer.net import envelope, records
from p2p_trainer.net.admission import Admission, Invitation, InvitationError, check_self, issue
from p2p_trainer.net.envelope import Signer
from p2p_trainer.net.records import Heartbeat

pytestmark = pytest.mark.timeout(60)

OWNER = SigningKey(bytes([40]) * 32)
OWNER_ID = Signer(OWNER).peer_id
STRANGER = SigningKey(bytes([41]) * 32)
PEERS = [Signer(SigningKey(bytes([50 + i]) * 32)) for i in range(3)]
ALICE, BOB, EVE = (s.peer_id for s in PEERS)
LATER = time.time() + 3600


def invitations(**changes: object) -> Admission:
    return Admission(SecurityConfig(admission="invitations", owners=(OWNER_ID,), **changes), "swarm")  # type: ignore[arg-type]


def test_an_owners_invitation_admits_exactly_its_peer_in_its_swarm_until_it_expires() -> None:
    text = issue(OWNER, "swarm", ALICE, LATER).encode()
    assert len(text) <= records.MAX_INVITATION_CHARS
    adm = invitations()
    assert adm.refusal(ALICE, text) is None
    assert "for peer" in (adm.refusal(BOB, text) or "")  # copied: bound to Alice's id
    assert "no invitation" in (adm.refusal(BOB, "") or "")
    assert "expired" in (adm.refusal(ALICE, text, now=LATER + 1) or "")
    other_swarm = Admission(SecurityConfig(admission="invitations", owners=(OWNER_ID,)), "elsewhere")
    assert "for swarm 'swarm'" in (other_swarm.refusal(ALICE, text) or "")
    forged = issue(STRANGER, "swarm", BOB, LATER).encode()
    assert "not by an owner" in (adm.refusal(BOB, forged) or "")


def test_a_tampered_or_malformed_invitation_is_refused_with_a_reason() -> None:
    inv = issue(OWNER, "swarm", ALICE, LATER)
    stretched = replace(inv, expires=LATER + 10**8)  # the owner's signature does not cover this expiry
    assert "signature" in (invitations().refusal(ALICE, stretched.encode()) or "")
    renamed = replace(inv, peer_id=BOB)
    assert "signature" in (invitations().refusal(BOB, renamed.encode()) or "")
    for bad in ["", "x" * 600, "not base64!", "AAAA", inv.encode()[:-8]]:
        with pytest.raises(InvitationError):
            Invitation.decode(bad)
        assert invitations().refusal(ALICE, bad) is not None


def test_an_allow_list_admits_its_peers_only_and_open_admits_everyone() -> None:
    adm = Admission(SecurityConfig(admission="allow-list", allow=(ALICE, BOB)), "swarm")
    assert adm.refusal(ALICE) is None and adm.refusal(BOB) is None
    assert "allow-list" in (adm.refusal(EVE) or "")
    assert Admission(SecurityConfig(), "swarm").refusal(EVE) is None


def test_a_refused_joiner_is_told_what_to_change() -> None:
    with pytest.raises(InvitationError, match="ask a swarm owner for an invitation"):
        check_self(invitations(), EVE, "")
    with pytest.raises(InvitationError, match=r"security\.allow"):
        check_self(Admission(SecurityConfig(admission="allow-list", allow=(ALICE,)), "s"), EVE, "")
    check_self(invitations(), ALICE, issue(OWNER, "swarm", ALICE, LATER).encode())  # admitted: no error


def test_closed_swarm_configs_are_checked_and_change_the_run_id() -> None:
    from p2p_trainer.config import RunConfig

    with pytest.raises(ConfigError, match="admits nobody"):
        SecurityConfig(admission="allow-list")
    with pytest.raises(ConfigError, match=r"security\.owners"):
        SecurityConfig(admission="invitations")
    with pytest.raises(ConfigError, match="Ed25519 peer id"):
        SecurityConfig(allow=("alice",))
    with pytest.raises(ConfigError, match="defences"):
        SecurityConfig(admission="allow-list", allow=(ALICE,), defences=False)
    open_id = RunConfig().run_id()
    closed = RunConfig(security=SecurityConfig(admission="allow-list", allow=(ALICE,)))
    assert closed.run_id() != open_id  # peers of a closed swarm agree on who is let in
    assert RunConfig(security=SecurityConfig(penalty_half_life=3.0)).run_id() == open_id


@pytest.fixture(scope="module")
def dht() -> Iterator[hivemind.DHT]:
    node = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    yield node
    node.shutdown()


class _Node:
    def __init__(self, dht: hivemind.DHT, signer: Signer) -> None:
        self.dht, self.peer_id, self.signer = dht, signer.peer_id, signer

    def store(self, *args: object, **kwargs: object) -> object:
        return self.dht.store(*args, **kwargs)

    def get(self, *args: object, **kwargs: object) -> object:
        return self.dht.get(*args, **kwargs)

    def bootstrap_ids(self) -> list[str]:
        return []


def test_a_closed_swarms_view_drops_signed_heartbeats_of_peers_it_does_not_admit(dht: hivemind.DHT) -> None:
    from p2p_trainer.net.swarm_view import SwarmView

    def beat(signer: Signer, invitation: str = "") -> None:
        hb = Heartbeat(signer.peer_id, 3, 100, 2.0, 10.0, "0.1.0", records.now(), invitation=invitation)
        assert records.publish_heartbeat(dht, "swarm", hb, 30, signer)

    alice, bob, eve = PEERS
    beat(bob, issue(OWNER, "swarm", bob.peer_id, LATER).encode())
    beat(eve)  # validly signed, but not invited
    beat(eve, issue(OWNER, "swarm", bob.peer_id, LATER).encode())  # Bob's invitation, copied
    before = envelope.READ_DROPS.counts().get("not-admitted", 0)
    sec = SecurityConfig(admission="invitations", owners=(OWNER_ID,))
    mine = issue(OWNER, "swarm", alice.peer_id, LATER).encode()
    view = SwarmView(_Node(dht, alice), "swarm", period_s=60.0, ttl_s=8.0, security=sec, invitation=mine)  # type: ignore[arg-type]
    try:
        assert view.live_peers() == sorted([alice.peer_id, bob.peer_id])
        assert envelope.READ_DROPS.counts().get("not-admitted", 0) > before
        published = {b.peer_id: b for b in records.list_live_peers(dht, "swarm")}
        assert published[alice.peer_id].invitation == mine  # the others can check it
    finally:
        view.close()


def test_identity_and_invite_commands_write_an_invitation_join_accepts(tmp_path: Path) -> None:
    runner = CliRunner()
    got = runner.invoke(main, ["identity", "--identity", str(tmp_path / "peer.key")])
    assert got.exit_code == 0, got.output
    peer_id = got.stdout.strip()
    assert peer_id.startswith("12D3KooW") and (tmp_path / "peer.key").stat().st_mode & 0o777 == 0o600
    again = runner.invoke(main, ["identity", "--identity", str(tmp_path / "peer.key")])
    assert again.stdout.strip() == peer_id  # the key is kept, not replaced
    out = tmp_path / "peer.invitation"
    owner_key = str(tmp_path / "owner.key")
    args = ["invite", peer_id, "--owner-key", owner_key, "--swarm", "s", "--invitation", str(out)]
    got = runner.invoke(main, args)
    assert got.exit_code == 0, got.output
    owner_id = runner.invoke(main, ["identity", "--identity", str(tmp_path / "owner.key")]).stdout.strip()
    assert f'owners = ["{owner_id}"]' in got.output
    adm = Admission(SecurityConfig(admission="invitations", owners=(owner_id,)), "s")
    assert adm.refusal(peer_id, out.read_text().strip()) is None
    bad = runner.invoke(
        main, ["invite", "bob", "--owner-key", str(tmp_path / "o.key"), "--invitation", str(out)]
    )
    assert bad.exit_code != 0 and "Ed25519 peer id" in bad.output
