"""docs/algorithms.md §4: quorum size and the adaptive grace window, as pure functions."""

from __future__ import annotations

import math

import pytest

from p2p_trainer.algo.grace import GraceTracker, grace_window_s, quorum_size
from p2p_trainer.config import ConfigError, ExchangeConfig
from p2p_trainer.net.health import PeerHealth


@pytest.mark.parametrize(
    ("n", "fraction", "k"), [(2, 0.5, 1), (3, 0.5, 2), (4, 0.5, 2), (4, 0.75, 3), (5, 1.0, 5), (1, 0.5, 1)]
)
def test_quorum_size_is_ceil_of_fraction_within_group(n: int, fraction: float, k: int) -> None:
    assert quorum_size(n, fraction) == k


def test_grace_window_follows_the_formula_and_clamps() -> None:
    # γ · (τ · t_step − t_quorum − t_sync) = 2 · (5 · 0.4 − 0.3 − 0.2) = 3.0
    assert grace_window_s(0.4, 0.3, 0.2, 5, 2.0, 0.0, 10.0) == pytest.approx(3.0)
    assert grace_window_s(0.4, 0.3, 0.2, 5, 2.0, 0.0, 2.5) == 2.5  # capped
    assert grace_window_s(0.01, 1.0, 1.0, 5, 1.0, 0.0, 10.0) == 0.0  # negative → 0
    assert grace_window_s(0.01, 1.0, 1.0, 5, 1.0, 0.5, 10.0) == 0.5  # our floor
    assert grace_window_s(math.nan, 0.0, 0.0, 5, 1.0, 0.5, 10.0) == 10.0


def test_tracker_uses_emas_and_starts_at_the_cap() -> None:
    t = GraceTracker(overlap_steps=4, gamma=1.0, min_s=0.0, max_s=30.0, decay=0.5)
    assert t.window_s() == 30.0  # nothing measured yet
    t.observe_step(1.0)
    assert t.window_s() == 30.0  # no exchange timed yet
    t.observe_exchange(quorum_s=0.0, sync_s=0.0)
    assert t.window_s() == pytest.approx(4.0)
    t.observe_step(3.0)  # EMA: 0.5·1 + 0.5·3 = 2
    assert t.t_step_s == pytest.approx(2.0)
    t.observe_exchange(quorum_s=2.0, sync_s=1.0)  # EMA from 0: 1.0 and 0.5
    assert t.window_s() == pytest.approx(4 * 2.0 - 1.0 - 0.5)
    t.observe_exchange(quorum_s=3.0, sync_s=0.5)
    assert t.t_quorum_s == pytest.approx(2.0)
    t.observe_exchange(quorum_s=math.inf, sync_s=0.0)  # ignored
    assert t.t_quorum_s == pytest.approx(2.0)
    assert 1.0 <= t.result_wait_s() <= 30.0


def _timed(step_s: float = 0.1) -> GraceTracker:
    t = GraceTracker(overlap_steps=5, gamma=1.0, min_s=1.0, max_s=8.0, margin=1.25, decay=0.9)
    t.observe_step(step_s)
    t.observe_exchange(quorum_s=0.0, sync_s=0.2)
    return t


def test_window_covers_the_observed_arrival_of_punctual_members() -> None:
    t = _timed()
    assert t.window_s() == 1.0  # the formula alone: 5 · 0.1 − 0.2 < the 1 s floor
    t.observe_arrivals(2.4)  # a slow link: the partner's part took 2.4 s to arrive
    assert t.window_s() == pytest.approx(1.25 * 2.4)
    for sample in (2.2, 2.6, 6.0, 2.5):  # one member late once (its previous exchange waited)
        t.observe_arrivals(sample)
    assert t.t_arrive_s == pytest.approx(2.5)  # the median of 2.2, 2.4, 2.5, 2.6, 6.0
    for _ in range(5):  # the link got faster: after half the samples the window follows
        t.observe_arrivals(0.4)
    assert t.window_s() == 1.0  # 1.25 · 0.4 is under the floor
    for _ in range(9):
        t.observe_arrivals(20.0)  # never past grace_max_s
    assert t.window_s() == 8.0


def test_a_failed_first_exchange_ends_the_start_up_window() -> None:
    t = GraceTracker(overlap_steps=5, gamma=1.0, min_s=1.0, max_s=8.0)
    t.observe_step(0.1)
    assert t.window_s() == 8.0
    t.observe_failure()  # e.g. a restarted peer its partners do not see yet
    assert t.window_s() == 1.0  # the formula from here on, not 8 s in every failing round


def test_exchanges_with_nothing_timed_leave_the_window_alone() -> None:
    t = _timed()
    t.observe_arrivals(1.6)
    for sample in (0.0, math.nan, -1.0, math.inf):  # nothing arrived, or nonsense
        t.observe_arrivals(sample)
    assert t.t_arrive_s == pytest.approx(1.6)


def test_config_validates_quorum_and_grace() -> None:
    with pytest.raises(ConfigError, match="quorum_fraction"):
        ExchangeConfig(quorum_fraction=0.0)
    with pytest.raises(ConfigError, match="grace_min_s"):
        ExchangeConfig(grace_min_s=3.0, grace_max_s=2.0)
    with pytest.raises(ConfigError, match="grace_margin"):
        ExchangeConfig(grace_margin=0.5)
    cfg = ExchangeConfig(quorum_wait_max_s=4.0, grace_max_s=2.0)
    assert cfg.pause_bound_s == 10.0
    assert ExchangeConfig(timeout_s=3.0).pause_bound_s == 3.0


def test_peer_health_suspects_only_peers_reached_before() -> None:
    now = [0.0]
    h = PeerHealth(suspect_s=5.0, clock=lambda: now[0])
    h.send_failed("new")
    assert not h.suspect("new")  # routing to a new peer may still be warming up
    h.delivered("old")
    h.send_failed("old")
    assert h.suspect("old") and h.suspects() == {"old"}
    now[0] = 5.1
    assert not h.suspect("old")
    h.gave_up("new")
    assert h.suspect("new")
    h.delivered("new")
    assert not h.suspect("new")


def test_rejoin_target_is_the_majority_round() -> None:
    from p2p_trainer.run.entry_paths import rejoin_target

    assert rejoin_target(5, [20, 21], 3) == 20  # stalled: behind the others
    assert rejoin_target(120, [30, 31], 3) == 31  # alone behind a cut link: raced ahead
    assert rejoin_target(30, [31, 120], 3) is None  # the majority does not follow the racer
    assert rejoin_target(30, [32], 3) is None
    assert rejoin_target(30, [25, 24], 3) is None  # a little ahead: heartbeats may just be stale
    assert rejoin_target(40, [30, 31], 3) == 31
    assert rejoin_target(10, [], 3) is None
    assert rejoin_target(5, [20, 21], 0) is None


def test_a_peer_outvoted_by_the_swarms_bounds_is_the_one_that_drifted() -> None:
    from p2p_trainer.run.entry_paths import outvoted

    others = {"a": 16, "b": 16}
    assert outvoted(others, {"a", "b"}) == ["a", "b"]  # both others refuse this peer: it drifted
    assert outvoted(others, {"a"}) == []  # one liar never makes an honest peer give up its state
    assert outvoted({"a": 16}, {"a"}) == []  # two peers apart: nothing says which one drifted
    assert outvoted({"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}, {"a", "b"}) == []  # a minority
    assert outvoted({"a": 1, "b": 1, "c": 1, "d": 1}, {"a", "b", "x"}) == ["a", "b"]  # half of the live


def test_alone_rounds_count_rounds_that_did_not_merge_fully() -> None:
    from p2p_trainer.algo.methods import RoundReport
    from p2p_trainer.round_log import ExchangeRecord
    from p2p_trainer.run.entry_paths import alone_rounds
    from p2p_trainer.train.trainer import RoundMetrics

    def metrics(*records: ExchangeRecord) -> RoundMetrics:
        return RoundMetrics(0, 0, 0, 0.0, 0.0, 0.0, 0.0, RoundReport(0, list(records)))

    merged = ExchangeRecord("outer", True, 2, 0.1, 0.1, 1, 1)
    alone = ExchangeRecord("outer", True, 1, 0.0, 0.0, 0, 0)
    failed = ExchangeRecord("outer", False, 1, 1.0, 1.0, 0, 0, "no one")
    partial = ExchangeRecord("outer", True, 1, 1.0, 1.0, 1, 1, own_parts=1)
    late = ExchangeRecord("outer", True, 1, 1.0, 1.0, 1, 1, own_parts=1, late_parts=1)
    assert alone_rounds(2, metrics(partial)) == 0  # a partner's part did not come back: not our lag
    assert alone_rounds(2, metrics(late)) == 3  # the others averaged without this peer: it is late
    assert alone_rounds(2, metrics(late, merged)) == 0
    assert alone_rounds(2, metrics(alone)) == 3
    assert alone_rounds(2, metrics(failed, alone)) == 3
    assert alone_rounds(2, metrics(failed, merged)) == 0
    assert alone_rounds(2, metrics()) == 2  # no exchange (e.g. independent): no evidence


def test_estimated_round_adds_what_the_reported_throughput_allows() -> None:
    from p2p_trainer.net.records import Heartbeat
    from p2p_trainer.run.entry_paths import estimated_round

    beat = Heartbeat("x", 10, 0, None, 500.0, "0", timestamp=100.0)
    assert estimated_round(beat, 102.0, 250) == 14  # 2 s at 2 rounds/s
    assert estimated_round(beat, 99.0, 250) == 10  # clock skew: never fewer
