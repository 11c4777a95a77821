"""A newcomer's entry into the groups (net/entry.py): a round named ahead, which every view applies."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace
from typing import cast

import pytest
import torch

from p2p_trainer.exchange.interface import ALL, ExchangeRequest, Failed
from p2p_trainer.net.entry import (
    MAX_ENTRY_ROUNDS,
    GroupEntry,
    RoundPace,
    entry_round,
)
from p2p_trainer.net.network_exchange import NetworkExchange
from p2p_trainer.net.records import Heartbeat, RecordError
from p2p_trainer.net.transport import Transport


def beat(peer: str, rnd: int, started: float, enters: int = 0) -> Heartbeat:
    b = Heartbeat(peer, rnd, 0, None, 0.0, "0.1.0", started + 0.5, round_started=started)
    return replace(b, enters_round=enters)


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
    assert isinstance(res, Failed) and "waiting to enter the swarm's groups" in res.reason
    # from its entry round on, it is a member like any other (here: the transport is needed)
    with pytest.raises(AttributeError, match="submit"):
        exchange.start(tensors, ExchangeRequest("outer", 9, ALL))
