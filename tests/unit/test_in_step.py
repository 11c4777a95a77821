"""Which peers are out of step (net/in_step.py): rounds compared at the heartbeat's instant."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import cast

from p2p_trainer.exchange.interface import ALL, ExchangeRequest
from p2p_trainer.net.in_step import RoundHistory, out_of_step
from p2p_trainer.net.network_exchange import NetworkExchange
from p2p_trainer.net.records import Heartbeat
from p2p_trainer.net.transport import Transport
from p2p_trainer.run.final_agreement import final_request
from tests.conftest import tiny_config


def beat(peer: str, rnd: int, at: float) -> Heartbeat:
    return Heartbeat(peer, rnd, 0, None, 0.0, "0.1.0", at)


def history(first: int, starts: list[float]) -> RoundHistory:
    h = RoundHistory()
    for i, t in enumerate(starts):
        h.entered(first + i, t)
    return h


def test_history_says_the_round_at_a_time_and_restarts_after_a_jump() -> None:
    h = history(10, [100.0, 101.0, 102.0])
    assert h.round_at(99.9) is None  # before the history
    assert (h.round_at(100.0), h.round_at(100.5), h.round_at(101.0), h.round_at(500.0)) == (10, 10, 11, 12)
    h.entered(12, 102.5)  # the same round again keeps its first start
    assert h.round_at(102.2) == 12
    h.entered(40, 103.0)  # adopted the swarm's round: what came before says nothing of the pace now
    assert h.round_at(102.9) is None and h.round_at(103.0) == 40
    h.entered(41, 104.0)
    h.entered(5, 105.0)  # a step back (a rejoin to a lower round) restarts it too
    assert h.round_at(104.5) is None and h.round_at(105.0) == 5


def test_history_keeps_a_bounded_number_of_rounds() -> None:
    h = RoundHistory(keep=3)
    for r in range(1, 7):
        h.entered(r, float(r))
    assert h.round_at(3.5) is None and h.round_at(4.0) == 4 and h.round_at(6.5) == 6


def test_peers_far_ahead_at_their_heartbeat_time_are_out_of_step_if_half_of_the_others() -> None:
    # this peer entered rounds 10..29 at 100, 101, ..., 119 (one round a second)
    mine = history(10, [100.0 + i for i in range(20)])
    beats = [
        beat("me", 29, 119.5),
        beat("racing", 30, 110.5),  # this peer was in 20 then: ten ahead
        beat("far-ahead", 40, 118.5),  # this peer was in 28: twelve ahead
        beat("next-round", 22, 110.9),  # two ahead of 20, within a skew of entering 21
        beat("before-history", 300, 95.0),  # older than this peer's history: not judged
    ]
    assert out_of_step(beats, mine, "me") == {"racing", "far-ahead"}  # 2 of 4 others
    beats += [
        beat("old-news", 12, 102.5),  # an old heartbeat from a peer in step then (this peer: 12)
        beat("lagging", 14, 116.5),  # twelve behind: it may have jumped since (it leaves us out)
    ]
    # 2 of 6: this peer is not the one behind; a minority ahead (or a liar) is left in, so that
    # peers in step never draw their groups from different lists
    assert out_of_step(beats, mine, "me") == set()


def test_the_bounds_are_rounds_and_a_clock_skew() -> None:
    mine = history(10, [100.0 + i for i in range(10)])  # rounds 10..19
    # at 105.1 this peer was in 15 (at 105.1 + 0.25 too)
    assert out_of_step([beat("p", 17, 105.1)], mine, "me") == set()  # 15 + 2
    assert out_of_step([beat("p", 18, 105.1)], mine, "me") == {"p"}
    assert out_of_step([beat("p", 18, 105.1)], mine, "me", lag_rounds=3) == set()
    assert out_of_step([beat("p", 18, 105.1)], mine, "me", skew_s=1.0) == set()  # in 16 at 106.1
    assert out_of_step([beat("p", 18, 104.8)], mine, "me") == {"p"}  # in 15 at 105.05
    assert out_of_step([beat("p", 17, 104.7)], mine, "me") == {"p"}  # in 14 at 104.95


def test_a_rounds_groups_leave_out_the_peers_ahead_but_the_final_agreement_counts_all() -> None:
    transport = cast(Transport, SimpleNamespace(peer_id="me"))
    exchange = NetworkExchange(transport, lambda: ["b", "c", "d"], "run", 0, out_of_step=lambda: {"b", "c"})
    in_round = ExchangeRequest("mix2", 7, ALL)
    assert exchange._group(in_round).members == ["d", "me"]
    assert exchange._group(replace(in_round, in_round=False)).members == ["b", "c", "d", "me"]
    final = final_request(tiny_config("factored", rounds=2))
    assert not final.in_round and exchange._group(final).members == ["b", "c", "d", "me"]
