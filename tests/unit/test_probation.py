"""Probation's bookkeeping: who is probed when, and who counts as seen alive."""

from __future__ import annotations

import itertools

from p2p_trainer.net.probation import (
    FIRST_RETRY_S,
    FORGET_AFTER_S,
    MAX_IN_FLIGHT,
    MAX_RETRY_S,
    RETURNING_MAX_S,
    Probation,
)
from tests.conftest import ManualClock


def test_a_peer_that_never_answers_is_probed_ever_less_often_and_never_vouched() -> None:
    clock = ManualClock(100.0)
    p = Probation(clock)
    waits = []
    assert p.due({"ghost"}) == ["ghost"]
    for _ in range(12):
        assert p.due({"ghost"}) == []  # in flight: not probed twice at once
        p.answered("ghost", alive=False)
        failed_at = clock.now
        while not p.due({"ghost"}):  # the next probe starts (in flight) once it is due
            clock.now += 0.25
        waits.append(clock.now - failed_at)
    assert waits[0] == FIRST_RETRY_S
    assert all(b >= a for a, b in itertools.pairwise(waits))
    assert max(waits) == MAX_RETRY_S and waits[-1] == MAX_RETRY_S
    assert "ghost" not in p.vouched and p.failed == 12


def test_an_answer_vouches_until_a_send_fails() -> None:
    clock = ManualClock(100.0)
    p = Probation(clock)
    assert sorted(p.due({"a", "b"})) == ["a", "b"]
    p.answered("a", alive=True)
    p.answered("b", alive=False)
    assert p.vouched == {"a"}
    assert p.due({"a", "b"}) == []  # a is vouched, b waits for its retry
    p.suspect({"a"})
    assert p.due({"a", "b"}) == ["a"]  # on probation again
    p.answered("a", alive=True)
    p.suspect({"a"})  # still suspected, but it answered since: not undone every period
    assert p.vouched == {"a"}
    p.suspect(set())
    p.suspect({"a"})  # suspected anew
    assert p.vouched == set()


def test_messages_vouch_unless_suspected_and_a_probe_of_this_peer_is_answered_at_once() -> None:
    clock = ManualClock(100.0)
    p = Probation(clock)
    p.suspect({"c"})
    p.vouch({"b", "c"})  # b and c exchanged messages with this peer; a send to c failed since
    assert p.vouched == {"b"}
    assert p.due({"zz-prober"}) == ["zz-prober"]
    p.answered("zz-prober", alive=False)  # its address was not known yet: backoff
    assert p.due({"zz-prober"}) == []
    # it probed this peer (so its address is known now): probed back at once, ahead of newcomers
    assert p.due({"aa-new", "zz-prober"}, hurry={"zz-prober"})[0] == "zz-prober"


def test_a_peer_out_of_view_is_forgotten_only_after_a_while() -> None:
    clock = ManualClock(100.0)
    p = Probation(clock)
    p.due({"a", "ghost"})
    p.answered("a", alive=True)
    p.answered("ghost", alive=False)
    p.forget(keep=set())  # one read without their heartbeats is not news
    assert p.vouched == {"a"}
    clock.now += FIRST_RETRY_S
    assert p.due({"ghost"}) == ["ghost"]  # its backoff was kept
    p.answered("ghost", alive=False)
    clock.now += FORGET_AFTER_S + 1
    p.forget(keep=set())
    assert p.vouched == set()
    assert p.due({"ghost"}) == ["ghost"]  # a stranger again, its backoff gone
    p.answered("ghost", alive=False)
    assert p.failed == 3


def test_probes_at_once_are_capped_and_newcomers_go_first() -> None:
    clock = ManualClock(100.0)
    p = Probation(clock)
    phantoms = {f"phantom{i:03d}" for i in range(100)}
    first = p.due(phantoms)
    assert len(first) == MAX_IN_FLIGHT
    assert p.due(phantoms) == []  # the cap is reached
    batch = first
    while batch:  # every phantom probed once, and failed
        for peer in batch:
            p.answered(peer, alive=False)
        batch = p.due(phantoms)
    assert p.failed == len(phantoms)
    clock.now += MAX_RETRY_S  # every phantom is due again, but a newcomer is probed first
    assert p.due(phantoms | {"zz-newcomer"})[0] == "zz-newcomer"


def test_a_peer_that_answered_before_is_retried_soon_after_a_partition() -> None:
    clock = ManualClock(100.0)
    p = Probation(clock)
    p.due({"friend"})
    p.answered("friend", alive=True)
    p.suspect({"friend"})  # cut off: its sends fail, and so do its probes, many times
    for _ in range(10):
        clock.now += 100.0
        assert p.due({"friend"}) == ["friend"]
        p.answered("friend", alive=False)
    clock.now += RETURNING_MAX_S  # healed: probed again within a few seconds, not a minute
    assert p.due({"friend"}) == ["friend"]
