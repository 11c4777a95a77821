"""A newcomer's entry into the groups, and a leave for a time bound (net/entry.py): rounds named
ahead, which every view applies."""

from __future__ import annotations

import math
from collections.abc import Coroutine
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch

from p2p_trainer.exchange.interface import ALL, ExchangeRequest, Failed
from p2p_trainer.net.entry import (
    MAX_ENTRY_ROUNDS,
    GroupEntry,
    RoundPace,
    TimeBound,
    entry_round,
    has_left,
    in_groups,
)
from p2p_trainer.net.network_exchange import NetworkExchange
from p2p_trainer.net.records import Heartbeat, RecordError
from p2p_trainer.net.transport import Transport


def beat(peer: str, rnd: int, started: float, enters: int = 0, leaves: int = 0) -> Heartbeat:
    b = Heartbeat(peer, rnd, 0, None, 0.0, "0.1.0", started + 0.5, round_started=started)
    return replace(b, enters_round=enters, leaves_round=leaves)


def test_a_long_round_is_entered_at_once_and_short_ones_after_the_heartbeat_has_spread() -> None:
    # the adopted round's exchange starts in 8 s, after the 5 s its heartbeat needs to spread
    assert entry_round(40, remaining_s=8.0, round_s=10.0, entry_s=5.0) == 40
    # 1 s left, rounds of 10 s: the next round's exchange starts 11 s from now
    assert entry_round(40, remaining_s=1.0, round_s=10.0, entry_s=5.0) == 41
    # 0.2 s left, rounds of 0.1 s: the 48th round after this one starts 5.0 s from now
    assert entry_round(40, remaining_s=0.2, round_s=0.1, entry_s=5.0) == 88
    assert entry_round(40, remaining_s=0.0, round_s=1e-6, entry_s=5.0) == 40 + MAX_ENTRY_ROUNDS
    # no round time known: the next round at least, never the adopted one
    assert entry_round(40, remaining_s=0.0, round_s=0.0, entry_s=5.0) == 41
    assert entry_round(40, remaining_s=0.0, round_s=math.nan, entry_s=5.0) == 41
    assert entry_round(40, remaining_s=math.nan, round_s=0.1, entry_s=5.0) == 40


def test_an_entry_several_rounds_ahead_is_waited_for_and_met_with_a_fresh_state() -> None:
    assert not GroupEntry.plan(
        40, 1.0, 10.0, 5.0
    ).refreshes  # one round alone costs what a failed exchange does
    far = GroupEntry.plan(40, 0.2, 0.1, 5.0)
    assert far.refreshes and (far.adopted, far.enters) == (40, 88)
    assert far.wait_limit_s(5.0) == pytest.approx(3 * (5.0 + 48 * 0.1))
    assert GroupEntry.plan(40, 0.0, 30.0, 5.0).wait_limit_s(5.0) == 60.0  # 3 x 35 s, but a minute at most
    assert GroupEntry.plan(40, 0.0, math.inf, 5.0).round_s == 0.0  # a claim that cannot be used


def test_the_heartbeat_wait_ends_a_view_period_of_rounds_before_the_entry() -> None:
    # rounds of 0.1 s and heartbeats read up to 4 s after their peer was there (published, then
    # read, once a 2 s period each): the swarm can be 40 rounds past what they show
    assert GroupEntry(40, 88, 0.1).heartbeat_round(2.0) == 48
    # rounds longer than two periods: one round before the entry
    assert GroupEntry(40, 45, 5.0).heartbeat_round(2.0) == 44
    # never the adopted round itself, nor before it; no pace: the entry round
    assert GroupEntry(40, 45, 0.01).heartbeat_round(2.0) == 41
    assert GroupEntry(40, 45, 0.0).heartbeat_round(2.0) == 45


def test_the_round_pace_is_the_median_of_what_the_peers_heartbeats_show() -> None:
    pace = RoundPace()
    assert pace.round_s("me") == 0.0
    pace.saw([beat("a", 10, 100.0), beat("b", 10, 100.0), beat("c", 10, 100.0), beat("me", 3, 90.0)])
    assert pace.round_s("me") == 0.0  # one round each: no pace yet
    pace.saw([beat("a", 20, 102.0), beat("b", 15, 102.0), beat("c", 12, 102.0), beat("me", 50, 91.0)])
    assert pace.round_s("me") == pytest.approx(0.4)  # 0.2, 0.4 and 1.0 s per round: the median
    # a peer that went back (a rejoin) starts over; one no longer in view is forgotten
    pace.saw([beat("a", 5, 103.0), beat("b", 25, 104.0)])
    assert pace.round_s("me") == pytest.approx(4.0 / 15)  # b alone: 4 s for 15 rounds
    pace.saw([beat("a", 5, 103.0), beat("b", 25, 104.0)])  # the same heartbeats read again add nothing
    assert pace.round_s("me") == pytest.approx(4.0 / 15)
    pace.saw([beat("a", 7, 104.0), beat("b", 25, 104.0)])  # a: 1 s for 2 rounds since it went back
    assert pace.round_s("me") == pytest.approx(0.5)  # the upper median of 0.27 and 0.5


def test_a_round_read_twice_with_two_starts_keeps_the_pace() -> None:
    pace = RoundPace()
    pace.saw([beat("a", 10, 100.0)])
    pace.saw([beat("a", 10, 100.3)])  # the round's start stamped again: not a restart
    pace.saw([beat("a", 14, 102.0)])
    assert pace.round_s("me") == pytest.approx(0.5)


def test_rounds_longer_than_the_window_are_measured_by_the_last_two_starts() -> None:
    pace = RoundPace(window_s=30.0)
    pace.saw([beat("a", 1, 10.0)])
    pace.saw([beat("a", 2, 50.0)])
    assert pace.round_s("me") == pytest.approx(40.0)


def test_round_starts_older_than_the_window_are_dropped() -> None:
    pace = RoundPace(window_s=10.0)
    pace.saw([beat("a", 1, 1.0)])
    pace.saw([beat("a", 2, 2.0)])  # a slow start: 1 s a round
    pace.saw([beat("a", 100, 21.0)])  # then fast; the first start is out of the window
    assert pace.round_s("me") == pytest.approx(19.0 / 98)
    pace.saw([beat("a", 120, 23.0)])  # and now the second
    assert pace.round_s("me") == pytest.approx(0.1)


def test_the_entry_round_travels_in_the_heartbeat_and_is_bounded() -> None:
    b = beat("a", 10, 100.0, enters=58)
    assert Heartbeat.decode(b.encode()).enters_round == 58
    plain = beat("a", 10, 100.0)
    assert b"enters_round" not in plain.encode()  # left out at 0, and read as 0
    assert Heartbeat.decode(plain.encode()).enters_round == 0
    for bad in (-1, True, 1.5, 1 << 40, "58"):
        raw = replace(b, enters_round=bad)  # type: ignore[arg-type]
        with pytest.raises(RecordError, match="enters_round"):
            Heartbeat.decode(raw.encode())


def test_the_leave_round_travels_in_the_heartbeat_and_is_bounded() -> None:
    b = beat("a", 10, 100.0, leaves=14)
    assert Heartbeat.decode(b.encode()).leaves_round == 14
    assert b"leaves_round" not in beat("a", 10, 100.0).encode()
    assert Heartbeat.decode(beat("a", 10, 100.0).encode()).leaves_round == 0
    for bad in (-1, True, 1.5, 1 << 40, "14"):
        raw = replace(b, leaves_round=bad)  # type: ignore[arg-type]
        with pytest.raises(RecordError, match="leaves_round"):
            Heartbeat.decode(raw.encode())


def test_groups_count_a_peer_from_its_entry_round_and_before_its_leave_round() -> None:
    assert in_groups(beat("a", 10, 100.0), 0) and in_groups(beat("a", 10, 100.0), 10**6)
    newcomer = beat("a", 10, 100.0, enters=12)
    assert [in_groups(newcomer, r) for r in (11, 12, 13)] == [False, True, True]
    leaving = beat("a", 10, 100.0, leaves=14)
    assert [in_groups(leaving, r) for r in (0, 13, 14, 15)] == [True, True, False, False]
    both = beat("a", 10, 100.0, enters=12, leaves=14)
    assert [in_groups(both, r) for r in (11, 12, 13, 14)] == [False, True, True, False]

    # a heartbeat keeps the last round its peer began: in that round it is leaving, past it gone
    assert [has_left(leaving, r) for r in (12, 13, 14)] == [False, True, True]
    assert not has_left(newcomer, 10**6)


def test_a_time_bound_names_the_first_round_that_starts_past_it_once_it_is_near() -> None:
    bound = TimeBound(deadline=100.0, notice_s=5.0)
    # more than the notice before the bound: nothing named, no stop
    assert bound.leave_round(94.9, 40, remaining_s=0.3, round_s=1.0) is None
    assert not bound.over(40)
    # 5 s before the bound, round 40's exchange in 0.3 s, then one every second: rounds 41 to 44
    # start before the bound, and 45's at 100.3 s
    assert bound.leave_round(95.0, 40, remaining_s=0.3, round_s=1.0) == 45
    assert bound.leave_round(96.0, 41, remaining_s=0.3, round_s=1.0) is None  # named once
    assert not bound.over(44)  # round 44's exchange still counts this peer
    assert bound.over(45)  # its leave round: stop, it takes no part in it


def test_a_time_bound_leaves_the_round_whose_exchange_starts_past_it_at_once() -> None:
    # a long round: its exchange would start after the bound, so it is left out and the peer
    # stops now; the inner steps it would make until the bound would reach no exchange
    bound = TimeBound(deadline=100.0, notice_s=5.0)
    assert bound.leave_round(95.0, 40, remaining_s=30.0, round_s=40.0) == 40
    assert bound.over(40)
    # in round 0 too (a leave named 0 is not "none named": it is not named again)
    first = TimeBound(deadline=100.0, notice_s=5.0)
    assert first.leave_round(95.0, 0, remaining_s=30.0, round_s=0.0) == 0 and first.over(0)
    assert first.leave_round(95.5, 0, remaining_s=29.5, round_s=0.0) is None
    # named late (the bound already passed): the current round, and a stop
    late = TimeBound(deadline=100.0, notice_s=5.0)
    assert late.leave_round(101.0, 7, remaining_s=0.0, round_s=1.0) == 7 and late.over(7)


def test_a_time_bound_leaves_where_it_is_if_its_rounds_run_slower_than_planned() -> None:
    bound = TimeBound(deadline=100.0, notice_s=5.0)
    assert bound.leave_round(95.0, 40, remaining_s=0.3, round_s=1.0) == 45
    assert bound.leave_round(104.9, 42, remaining_s=0.3, round_s=1.0) is None and not bound.over(42)
    # the notice past the bound: it names the round it is in, so the others stop counting on it
    assert bound.leave_round(105.0, 42, remaining_s=0.3, round_s=1.0) == 42 and bound.over(42)
    none = TimeBound(deadline=math.inf, notice_s=5.0)  # no bound: never named, never over
    assert none.leave_round(1e12, 3, 0.0, 1.0) is None and not none.over(3)


def _exchange(outside_groups: set[str], entered_from: int) -> NetworkExchange:
    transport = cast(Transport, SimpleNamespace(peer_id="me"))
    return NetworkExchange(
        transport,
        lambda: ["b", "c", "d"],
        "run",
        0,
        outside_groups=lambda round: outside_groups if round < entered_from else set(),
    )


def test_a_rounds_groups_leave_out_peers_outside_them_but_the_final_counts_them() -> None:
    exchange = _exchange({"b"}, entered_from=9)
    request = ExchangeRequest("mix2", 8, ALL)
    assert exchange._group(request).members == ["c", "d", "me"]
    assert exchange._group(replace(request, round=9)).members == ["b", "c", "d", "me"]
    assert exchange._group(replace(request, in_round=False)).members == ["b", "c", "d", "me"]


def test_a_peer_outside_a_rounds_groups_fails_its_exchanges_at_once_with_the_reason() -> None:
    exchange = _exchange({"me"}, entered_from=9)
    tensors = [torch.ones(3)]
    res = exchange.start(tensors, ExchangeRequest("outer", 8, ALL)).result(1.0)
    assert isinstance(res, Failed) and "groups: waiting to enter them" in res.reason
    # from its entry round on, it is a member like any other (here: the transport is needed)
    with pytest.raises(AttributeError, match="submit"):
        exchange.start(tensors, ExchangeRequest("outer", 9, ALL))


class _Unreachable:
    """A transport whose every request fails, as to donors that are gone or refuse."""

    def __init__(self) -> None:
        self.asked = 0

    def run(self, coro: Coroutine[Any, Any, Any], timeout_s: float | None = None) -> object:
        self.asked += 1
        coro.close()  # never awaited
        raise ConnectionError("no route")


class _Heartbeats:
    def __init__(self) -> None:
        self.period_s = 2.0
        self.waited: list[tuple[int, float, float]] = []

    def wait_for_round(self, round: int, min_s: float, timeout_s: float) -> bool:
        self.waited.append((round, min_s, timeout_s))
        return True


def test_where_no_donor_answers_a_newcomer_waits_for_the_heartbeats_to_show_its_entry() -> None:
    """Where no donor answers, the newcomer does not download at once (its state would be rounds
    older than its entry, and drift): it falls back to the heartbeats, up to its limit."""
    import time

    from p2p_trainer.run.entry_paths import ENTRY_ASKS, await_entry

    transport, view = _Unreachable(), _Heartbeats()
    entry = GroupEntry(40, 88, 0.1)
    until = time.monotonic() + 30.0
    await_entry(view, transport, "run", ["d1", "d2", "d3"], entry, until, 5.0)  # type: ignore[arg-type]
    assert transport.asked == ENTRY_ASKS  # each of the first donors asked once
    assert len(view.waited) == 1
    round, least_s, limit_s = view.waited[0]
    assert (round, least_s) == (88, 0.0) and 25.0 < limit_s <= 30.0


class _Behind(_Unreachable):
    """A donor that always says it is at round 10, however long one waits: a liar, or a peer that
    fell behind."""

    def run(self, coro: Coroutine[Any, Any, Any], timeout_s: float | None = None) -> object:
        self.asked += 1
        coro.close()
        return {"key": "state", "round": 10, "round_elapsed_s": 0.0, "step_s": 0.0}, b""


def test_a_donor_can_hold_a_newcomer_back_only_as_long_as_the_swarm_should_take() -> None:
    """From where the heartbeats showed the swarm, it needs about two periods to begin the entry
    round; a donor that keeps saying it has not begun holds the newcomer about that long (half a
    period more), not up to the newcomer's whole limit, and the heartbeats then decide."""
    import time

    from p2p_trainer.run.entry_paths import await_entry

    transport, view = _Behind(), _Heartbeats()
    view.period_s = 0.4
    entry = GroupEntry(40, 88, 0.1)  # the heartbeats' round: 88 - 8 = 80, 0.8 s of rounds away
    t0 = time.monotonic()
    await_entry(view, transport, "run", ["d1", "d2"], entry, t0 + 30.0, 5.0)  # type: ignore[arg-type]
    took = time.monotonic() - t0
    assert 0.9 <= took < 1.5, took  # 0.8 s of rounds + 0.2 s, not 30 s
    # it answered each time, so no second donor is asked; the heartbeats decide from there
    assert transport.asked >= 1 and len(view.waited) == 1 and view.waited[0][0] == 88


class _Arrival:
    """A joiner's view: donors in sight at first (heartbeats at `round`), then none."""

    def __init__(self, round: int) -> None:
        self.period_s = 2.0
        self.status = SimpleNamespace(enters_round=0)
        self.named: list[int] = []
        self._reads = [[beat("12D3KooWDonorA", round, 1.0), beat("12D3KooWDonorB", round, 1.0)]]

    def heartbeats(self) -> list[Heartbeat]:
        return self._reads.pop(0) if self._reads else []

    def enter_groups_at(self, round: int) -> None:
        self.status.enters_round = round
        self.named.append(round)

    def wait_for_pace(self, timeout_s: float) -> None:
        pass


def test_a_joiner_is_out_of_every_group_while_it_downloads_and_back_if_it_starts_a_new_swarm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before its first download a joiner names an entry no group reaches (the run's last round),
    so a view holding its round-0 heartbeat leaves it out; the download would name the real entry.
    Where every download fails and the donors are gone, it starts a new swarm: counted from round 0."""
    from p2p_trainer.config import RunConfig
    from p2p_trainer.run import entry_paths

    cfg = RunConfig(rounds=500)
    view = _Arrival(40)
    during: list[int] = []

    def failed(*_args: object) -> list[str]:
        during.append(view.status.enters_round)
        return ["no donor answered"]

    monkeypatch.setattr(entry_paths, "_download_from", failed)
    monkeypatch.setattr(entry_paths.time, "sleep", lambda _s: None)
    peer = SimpleNamespace(cfg=cfg, val=None)
    transport = SimpleNamespace(peer_id="12D3KooWJoiner")
    joined = entry_paths.late_join(peer, view, transport, "run", 640)  # type: ignore[arg-type]
    assert joined is False
    assert during == [500]  # out of every group while it downloads
    assert view.named == [500, 0] and view.status.enters_round == 0
