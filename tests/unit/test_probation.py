"""Probation's bookkeeping: who is probed when, and who counts as seen alive."""

from __future__ import annotations

import itertools

from p2p_trainer.net.probation import FIRST_RETRY_S, MAX_IN_FLIGHT, MAX_RETRY_S, Probation


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_peer_that_never_answers_is_probed_ever_less_often_and_never_vouched() -> None:
    clock = Clock()
    p = Probation(clock)
    waits = []
    assert p.due({"ghost"}, set()) == ["ghost"]
    for _ in range(12):
        assert p.due({"ghost"}, set()) == []  # in flight: not probed twice at once
        p.answered("ghost", alive=False)
        failed_at = clock.t
        while not p.due({"ghost"}, set()):  # the next probe starts (in flight) once it is due
            clock.t += 0.25
        waits.append(clock.t - failed_at)
    assert waits[0] == FIRST_RETRY_S
    assert all(b >= a for a, b in itertools.pairwise(waits))
    assert max(waits) == MAX_RETRY_S and waits[-1] == MAX_RETRY_S
    assert "ghost" not in p.vouched and p.failed == 12


def test_an_answer_vouches_until_a_send_fails_and_exempt_peers_are_not_probed() -> None:
    p = Probation(Clock())
    assert p.due({"a", "b", "me"}, exempt={"me"}) == ["a", "b"]
    p.answered("a", alive=True)
    p.answered("b", alive=False)
    assert p.vouched == {"a"}
    assert p.due({"a", "b"}, set()) == []  # a is vouched, b waits for its retry
    p.suspect({"a"})
    assert p.due({"a", "b"}, set()) == ["a"]  # on probation again
    p.answered("a", alive=True)
    p.forget(keep={"b"})  # a left the view: forgotten
    assert p.vouched == set()


def test_probes_at_once_are_capped_and_newcomers_go_first() -> None:
    clock = Clock()
    p = Probation(clock)
    phantoms = {f"phantom{i:03d}" for i in range(100)}
    first = p.due(phantoms, set())
    assert len(first) == MAX_IN_FLIGHT
    assert p.due(phantoms, set()) == []  # the cap is reached
    batch = first
    while batch:  # every phantom probed once, and failed
        for peer in batch:
            p.answered(peer, alive=False)
        batch = p.due(phantoms, set())
    assert p.failed == len(phantoms)
    clock.t += MAX_RETRY_S  # every phantom is due again, but a newcomer is probed first
    assert p.due(phantoms | {"zz-newcomer"}, set())[0] == "zz-newcomer"
