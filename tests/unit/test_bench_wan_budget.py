"""The head-to-head's pure analysis: budget-exact selection, rates, fraction of ideal, spreads, seeds."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from bench.wan.budget import (
    clock_offset,
    eval_times,
    fmt_spread,
    fraction_of_ideal,
    interleaved,
    pick_best,
    rate,
    snapshot_at,
    split_seeds,
    spread,
    swarm_t0,
    training_start_unix,
)
from bench.wan.plan import ENDLESS_STEPS, anneal_steps, scheduled
from bench.wan.summary import headline, per_seed_values, summarise
from p2p_trainer.config import OuterConfig, RunConfig, load_config
from p2p_trainer.round_log import RoundRecord
from p2p_trainer.train.trainer import lr_factor


@dataclass(frozen=True)
class Snap:
    time_s: float
    name: str


def _round(t: float, unix: float, step: int, tokens: int, wall: float = 1.0) -> RoundRecord:
    return RoundRecord("p", t, unix, 0, step, tokens, 1.0, None, wall, 0.0, wall)


def test_the_snapshot_at_a_time_is_the_last_one_taken_by_then_on_the_shared_clock() -> None:
    snaps = [Snap(10.0, "a"), Snap(20.0, "b"), Snap(30.0, "c")]
    offset = 1000.0  # the peer's clock started at Unix 1000
    assert snapshot_at(snaps, offset, 1020.0) == snaps[1]  # taken exactly at the time: included
    assert snapshot_at(snaps, offset, 1029.9) == snaps[1]
    assert snapshot_at(snaps, offset, 1100.0) == snaps[2]
    assert snapshot_at(snaps, offset, 1009.0) is None
    # another peer whose clock started 5 s later sees the same instant as 5 s earlier on its own
    assert snapshot_at(snaps, 1005.0, 1020.0) == snaps[0]


def test_the_shared_start_is_when_the_last_peer_began_training() -> None:
    rounds = [_round(12.0, 1012.0, 10, 100, wall=2.0), _round(14.0, 1014.0, 20, 200)]
    assert clock_offset(rounds) == 1000.0
    assert training_start_unix(rounds) == 1010.0
    assert swarm_t0([1010.0, 1013.0, 1011.0]) == 1013.0
    assert swarm_t0([1010.0, None]) is None and swarm_t0([]) is None
    assert clock_offset([]) is None and training_start_unix([]) is None


def test_evaluation_times_end_exactly_at_the_budget() -> None:
    assert eval_times(220.0, 4) == [55.0, 110.0, 165.0, 220.0]
    assert eval_times(30.0, 1) == [30.0]


def test_rate_counts_whole_rounds_inside_the_window() -> None:
    rounds = [
        _round(t, 1000.0 + t, step=10 * k, tokens=100 * k) for k, t in enumerate([5.0, 10.0, 20.0, 30.0])
    ]
    # rounds ending at 10, 20 and 30 s lie in [8, 30]: 200 tokens over 20 s
    assert rate(rounds, 1000.0, 1008.0, 1030.0, "tokens") == pytest.approx(10.0)
    assert rate(rounds, 1000.0, 1008.0, 1030.0, "step") == pytest.approx(1.0)
    assert rate(rounds, 1000.0, 1025.0, 1030.0, "tokens") is None  # one round: no rate


def test_fraction_of_ideal() -> None:
    assert fraction_of_ideal(3.0, 2.5, 2.0) == pytest.approx(0.5)
    assert fraction_of_ideal(3.0, 2.0, 2.0) == pytest.approx(1.0)
    assert fraction_of_ideal(3.0, 3.2, 2.0) == pytest.approx(-0.2)  # worse than alone: negative
    assert fraction_of_ideal(3.0, 2.5, 3.0) is None  # no gap to close
    assert fraction_of_ideal(None, 2.5, 2.0) is None


def test_median_with_its_spread() -> None:
    s = spread([2.5, None, 2.4, float("nan"), 2.9])
    assert s is not None and (s.median, s.lo, s.hi, s.n) == (2.5, 2.4, 2.9, 3)
    assert fmt_spread([2.5, 2.4, 2.9]) == "2.500 (2.400–2.900)"
    assert fmt_spread([2.5]) == "2.500"
    assert fmt_spread([None]) == "-" and spread([]) is None


def test_seed_split_refuses_overlap_and_too_few_report_seeds() -> None:
    assert split_seeds([100, 101], [0, 1, 2]) == ([100, 101], [0, 1, 2])
    with pytest.raises(ValueError, match="both tuning and report"):
        split_seeds([0, 100], [0, 1, 2])
    with pytest.raises(ValueError, match="at least 3"):
        split_seeds([100], [0, 1])
    assert split_seeds([], [0], min_report=1) == ([], [0])


def test_configs_are_picked_by_median_loss_and_arms_interleave() -> None:
    assert pick_best({"a": [2.5, 2.6, 2.4], "b": [2.45, 2.7, 2.46], "c": [None]}) == "b"
    assert pick_best({"a": [None]}) is None
    assert interleaved(["x", "y", "z"], 0) == ["x", "y", "z"]
    assert interleaved(["x", "y", "z"], 1) == ["z", "y", "x"]


def test_schedules_have_the_same_shape_for_every_arm() -> None:
    cfg = RunConfig(rounds=40, outer=OuterConfig.for_method("diloco", num_inner_steps=10))
    const = scheduled(cfg, "constant")
    assert const.inner.min_lr_ratio == 1.0 and const.total_inner_steps >= ENDLESS_STEPS - 10
    w = const.inner.warmup_steps
    assert lr_factor(w + 5000, w, const.total_inner_steps, const.inner.min_lr_ratio) == 1.0
    annealed = scheduled(cfg, "anneal", total_steps=1234)
    assert annealed.total_inner_steps == 1240 and annealed.inner.min_lr_ratio == cfg.inner.min_lr_ratio
    assert anneal_steps(2.0, 220.0, 20) == 440 and anneal_steps(0.01, 220.0, 20) == 21
    assert anneal_steps(None, 220.0, 20) is None
    with pytest.raises(ValueError):
        scheduled(cfg, "anneal")


def test_each_arm_is_judged_against_its_own_seeds_bare_loop_independent_arm_and_ideal() -> None:
    def run(variant: str, seed: int, loss: float, tps: float) -> dict[str, object]:
        ev: dict[str, object] = {
            "mean_peer_loss": loss,
            "consensus_loss": loss - 0.1,
            "best_peer_loss": loss - 0.05,
        }
        ev |= {"tokens_per_s_per_peer": tps, "curve": [{"time_s": 10.0, "tokens": 100.0, "val_loss": loss}]}
        run = {"budget_s": 10.0, "load_before": [0.5, 0, 0], "load_after": [0.7, 0, 0]}
        return {"variant": variant, "seed": seed, "eval": ev, "stats": {}, "run": run}

    runs = [
        run("bare", 0, 3.0, 1000.0),
        run("independent", 0, 3.0, 900.0),
        run("diloco", 0, 2.8, 450.0),
        run("independent", 1, 9.0, 1.0),  # another seed: must not be used for seed 0
    ]
    rows = per_seed_values(runs, {0: {"loss": 2.6}}, 0)
    d = rows["diloco"]
    assert d["throughput_vs_bare"] == pytest.approx(0.45)
    assert d["throughput_vs_independent"] == pytest.approx(0.5)
    assert d["fraction_of_ideal_mean_peer"] == pytest.approx(0.5)  # (3.0 - 2.8) / (3.0 - 2.6)
    assert d["fraction_of_ideal_consensus"] == pytest.approx(0.75)
    assert d["fraction_of_ideal_best_peer"] == pytest.approx(0.625)
    assert d["load_before"] == [0.5, 0, 0]
    assert rows["independent"]["fraction_of_ideal_mean_peer"] == pytest.approx(0.0)


def test_the_head_to_head_table_prints_every_median_with_its_range() -> None:
    def run(variant: str, seed: int, loss: float) -> dict[str, object]:
        curve = [{"time_s": t, "tokens": 100.0 * t, "val_loss": loss + (20 - t) / 20} for t in (10.0, 20.0)]
        ev: dict[str, object] = {"curve": curve, "mean_peer_loss": loss, "consensus_loss": loss}
        ev |= {"best_peer_loss": loss, "tokens_per_s_per_peer": 100.0, "steps": [40, 42]}
        stats: dict[str, object] = {"tx_bytes_per_peer": 2e6, "rx_bytes_per_peer": 3e6, "rounds_min": 4}
        stats |= {"exchange_time_vs_bound": {}, "transfer_time_vs_bound": {}}
        r = {"budget_s": 20.0, "load_before": [0.5, 0, 0], "load_after": [0.7, 0, 0]}
        return {"variant": variant, "seed": seed, "eval": ev, "stats": stats, "run": r}

    runs = [
        run(v, s, base + 0.01 * s) for s in (0, 1, 2) for v, base in (("independent", 3.0), ("diloco", 2.8))
    ]
    ideal = {s: {"loss": 2.6, "steps": 41} for s in (0, 1, 2)}
    summary, _ = summarise(runs, ["independent", "diloco"], [0, 1, 2], ideal)
    assert summary["diloco"]["mean_peer_loss"] == pytest.approx(2.81)
    assert summary["diloco"]["mean_peer_loss_range"] == [pytest.approx(2.8), pytest.approx(2.82), 3]
    meta = {"schedule": "constant", "budget_s": 20.0, "report_seeds": [0, 1, 2], "tuning_seeds": [100]}
    meta |= {"picked": {}, "peers": 2, "rate_mbit": 10.0, "cpu_cores": 0.45, "inner_steps": 10}
    table = headline({"meta": meta, "summary": summary, "ideal": ideal})
    row = next(line for line in table.splitlines() if line.startswith("| diloco |"))
    assert "2.810 (2.800–2.820)" in row and "2.0 (2.0–2.0) / 3.0 (3.0–3.0)" in row
    assert "0.5→0.7, 0.5→0.7, 0.5→0.7" in row


def test_an_arm_can_name_its_data_plane_and_keeps_the_other_network_settings() -> None:
    from bench.wan.plan import arms
    from bench.wan.runs import variant_config

    base = load_config()
    by_name = {v.name: v for v in arms(10, [4], "float16")}
    direct = variant_config(base, by_name["cand-stream-int8-direct"], 10, timeout_s=30.0)
    over_p2pd = variant_config(base, by_name["cand-stream-int8"], 10, timeout_s=30.0)
    assert direct.network.data_plane == "direct"
    assert over_p2pd.network.data_plane == "p2pd"
    # only the plane differs: same method, fragments, codec and every other network field
    assert direct.outer == over_p2pd.outer and direct.exchange == over_p2pd.exchange
    assert direct.network.heartbeat_ttl_s == base.network.heartbeat_ttl_s
    assert direct.outer.fragments == 2 and direct.outer.num_inner_steps == 5
