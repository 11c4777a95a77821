"""Event model: capacity removed for the repair time, pauses, absorption, determinism."""

import numpy as np
import pytest

from p2p_trainer.lab.sim.events import Pauses, Repairs, absorbed_mask, sample_failures

ONE = np.array([0], dtype=np.int64)


def test_failure_removes_slice_capacity_for_exactly_its_repair_time() -> None:
    rep = Repairs(ONE, np.array([100.0]), repair_s=50.0, chips=8, num_units=1)

    def live(a: float, b: float) -> float:
        return float(rep.live_fraction(ONE, np.array([a]), np.array([b]), unit_chips=32)[0])

    assert live(0.0, 100.0) == pytest.approx(1.0)
    assert live(100.0, 150.0) == pytest.approx(0.75)  # 8 of 32 chips out for the whole window
    assert live(150.0, 400.0) == pytest.approx(1.0)  # back after repair_s
    assert live(125.0, 175.0) == pytest.approx(1.0 - 8 * 25 / (32 * 50))
    total = rep.down_chip_s_until(ONE, np.array([1e4]))[0]
    assert total == pytest.approx(8 * 50.0)


def test_repairs_are_per_unit() -> None:
    units = np.array([0, 1, 1], dtype=np.int64)
    rep = Repairs(units, np.array([10.0, 20.0, 30.0]), repair_s=5.0, chips=4, num_units=3)
    down = rep.down_chip_s_until(np.array([0, 1, 2], dtype=np.int64), np.full(3, 100.0))
    np.testing.assert_allclose(down, [20.0, 40.0, 0.0])


def test_pause_stops_unit_and_rewinds_lost_work() -> None:
    p = Pauses.from_failures(ONE, np.array([100.0]), np.array([2.0]), pause_s=10.0, num_units=1)
    assert p.running_until(ONE, np.array([200.0]))[0] == pytest.approx(188.0)
    # Start at 95: 3 s of work before the rewound pause [98, 110), 7 s after.
    assert p.finish_time(ONE, np.array([95.0]), np.array([10.0]))[0] == pytest.approx(117.0)
    # Starting inside a pause waits for its end.
    assert p.finish_time(ONE, np.array([105.0]), np.array([1.0]))[0] == pytest.approx(111.0)
    assert p.finish_time(ONE, np.array([0.0]), np.array([50.0]))[0] == pytest.approx(50.0)


def test_failure_during_a_pause_is_absorbed_not_extending_it() -> None:
    units = np.zeros(3, dtype=np.int64)
    t = np.array([100.0, 105.0, 111.0])
    assert absorbed_mask(units, t, 10.0).tolist() == [False, True, False]
    p = Pauses.from_failures(units, t, np.zeros(3), pause_s=10.0, num_units=1)
    # pauses [100,110) and [111,121): 20 s down
    assert p.downtime_until(ONE, np.array([500.0]))[0] == pytest.approx(20.0)
    # a failure in another unit is independent
    other = np.array([0, 1, 0], dtype=np.int64)
    assert absorbed_mask(other, np.array([100.0, 105.0, 108.0]), 10.0).tolist() == [False, False, True]
    # a chain: 100 kept (pause to 110), 108 absorbed, 112 kept although it is close to 108
    chain = np.array([100.0, 108.0, 112.0])
    assert absorbed_mask(units, chain, 10.0).tolist() == [False, True, False]


def test_all_down_counts_only_simultaneous_pauses() -> None:
    units = np.array([0, 1], dtype=np.int64)
    p = Pauses(units, np.array([10.0, 15.0]), np.array([20.0, 30.0]), num_units=2)
    assert p.all_down_s(100.0) == pytest.approx(5.0)
    p3 = Pauses(units, np.array([10.0, 15.0]), np.array([20.0, 30.0]), num_units=3)
    assert p3.all_down_s(100.0) == pytest.approx(0.0)


def test_sampling_is_deterministic_for_a_seed_and_poisson_in_count() -> None:
    a = sample_failures(1_000_000, 365 * 86400.0, 86400.0, 256, 3600.0, seed=7)
    b = sample_failures(1_000_000, 365 * 86400.0, 86400.0, 256, 3600.0, seed=7)
    c = sample_failures(1_000_000, 365 * 86400.0, 86400.0, 256, 3600.0, seed=8)
    np.testing.assert_array_equal(a.time_s, b.time_s)
    np.testing.assert_array_equal(a.chip, b.chip)
    assert not np.array_equal(a.time_s[:10], c.time_s[:10])
    expected = 1_000_000 / 365
    assert abs(len(a) - expected) < 5 * np.sqrt(expected)
    assert np.all(np.diff(a.time_s) >= 0)


def test_a_slice_in_repair_does_not_fail_again() -> None:
    f = sample_failures(4096, 86400.0, 86400.0 * 4, 256, 7200.0, seed=1)
    order = np.lexsort((f.time_s, f.slice_id))
    same = f.slice_id[order][1:] == f.slice_id[order][:-1]
    gaps = np.diff(f.time_s[order])[same]
    assert len(gaps) > 0
    assert gaps.min() >= 7200.0
