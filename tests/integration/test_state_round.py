"""A newcomer waiting for the round it enters at asks a donor which round it serves, over real p2p
daemons, and its requests are timed by the donor's answers (net/state_sync.py
`await_state_round`): it learns of the round as it begins, with a few requests."""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from p2p_trainer.algo.methods import OuterState
from p2p_trainer.exchange.interface import Failed
from p2p_trainer.net import state_sync
from p2p_trainer.net.dht import NetNode
from p2p_trainer.net.state_sync import ROUND_POLLS, StateServer, await_state_round
from p2p_trainer.net.transport import Transport
from tests.integration.loopback_hosts import loopback_hosts

pytestmark = pytest.mark.timeout(120)

ROUND_S = 0.4
RUN = "state-round-test"


@pytest.fixture()
def hosts(tmp_path: Path) -> Iterator[list[tuple[NetNode, Transport]]]:
    """A donor and a newcomer."""
    with loopback_hosts(tmp_path, 2) as started:
        yield started


class Rounds:
    """A donor that begins a round every ROUND_S, as a training peer publishes its state."""

    def __init__(self, server: StateServer, first: int) -> None:
        self.server, self.round = server, first
        self.began: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        state = OuterState.from_params([torch.zeros(64)])
        while not self._stop.is_set():
            state.round = self.round
            self.server.publish(state, step_s=ROUND_S / 5)
            self.began[self.round] = time.monotonic()
            self._stop.wait(ROUND_S)
            self.round += 1

    def __enter__(self) -> Rounds:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture()
def serving(
    hosts: list[tuple[NetNode, Transport]], caplog: pytest.LogCaptureFixture
) -> Iterator[tuple[Transport, str, Rounds]]:
    """The newcomer, and the donor's id and rounds: it begins one every ROUND_S from round 10 (its
    header requests are logged, at DEBUG)."""
    (_, donor), (_, newcomer) = hosts
    caplog.set_level(logging.DEBUG, logger="p2p_trainer.net.state_sync")
    with Rounds(StateServer(donor, RUN), first=10) as rounds:
        time.sleep(0.1)
        yield newcomer, donor.peer_id, rounds


def test_a_newcomer_learns_of_its_entry_round_as_it_begins_with_few_requests(
    serving: tuple[Transport, str, Rounds], caplog: pytest.LogCaptureFixture
) -> None:
    newcomer, donor, rounds = serving
    served = await_state_round(newcomer, donor, RUN, 15, ROUND_S, time.monotonic() + 20, 5.0)
    learned = time.monotonic()
    assert served == 15
    # it asked after round 15 began, and within that round: a heartbeat up to two view periods
    # old would have told it rounds later
    assert 0 <= learned - rounds.began[15] < ROUND_S, learned - rounds.began[15]
    requests = sum("serving round-" in r.getMessage() for r in caplog.records)
    # five rounds away: one request to learn where the donor is, one halfway, one at the round's
    # start, and a few more where the rounds' starts drift from the pace
    assert 2 <= requests <= 6, requests


def test_waiting_for_a_round_ends_at_the_limit_and_says_where_the_donor_is(
    serving: tuple[Transport, str, Rounds], caplog: pytest.LogCaptureFixture
) -> None:
    newcomer, donor, _ = serving
    t0 = time.monotonic()
    served = await_state_round(newcomer, donor, RUN, 100, ROUND_S, t0 + 3.0, 5.0)
    took = time.monotonic() - t0
    # a donor whose rounds are far shorter than the pace says is asked at most ROUND_POLLS times
    far = await_state_round(newcomer, donor, RUN, 10_000, 0.0, time.monotonic() + 30, 5.0)
    assert served is not None and 10 <= served < 100
    assert 2.8 <= took < 3.6, took  # it waited until the limit, and no longer
    assert far is not None and far < 10_000
    requests = sum("serving round-" in r.getMessage() for r in caplog.records)
    assert requests <= 1 + ROUND_POLLS + 1, requests


def test_a_donor_that_does_not_answer_ends_the_wait_at_once(hosts: list[tuple[NetNode, Transport]]) -> None:
    (_, donor), (_, newcomer) = hosts  # the donor serves no state for this run
    StateServer(donor, RUN)
    t0 = time.monotonic()
    assert await_state_round(newcomer, donor.peer_id, RUN, 5, ROUND_S, t0 + 20, 5.0) is None
    assert time.monotonic() - t0 < 5.0


def test_header_requests_serialise_a_published_state_once(
    hosts: list[tuple[NetNode, Transport]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A header costs the donor a tenth of a state in its rate limit; it must not cost it a copy
    and a hash of the whole state each time (a joiner asks several while it waits to enter)."""
    (_, donor), (_, newcomer) = hosts
    server = StateServer(donor, RUN)
    serialised: list[int] = []
    real = state_sync._payload

    def counted(snap: state_sync.StateSnapshot) -> bytes:
        serialised.append(snap.round)
        return real(snap)

    monkeypatch.setattr(state_sync, "_payload", counted)
    state = OuterState.from_params([torch.zeros(64)])
    state.round = 3
    server.publish(state)
    headers = [state_sync.state_header(newcomer, donor.peer_id, RUN, 5.0) for _ in range(3)]
    assert all(not isinstance(h, Failed) for h in headers) and len({str(h) for h in headers}) == 1, headers
    assert serialised == [3]
    served = weakref.ref(server.snapshot) if server.snapshot is not None else None
    state.round = 4
    server.publish(state)  # a new round's state is serialised again
    gc.collect()
    assert served is not None and served() is None  # and the last round's is not held for its hash
    assert not isinstance(state_sync.state_header(newcomer, donor.peer_id, RUN, 5.0), Failed)
    assert serialised == [3, 4]
