"""Per-method timing models: behaviour without failures, with stragglers, slow links, determinism."""

import dataclasses

import numpy as np
import pytest

from p2p_trainer.lab.sim import Scenario, simulate
from p2p_trainer.lab.sim.decoupled import decoupled
from p2p_trainer.lab.sim.events import FailureEvents
from p2p_trainer.lab.sim.latency import ring_allreduce_s
from p2p_trainer.lab.sim.sampled import SampledSwarm
from p2p_trainer.lab.sim.timing import elastic_dp, sync_dp

NO_FAILURES = Scenario(
    num_chips=64,
    num_peers=8,
    chips_per_slice=8,
    mtbi_chip_s=1e15,
    model_params=1e8,
    bandwidth_gbps=1.0,
    latency_ms=20.0,
    num_inner_steps=50,
    step_s=1.0,
    horizon_s=6 * 3600.0,
    mix2_every=4,
)


def test_without_failures_goodput_is_the_compute_share_of_a_round() -> None:
    res = simulate(NO_FAILURES)
    compute_s = 50.0
    allreduce = ring_allreduce_s(8, 4e8, 1e9 / 8, 0.02)
    assert res["diloco"].mean_round_s == pytest.approx(compute_s + allreduce, rel=1e-6)
    assert res["diloco"].goodput == pytest.approx(compute_s / (compute_s + allreduce), abs=0.01)
    # learners never wait: no failures, no stragglers -> all chip-time is useful
    assert res["decoupled"].goodput == pytest.approx(1.0, abs=1e-3)
    for name in ("sync_dp", "elastic_dp"):
        # a per-step gradient all-reduce over 1 Gbit/s links dominates a 1 s step
        assert res[name].goodput == pytest.approx(1.0 / (1.0 + allreduce), rel=1e-3)
    assert res["noloco"].goodput > res["diloco"].goodput
    assert all(r.uptime == pytest.approx(1.0, abs=0.2) for r in res.values())


def test_bytes_per_peer_per_round() -> None:
    res = simulate(NO_FAILURES)
    assert res["noloco"].bytes_per_peer_per_round == pytest.approx(4e8)  # pairs: one model each way
    assert res["diloco"].bytes_per_peer_per_round == pytest.approx(2 * 7 / 8 * 4e8)
    assert res["gossip"].bytes_per_peer_per_round == pytest.approx(4e8 + 2 * 7 / 8 * 4e8 / 4)


def test_stragglers_slow_synchronous_methods_not_learners() -> None:
    slow = dataclasses.replace(NO_FAILURES, straggler_sigma=0.3, bandwidth_gbps=1e4)
    fast = dataclasses.replace(NO_FAILURES, bandwidth_gbps=1e4)
    r_slow, r_fast = simulate(slow), simulate(fast)
    assert r_slow["sync_dp"].goodput < r_fast["sync_dp"].goodput - 0.05
    assert r_slow["diloco"].goodput < r_fast["diloco"].goodput - 0.05
    # learners are only as slow as their own speed: no waiting on the slowest, nothing wasted
    assert r_slow["decoupled"].utilisation == pytest.approx(1.0, abs=1e-3)
    assert r_slow["decoupled"].goodput == pytest.approx(1.0, abs=1e-3)
    # fast peers do not push goodput above what the hardware could do
    assert all(0.0 <= r.goodput <= 1.0 + 1e-9 for r in r_slow.values())
    assert r_slow["decoupled"].goodput > r_slow["diloco"].goodput + 0.05


def test_gossip_mix1_is_hidden_when_fast_and_dropped_after_grace_when_slow() -> None:
    fast = dataclasses.replace(NO_FAILURES, mix2_every=0, bandwidth_gbps=10.0)
    r = simulate(fast)["gossip"]
    assert r.mean_round_s == pytest.approx(50.0)
    assert r.extra["mix1_dropped_fraction"] == 0.0
    slow = dataclasses.replace(fast, bandwidth_gbps=0.01, grace_max_s=5.0)
    r = simulate(slow)["gossip"]
    assert r.extra["mix1_dropped_fraction"] == 1.0
    assert r.mean_round_s == pytest.approx(55.0)  # compute + the whole grace window, never more


def test_failures_cost_synchronous_methods_more() -> None:
    s = dataclasses.replace(
        NO_FAILURES,
        num_chips=65536,
        num_peers=16,
        chips_per_slice=256,
        mtbi_chip_s=86400.0 * 30,
        bandwidth_gbps=1e4,
        latency_ms=0.1,
    )
    r = simulate(s)
    assert r["sync_dp"].goodput < r["elastic_dp"].goodput < r["decoupled"].goodput
    assert r["diloco"].goodput < r["decoupled"].goodput
    assert r["decoupled"].extra["mean_contributors"] >= r["decoupled"].extra["quorum"]


def test_same_seed_same_result_other_seed_differs() -> None:
    s = dataclasses.replace(NO_FAILURES, num_chips=8192, mtbi_chip_s=86400.0 * 10, chips_per_slice=64)
    a, b = simulate(s), simulate(s)
    c = simulate(dataclasses.replace(s, seed=1))
    assert {k: v.to_dict() for k, v in a.items()} == {k: v.to_dict() for k, v in b.items()}
    assert a["elastic_dp"].goodput != c["elastic_dp"].goodput


def test_predict_reports_what_a_testbed_measures() -> None:
    from p2p_trainer.lab.sim import predict

    s = dataclasses.replace(NO_FAILURES, methods=("diloco", "noloco"))
    pred = predict(s)
    full = simulate(s)
    assert sorted(pred) == ["diloco", "noloco"]
    for name, p in pred.items():
        assert p["round_time_s"] == full[name].mean_round_s
        assert p["utilisation"] == full[name].utilisation
        assert p["bytes_per_peer_per_round"] == full[name].bytes_per_peer_per_round
    assert full["noloco"].bytes_per_peer_total == pytest.approx(4e8 * full["noloco"].rounds)


def test_one_injected_failure_costs_exactly_pause_lost_work_and_repair() -> None:
    s = Scenario(
        num_chips=1024,
        num_peers=4,
        chips_per_slice=64,
        repair_s=600.0,
        restart_s=60.0,
        reconfig_s=20.0,
        step_s=2.0,
        checkpoint_interval_s=2.0,
        bandwidth_gbps=1e9,
        latency_ms=0.0,
        horizon_s=7200.0,
    )
    sw = SampledSwarm.sample(s)
    one = FailureEvents(np.array([1000.0]), np.array([5], dtype=np.int64), repair_s=600.0, chips_per_slice=64)
    sw = dataclasses.replace(sw, failures=one)
    lost = float(sw.lost_work_s(2.0)[0])
    chip_s = s.num_chips * s.horizon_s
    # sync: the whole job stops for the restart and the work since the checkpoint; spares keep capacity
    assert sync_dp(sw).goodput == pytest.approx(1.0 - (60.0 + lost) / s.horizon_s, abs=1e-5)
    # elastic: everyone stops for the re-formation and the lost step; the slice is gone for its repair
    deficit = (20.0 + lost) * s.num_chips + 64 * 600.0
    assert elastic_dp(sw).goodput == pytest.approx(1.0 - deficit / chip_s, abs=5e-4)
    # learners: only the failed chip's learner (256 chips) pauses
    deficit = (20.0 + lost) * s.chips_per_peer + 64 * 600.0
    assert decoupled(sw).goodput == pytest.approx(1.0 - deficit / chip_s, abs=5e-4)


def test_exchange_overhead_adds_to_every_outer_round_not_to_overlapped_ones() -> None:
    base = dataclasses.replace(NO_FAILURES, mix2_every=0, bandwidth_gbps=100.0)
    slow = dataclasses.replace(base, exchange_overhead_s=4.0)
    a, b = simulate(base), simulate(slow)
    for name in ("diloco", "noloco"):
        assert b[name].mean_round_s - a[name].mean_round_s == pytest.approx(4.0, rel=1e-6), name
    # Mix1 overlaps compute: 4 s more is still hidden behind 50 s of inner steps
    assert b["gossip"].mean_round_s == pytest.approx(a["gossip"].mean_round_s)


def test_testbed_terms_link_efficiency_round_overhead_and_overlap_cpu() -> None:
    """The three terms that describe real (CPU-capped, shaped-link) peers, each on its own."""
    base = dataclasses.replace(NO_FAILURES, methods=("diloco", "noloco", "gossip"), mix2_every=0)
    ideal = simulate(base)
    allreduce = ring_allreduce_s(8, 4e8, 1e9 / 8, 0.02)
    slow = simulate(dataclasses.replace(base, link_efficiency=0.5))
    assert slow["diloco"].mean_round_s == pytest.approx(50.0 + ring_allreduce_s(8, 4e8, 0.5e9 / 8, 0.02))
    assert slow["diloco"].mean_round_s - ideal["diloco"].mean_round_s > 0.9 * allreduce
    extra = simulate(dataclasses.replace(base, round_overhead_s=2.0))
    for name in ("diloco", "noloco", "gossip"):
        assert extra[name].mean_round_s == pytest.approx(ideal[name].mean_round_s + 2.0, rel=1e-3)
    # Mix1 of a pair sends 400 MB per round; at 0.01 s/MB the steps take 4 s longer: counted as
    # time in steps (utilisation stays ~1) but not as useful work (goodput drops by 4/54)
    cpu = simulate(dataclasses.replace(base, overlap_cpu_s_per_mb=0.01))["gossip"]
    assert cpu.mean_round_s == pytest.approx(ideal["gossip"].mean_round_s + 4.0, rel=1e-3)
    assert cpu.utilisation == pytest.approx(ideal["gossip"].utilisation, abs=0.01)
    assert cpu.goodput == pytest.approx(ideal["gossip"].goodput * 50 / 54, rel=0.01)


def test_link_efficiency_out_of_range_is_refused() -> None:
    from p2p_trainer.lab.sim.scenario import ScenarioError

    with pytest.raises(ScenarioError, match="link_efficiency"):
        dataclasses.replace(NO_FAILURES, link_efficiency=1.5).validate()


def test_round_jitter_is_seeded_and_makes_barriers_wait_for_the_slowest_draw() -> None:
    base = dataclasses.replace(NO_FAILURES, methods=("diloco",), latency_ms=0.0)
    ideal = simulate(base)["diloco"].mean_round_s
    jittered = dataclasses.replace(base, round_jitter_sigma=0.1)
    first, again = simulate(jittered)["diloco"], simulate(jittered)["diloco"]
    assert first.mean_round_s == again.mean_round_s  # same seed, same draws
    # a blocking round waits for the slowest of 8 peers' draws: ~ exp(1.42 sigma) of the compute
    assert 50.0 * 1.10 < first.mean_round_s - (ideal - 50.0) < 50.0 * 1.20
