"""DHT records: msgpack round trips, expiry, malformed records dropped, run-definition mismatch."""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import hivemind
import msgpack
import pytest
from nacl.signing import SigningKey

from p2p_trainer.net import envelope, records
from p2p_trainer.net.envelope import Signer
from p2p_trainer.net.records import Heartbeat, RunDefinition, RunDefinitionMismatch

pytestmark = pytest.mark.timeout(30)

SIGNERS = {signer.peer_id: signer for signer in (Signer(SigningKey(bytes([i]) * 32)) for i in range(1, 8))}
"""Deterministic keys: every peer id in these tests is one whose key the test holds."""
PEER_A, PEER_B, PEER_C, PEER_D, PEER_E, PEER_F, PEER_G = SIGNERS
DEFINITION = {"model": {"layers": 4, "d_model": 128}, "method": "factored", "data": "shakespeare", "seed": 0}


def heartbeat(peer_id: str = PEER_A, **changes: Any) -> Heartbeat:
    beat = Heartbeat(peer_id, 3, 12_000, 2.31, 850.5, "0.1.0", records.now())
    return replace(beat, **changes)


def publish(dht: Any, run: str, beat: Heartbeat, ttl_s: float) -> bool:
    return records.publish_heartbeat(dht, run, beat, ttl_s, SIGNERS[beat.peer_id])


@pytest.fixture(autouse=True)
def every_drop_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the log line of its own drop (the counter logs once a minute per reason)."""
    monkeypatch.setattr(envelope.READ_DROPS, "log_period_s", 0.0)


@pytest.fixture(scope="module")
def dht() -> Iterator[hivemind.DHT]:
    node = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    yield node
    node.shutdown()


def test_heartbeat_round_trip_through_a_real_dht(dht: hivemind.DHT) -> None:
    beats = [heartbeat(PEER_A), heartbeat(PEER_B, loss=None, round=0)]
    for beat in beats:
        assert publish(dht, "roundtrip", beat, ttl_s=30)
    assert records.list_live_peers(dht, "roundtrip") == sorted(beats, key=lambda b: b.peer_id)
    assert records.list_live_peers(dht, "another-run") == []


def test_heartbeats_expire(dht: hivemind.DHT) -> None:
    # a TTL long enough that a loaded machine still lists both before A expires
    publish(dht, "expiry", heartbeat(PEER_A), ttl_s=3.0)
    publish(dht, "expiry", heartbeat(PEER_B), ttl_s=30)
    assert len(records.list_live_peers(dht, "expiry")) == 2
    time.sleep(3.5)
    assert [b.peer_id for b in records.list_live_peers(dht, "expiry")] == [PEER_B]


def test_tombstone_withdraws_a_heartbeat_before_its_ttl(dht: hivemind.DHT) -> None:
    publish(dht, "leaving", heartbeat(PEER_A), ttl_s=30)
    publish(dht, "leaving", heartbeat(PEER_B), ttl_s=30)
    publish(dht, "leaving", heartbeat(PEER_A, leaving=True, timestamp=records.now()), ttl_s=31)
    assert [b.peer_id for b in records.list_live_peers(dht, "leaving")] == [PEER_B]


def _raw(fields: dict[str, object]) -> bytes:
    return bytes(msgpack.packb(fields, use_bin_type=True))


MALFORMED = {
    "not-msgpack": b"\xc1\xc1\xc1",
    "pickle": pickle.dumps({"peer_id": PEER_A}),
    "list": bytes(msgpack.packb([1, 2, 3])),
    "round-str": _raw({**heartbeat().__dict__, "round": "3"}),
    "round-bool": _raw({**heartbeat().__dict__, "round": True}),
    "negative-tokens": _raw({**heartbeat().__dict__, "tokens_processed": -5}),
    "nan-loss": _raw({**heartbeat().__dict__, "loss": float("nan")}),
    "inf-throughput": _raw({**heartbeat().__dict__, "throughput_tokens_per_s": float("inf")}),
    "missing-version": _raw({k: v for k, v in heartbeat().__dict__.items() if k != "software_version"}),
    "huge": _raw({**heartbeat().__dict__, "software_version": "x" * 5000}),
    "other-peer-id": heartbeat(PEER_B).encode(),
    "non-base58-peer-id": heartbeat("12D3KooW0OIl").encode(),
    "far-future": heartbeat(timestamp=records.now() + 3600).encode(),
    "suspects-not-a-list": _raw({**heartbeat().__dict__, "suspects": PEER_B}),
    "suspects-not-base58": _raw({**heartbeat().__dict__, "suspects": ["12D3KooW0OIl"]}),
    "suspects-too-many": _raw({**heartbeat().__dict__, "suspects": [PEER_B] * (records.MAX_SUSPECTS + 1)}),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_heartbeats_are_dropped_with_a_log_line(
    dht: hivemind.DHT, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    run, expiration = f"malformed-{name}", records.now() + 30
    key, body = records.heartbeat_key(run), MALFORMED[name]
    # sealed by A, so the body's own checks are what drops it; an unsealed body is dropped as well
    value = (
        SIGNERS[PEER_A].seal(key, PEER_A, expiration, body) if len(body) <= envelope.MAX_BODY_BYTES else body
    )
    dht.store(key, value, expiration, subkey=PEER_A)
    publish(dht, run, heartbeat(PEER_B), ttl_s=30)
    with caplog.at_level(logging.WARNING, logger=records.__name__):
        live = records.list_live_peers(dht, run)
    assert [b.peer_id for b in live] == [PEER_B]
    assert any(
        "dropping malformed heartbeat" in r.getMessage() and PEER_A in r.getMessage() for r in caplog.records
    )


def test_non_bytes_values_are_dropped(dht: hivemind.DHT, caplog: pytest.LogCaptureFixture) -> None:
    dht.store(records.heartbeat_key("nonbytes"), {"peer_id": PEER_A}, records.now() + 30, subkey=PEER_A)
    with caplog.at_level(logging.WARNING, logger=records.__name__):
        assert records.list_live_peers(dht, "nonbytes") == []
    assert "dropping malformed heartbeat" in caplog.text


def test_same_run_definition_joins_and_a_different_one_is_refused(dht: hivemind.DHT) -> None:
    ours = RunDefinition(DEFINITION)
    records.check_run_definition(dht, "definition", ours, 30, SIGNERS[PEER_A])  # first peer publishes it
    publish(dht, "definition", heartbeat(PEER_A), ttl_s=30)  # and is live
    records.check_run_definition(dht, "definition", RunDefinition(dict(DEFINITION)), 30, SIGNERS[PEER_B])
    different = RunDefinition({**DEFINITION, "seed": 7, "model": {"layers": 6, "d_model": 128}})
    with pytest.raises(RunDefinitionMismatch) as raised:
        records.check_run_definition(dht, "definition", different, 30, SIGNERS[PEER_C])
    message = str(raised.value)
    assert "differs from ours in 2 field(s)" in message
    assert "model.layers: ours=6, swarm's=4" in message
    assert "seed: ours=7, swarm's=0" in message
    assert "method" not in message.split("field(s):")[1]


def test_run_definition_digest_is_order_independent_and_checked_on_decode() -> None:
    a = RunDefinition({"seed": 0, "method": "diloco"})
    b = RunDefinition({"method": "diloco", "seed": 0})
    assert a.digest == b.digest
    assert RunDefinition.decode(a.encode()) == a
    tampered = _raw({"digest": a.digest, "fields": {"seed": 1, "method": "diloco"}})
    with pytest.raises(records.RecordError, match="digest"):
        RunDefinition.decode(tampered)


def test_diff_names_added_and_removed_fields() -> None:
    diff = records.diff_run_definitions(RunDefinition({"a": 1}), RunDefinition({"b": 2}))
    assert diff == [("a", 1, "<absent>"), ("b", "<absent>", 2)]


def test_publishing_a_heartbeat_others_would_drop_is_refused(dht: hivemind.DHT) -> None:
    with pytest.raises(records.RecordError, match="loss"):
        publish(dht, "refused", heartbeat(loss=float("nan")), ttl_s=30)
    with pytest.raises(records.RecordError, match="round"):
        publish(dht, "refused", heartbeat(round=-1), ttl_s=30)


class _Node:
    """The parts of NetNode a SwarmView uses, on the test's DHT."""

    def __init__(self, dht: hivemind.DHT, peer_id: str) -> None:
        self.dht, self.peer_id = dht, peer_id
        self.signer = SIGNERS[peer_id]

    def store(self, *args: Any, **kwargs: Any) -> Any:
        return self.dht.store(*args, **kwargs)

    def get(self, *args: Any, **kwargs: Any) -> Any:
        return self.dht.get(*args, **kwargs)

    def bootstrap_ids(self) -> list[str]:
        return []

    def ping_peers(self, peer_ids: list[str], timeout_s: float = 10.0) -> int:
        return 0


def test_view_keeps_peers_heard_from_but_not_those_that_left(dht: hivemind.DHT) -> None:
    from p2p_trainer.net.swarm_view import SwarmView

    me, heard_only = PEER_C, PEER_D
    publish(dht, "sticky", heartbeat(PEER_A), ttl_s=30)
    publish(dht, "sticky", heartbeat(PEER_B, leaving=True), ttl_s=30)
    view = SwarmView(_Node(dht, me), "sticky", period_s=60.0, ttl_s=8.0)  # type: ignore[arg-type]
    try:
        assert view.live_peers() == sorted([PEER_A, me])
        asked: list[float] = []

        def heard(seconds: float) -> set[str]:
            asked.append(seconds)
            return {heard_only, PEER_B}  # B's messages came, but it has left cleanly since

        view.hear_from(heard)
        assert view.live_peers() == sorted([PEER_A, me, heard_only])
        # evidence as fresh as a heartbeat must be keeps a peer in view; one a period old outweighs
        # another peer's report of its death
        assert asked == [8.0, 60.0]
    finally:
        view.close()


def test_a_peer_that_already_left_is_not_waited_for_when_tombstones_count(dht: hivemind.DHT) -> None:
    """A short run's first peer may finish before the second is up: its tombstone says it will
    not come, so the second starts at once instead of waiting out its whole timeout."""
    from p2p_trainer.net.swarm_view import SwarmView

    publish(dht, "gone", heartbeat(PEER_B, leaving=True), ttl_s=8)  # a tombstone's TTL
    view = SwarmView(_Node(dht, PEER_C), "gone", period_s=60.0, ttl_s=8.0)  # type: ignore[arg-type]
    try:
        started = time.monotonic()
        assert view.wait_for(2, timeout_s=20.0, count_left=True) == 1  # only itself is live
        assert time.monotonic() - started < 5.0
        started = time.monotonic()
        assert view.wait_for(2, timeout_s=1.5) == 1  # without: the left peer is waited for
        assert time.monotonic() - started >= 1.5
    finally:
        view.close()


def test_a_death_named_in_a_heartbeat_leaves_every_view_until_the_peer_beats_again(dht: hivemind.DHT) -> None:
    from p2p_trainer.net.swarm_view import SwarmView

    me, reporter = PEER_E, PEER_F
    t0 = records.now()
    # the view's period is 60 s here: a report counts once it is 1.5 periods newer than A's heartbeat
    publish(dht, "death", heartbeat(PEER_A, timestamp=t0 - 100.0), ttl_s=30)
    publish(dht, "death", heartbeat(reporter, timestamp=t0 - 1.0, suspects=(PEER_A, me)), ttl_s=30)
    mine: set[str] = set()
    view = SwarmView(_Node(dht, me), "death", period_s=60.0, ttl_s=8.0)  # type: ignore[arg-type]
    try:
        view.share_suspects(lambda: set(mine))
        # A's last heartbeat is older than the report; this peer never drops itself
        assert view.live_peers() == sorted([me, reporter])
        publish(dht, "death", heartbeat(PEER_A, timestamp=t0 - 0.5), ttl_s=30)
        view._refresh()  # the view thread's period is 60 s here: read the DHT now
        assert view.live_peers() == sorted([PEER_A, me, reporter])  # A spoke after the report
        mine.add(PEER_A)  # this peer's own failed send
        assert view.live_peers() == sorted([me, reporter])
        view._refresh()
        published = {b.peer_id: b for b in records.list_live_peers(dht, "death")}
        assert published[me].suspects == (PEER_A,)  # and the others hear of it
        # A restarted with its identity: its first heartbeat brings it back, still suspect or not
        publish(dht, "death", heartbeat(PEER_A, timestamp=records.now() + 0.5), ttl_s=30)
        view._refresh()
        assert view.live_peers() == sorted([PEER_A, me, reporter])
        view._refresh()  # the heartbeat it publishes is built from the previous read
        assert {b.peer_id: b for b in records.list_live_peers(dht, "death")}[me].suspects == ()
    finally:
        view.close()


def test_a_report_must_postdate_the_suspects_heartbeat_by_a_margin_and_not_by_a_future_stamp() -> None:
    from p2p_trainer.net.swarm_view import reported_dead

    now = 1000.0
    alive = heartbeat(PEER_A, timestamp=now - 1.0)  # it published a second ago: alive
    near = heartbeat(PEER_B, timestamp=now, suspects=(PEER_A,))
    assert reported_dead([alive, near], PEER_E, now, margin_s=3.0) == set()
    silent = heartbeat(PEER_A, timestamp=now - 5.0)  # missed its last heartbeats
    assert reported_dead([silent, near], PEER_E, now, margin_s=3.0) == {PEER_A}
    # a report stamped ahead of this peer's clock counts from now, not from its stamp
    ahead = heartbeat(PEER_B, timestamp=now + 50.0, suspects=(PEER_A,))
    assert reported_dead([alive, ahead], PEER_E, now, margin_s=3.0) == set()
    # nobody reports this peer or itself dead to it
    selfish = heartbeat(PEER_B, timestamp=now, suspects=(PEER_B, PEER_E))
    assert reported_dead([selfish], PEER_E, now + 100.0, margin_s=3.0) == set()


def test_only_a_fresh_round_zero_heartbeat_marks_a_peer_as_joining(dht: hivemind.DHT) -> None:
    """A peer still at round 0 once this one has trained a while is joining (left out of groups);
    a round-0 heartbeat two periods old is only this view's lag, and must not empty the view."""
    from p2p_trainer.net.swarm_view import SwarmView

    me, period_s = PEER_G, 60.0
    now = records.now()
    publish(dht, "joining", heartbeat(PEER_A, round=0, timestamp=now), ttl_s=30)
    publish(dht, "joining", heartbeat(PEER_B, round=0, timestamp=now - 2.5 * period_s), ttl_s=30)
    publish(dht, "joining", heartbeat(PEER_C, round=7, timestamp=now), ttl_s=30)
    view = SwarmView(_Node(dht, me), "joining", period_s=period_s, ttl_s=8.0)  # type: ignore[arg-type]
    try:
        view.enter_round(8)
        assert view.live_peers() == sorted([PEER_A, PEER_B, PEER_C, me])  # just started training
        view._training_since = time.monotonic() - 4 * period_s  # trained for four periods
        assert view.live_peers() == sorted([PEER_B, PEER_C, me])
    finally:
        view.close()


def test_the_view_leaves_out_of_a_rounds_groups_the_peers_that_named_it_ahead(dht: hivemind.DHT) -> None:
    """`SwarmView.outside_groups` (net/entry.py): a newcomer before its entry round and a leaving
    peer from its leave round on, by their heartbeats; this peer by its own status."""
    from p2p_trainer.net.swarm_view import SwarmView

    me = PEER_D
    publish(dht, "named", heartbeat(PEER_A, round=9), ttl_s=30)
    publish(dht, "named", heartbeat(PEER_B, round=9, enters_round=12), ttl_s=30)
    publish(dht, "named", heartbeat(PEER_C, round=9, leaves_round=11), ttl_s=30)
    view = SwarmView(_Node(dht, me), "named", period_s=60.0, ttl_s=8.0)  # type: ignore[arg-type]
    try:
        assert view.outside_groups(10) == {PEER_B}
        assert view.outside_groups(11) == {PEER_B, PEER_C}
        assert view.outside_groups(12) == {PEER_C}
        view.leave_groups_at(13)
        assert view.status.leaves_round == 13
        assert view.outside_groups(12) == {PEER_C} and view.outside_groups(13) == {PEER_C, me}
    finally:
        view.close()


def test_constant_work_counts_a_peer_out_only_by_a_fresh_round_zero_heartbeat() -> None:
    """The peers a constant-work round is shared among (`join._training_peers`) leave out a
    joiner, as the view does, and by the same rule (`at_round_zero`): a round-0 heartbeat older
    than two periods is the view's lag, and that peer still counts."""
    from types import SimpleNamespace

    from p2p_trainer.net.health import PeerHealth
    from p2p_trainer.net.swarm_view import at_round_zero
    from p2p_trainer.run.join import _training_peers

    period_s = 0.1

    def beats() -> list[Heartbeat]:
        now = records.now()
        return [
            heartbeat(PEER_A, round=0, timestamp=now),  # joining
            heartbeat(PEER_B, round=0, timestamp=now - 10 * period_s),  # an old read
            heartbeat(PEER_C, round=7, timestamp=now),
            heartbeat(PEER_D, round=8, timestamp=now, enters_round=12),  # a newcomer, not yet in groups
        ]

    def outside_groups(round: int, _beats: object = None) -> set[str]:
        return {PEER_D, PEER_E} if round < 12 else set()  # PEER_E: this peer itself, not yet in either

    assert at_round_zero(beats(), records.now(), period_s) == {PEER_A}
    status = SimpleNamespace(round=8)
    view = SimpleNamespace(
        status=status,
        heartbeats=beats,
        reported_dead=lambda _b: set(),
        outside_groups=outside_groups,
        node=SimpleNamespace(peer_id=PEER_E),
    )
    live = _training_peers(view, PeerHealth(), period_s)  # type: ignore[arg-type]
    assert live() == [PEER_A, PEER_B, PEER_C]  # just started training: round 0 is the heartbeats' lag
    time.sleep(4 * period_s)
    assert live() == [PEER_B, PEER_C]
    status.round = 12  # the newcomer's entry round: its work counts from now on
    assert live() == [PEER_B, PEER_C, PEER_D]


def test_two_votes_read_from_the_dht_leave_a_peer_out_of_every_view(dht: hivemind.DHT) -> None:
    """`exclusion.py`: votes travel in signed heartbeats. Two other peers' votes leave the liar out
    of the rounds they cover, in this view's groups; one vote does not, and neither do votes in an
    undefended view. This peer's own vote goes out in its next heartbeat, named ahead."""
    from p2p_trainer.config import SecurityConfig
    from p2p_trainer.net.swarm_view import SwarmView

    me, voter, other, liar = PEER_A, PEER_B, PEER_C, PEER_D
    publish(dht, "votes", heartbeat(voter, excludes=((liar, 3, 40),)), ttl_s=30)
    publish(dht, "votes", heartbeat(other), ttl_s=30)
    publish(dht, "votes", heartbeat(liar, excludes=((voter, 0, 40), (other, 0, 40))), ttl_s=30)
    view = SwarmView(_Node(dht, me), "votes", period_s=60.0, ttl_s=30.0)  # type: ignore[arg-type]
    undefended = SecurityConfig(defences=False)
    off = SwarmView(_Node(dht, PEER_E), "votes", period_s=60.0, ttl_s=30.0, security=undefended)  # type: ignore[arg-type]
    try:
        view.status.round = 3
        view._refresh()  # the view thread's period is 60 s here: read the DHT now
        assert view.outside_groups(5) == set()  # one vote each, the liar's against two honest peers
        view.round_s = lambda: 10.0  # type: ignore[method-assign]  # 60 s periods: 2.5 of them ahead
        view.vote_out(liar, strikes=1.2)  # a first offence (and its strike's decay) is no vote
        assert view.ballot.votes(3) == ()
        view.vote_out(liar, strikes=1.6)
        first = 3 + 15 + 1
        assert view.ballot.votes(3) == ((liar, first, first + 8),)
        assert view.outside_groups(first - 1) == set()
        assert view.outside_groups(first) == view.outside_groups(first + 7) == {liar}
        assert view.outside_groups(first + 8) == set()
        view._refresh()
        published = {b.peer_id: b for b in records.list_live_peers(dht, "votes")}
        assert published[me].excludes == ((liar, first, first + 8),)
        off.status.round = 3
        off._refresh()
        assert off.outside_groups(first) == set()  # undefended: votes are not counted
    finally:
        view.close()
        off.close()


def test_an_entry_or_leave_round_past_the_field_bound_is_clamped_not_refused(dht: hivemind.DHT) -> None:
    """A round named from a config (a joiner's provisional entry is the run's last round) or a
    donor's claim may exceed what a heartbeat carries; the heartbeat still goes out, clamped."""
    from p2p_trainer.net.swarm_view import SwarmView

    view = SwarmView(_Node(dht, PEER_G), "clamp", period_s=60.0, ttl_s=30.0)  # type: ignore[arg-type]
    try:
        view.status.enters_round = view.status.leaves_round = 2**62
        view._refresh()
        published = {b.peer_id: b for b in records.list_live_peers(dht, "clamp")}
        assert published[PEER_G].enters_round == published[PEER_G].leaves_round == records.MAX_STEPS - 1
    finally:
        view.close()
