"""The WAN bench's pure pieces: curve look-ups, consensus distance, comparisons and sanity."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.wan.analysis import (
    add_exchange_bytes,
    consensus_distance,
    group_start_skew,
    group_transfer_ratios,
    landing_steps,
    loss_at_time,
    loss_at_tokens,
    pair_bytes,
    time_to_loss,
)
from bench.wan.runs import rounds_logged
from bench.wan.targets import sanity, seed_comparison
from p2p_trainer.round_log import ExchangeRecord, FinalRecord, RoundRecord, StartRecord


def _curve(points: list[tuple[float, float, float]]) -> list[dict[str, float]]:
    return [{"time_s": t, "tokens": n, "val_loss": v} for t, n, v in points]


def test_curve_lookups() -> None:
    c = _curve([(10, 100, 4.0), (20, 200, 3.0), (30, 300, 2.5)])
    assert loss_at_time(c, 25) == 3.0 and loss_at_time(c, 5) is None
    assert loss_at_tokens(c, 150) == pytest.approx(3.5)
    assert loss_at_tokens(c, 300) == 2.5 and loss_at_tokens(c, 301) is None
    assert time_to_loss(c, 3.0) == 20 and time_to_loss(c, 1.0) is None


def test_butterfly_bytes_per_member() -> None:
    assert pair_bytes(2, 1000) == 4000  # half out in each phase: the whole model once
    assert pair_bytes(4, 1000) == 6000  # 2 (g-1)/g of it
    assert pair_bytes(1, 1000) == 0


def test_consensus_distance_is_relative_spread_around_the_mean() -> None:
    same = [[torch.ones(3), torch.ones(2)]] * 3
    assert consensus_distance(same) == pytest.approx(0.0)
    # mean (1, 2); each anchor is 1 away from it; ‖mean‖ = √5
    pair = [[torch.tensor([0.0, 2.0])], [torch.tensor([2.0, 2.0])]]
    assert consensus_distance(pair) == pytest.approx(1 / 5**0.5)
    assert consensus_distance([same[0]]) is None


def test_seed_comparison_and_sanity() -> None:
    curves = {
        "data-parallel": _curve([(50, 100, 3.0), (100, 200, 2.0)]),
        "diloco": _curve([(50, 200, 3.0), (100, 400, 2.4)]),
        "independent": _curve([(50, 400, 3.0), (90, 800, 2.6)]),
    }
    cmp = seed_comparison(curves, budget_s=100)
    assert cmp["equal_tokens"] == 200 and cmp["equal_tokens_2"] == 400
    assert cmp["methods"]["independent"]["loss_at_equal_time"] == 2.6  # finished early: final loss kept
    assert cmp["methods"]["diloco"]["loss_at_equal_tokens"] == 3.0
    assert cmp["diloco_final_loss"] == 2.4 and cmp["methods"]["independent"]["time_to_diloco_final_s"] is None
    summary: dict[str, dict[str, float | None]] = {v: {"bytes_vs_theory": 1.02} for v in curves}
    summary["independent"]["bytes_vs_theory"] = None
    s = sanity(summary, [cmp])
    assert s["data_parallel_best_per_token"] and s["independent_worst_per_token"] and s["bytes_within_5pct"]


def test_a_diloco_run_extended_past_the_budget_is_compared_at_the_budget() -> None:
    # DiLoCo went on to 150 s (to reach --min-rounds); its "final" for the targets is at 100 s
    curves = {
        "diloco": _curve([(50, 200, 3.0), (100, 400, 2.6), (150, 600, 2.3)]),
        "factored-mix1": _curve([(40, 300, 2.9), (70, 600, 2.5), (100, 900, 2.2)]),
    }
    cmp = seed_comparison(curves, budget_s=100)
    assert cmp["diloco_final_loss"] == 2.6 and cmp["diloco_time_to_final_s"] == 100
    m = cmp["methods"]["factored-mix1"]
    assert m["time_to_diloco_final_s"] == 70
    assert m["loss_at_diloco_tokens"] == pytest.approx(2.9 - 0.4 * 100 / 300)  # at DiLoCo's 400 tokens
    assert (
        cmp["methods"]["diloco"]["final_loss"] == 2.3
        and cmp["methods"]["diloco"]["loss_at_equal_time"] == 2.6
    )


def test_rounds_logged_counts_round_records_only(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    assert rounds_logged(metrics) == 0  # not written yet
    lines = [StartRecord("p", 0.0), _round(0, 1.0), _round(1, 2.0), FinalRecord("p", 2, 0, None, 2.0, False)]
    metrics.write_text("".join(r.to_json() + "\n" for r in lines))
    assert rounds_logged(metrics) == 2


def _round(rnd: int, t: float, exchanges: tuple[ExchangeRecord, ...] = ()) -> RoundRecord:
    return RoundRecord("p", t, t, rnd, rnd, 0, 1.0, None, 1.0, 0.0, 1.0, exchanges=exchanges)


def test_group_transfer_is_timed_from_the_last_members_start() -> None:
    def rnd(t: float, *exchanges: tuple[str, str, int, float, float, bool]) -> RoundRecord:
        ex = tuple(
            ExchangeRecord(tag, ok, g, elapsed_s=el, blocked_s=0.0, started_unix=start, group=key)
            for tag, key, g, start, el, ok in exchanges
        )
        return _round(0, t, ex)

    bound = pair_bytes(2, 1000) * 8 / 1e6  # 1 Mbit/s: 0.032 s
    peers = [
        # exchange a: peer 0 started 1 s before peer 1; the pair was in at 101, done at 101.064
        [rnd(10, ("mix1", "a", 2, 100.0, 1.064, True)), rnd(20, ("mix1", "b", 2, 200.0, 0.5, True))],
        [rnd(10, ("mix1", "a", 2, 101.0, 0.060, True)), rnd(20, ("mix1", "b", 1, 200.0, 0.5, True))],
        [rnd(10, ("mix1", "c", 2, 300.0, 0.1, True)), rnd(99, ("mix1", "d", 2, 400.0, 0.1, True))],
        [rnd(10, ("mix1", "c", 2, 300.0, 0.1, False))],
    ]
    # b left peer 1 out (group of 1 in its record), c failed on one side, d is past the window
    ratios = group_transfer_ratios(peers, window_s=50, rate_mbit=1.0, num_params=1000)
    assert ratios == {"mix1": [pytest.approx(0.064 / bound)]}
    # the same complete exchanges give the start skew: a's members started 1 s apart, c failed
    assert group_start_skew(peers, window_s=50) == {"mix1": [pytest.approx(1.0)]}
    # a streamed fragment's exchange is held to its own values' bound, named in its key
    streamed = [[rnd(10, ("fragment", "run/fragment/0/1/x", 2, 100.0, 0.032, True))] for _ in range(2)]
    got = group_transfer_ratios(streamed, 50, 1.0, num_params=1000, fragments=[750, 250])
    assert got == {"fragment": [pytest.approx(4.0)]}


def test_landing_steps_count_rounds_after_the_first_within_the_window() -> None:
    def rnd(r: int, t: float, landed: int | None) -> RoundRecord:
        return RoundRecord("p", t, t, r, r, 0, 1.0, None, 1.0, 0.0, 1.0, landed_at_step=landed)

    # round 0 has nothing to land; the last round is past the window; one round landed at its end
    peers = [[rnd(0, 1, None), rnd(1, 2, 5), rnd(2, 3, 7)], [rnd(0, 1, None), rnd(1, 2, None), rnd(2, 99, 9)]]
    assert landing_steps(peers, window_s=50) == {"mean": 6.0, "p90": 7.0, "share_of_rounds": 2 / 3}
    assert landing_steps([[rnd(0, 1, None)]], window_s=50) == {
        "mean": None,
        "p90": None,
        "share_of_rounds": None,
    }


def test_exchange_bytes_leave_out_the_control_plane_the_independent_run_measured() -> None:
    def run(variant: str, seed: int, payload: float, wall: float, theory: float) -> dict[str, object]:
        stats = {"tx_payload_bytes_per_peer": payload, "wall_s": wall, "theory_bytes_per_peer": theory}
        return {"variant": variant, "seed": seed, "stats": stats}

    runs = [
        run("independent", 0, 1000.0, 50.0, 0.0),  # 20 bytes/s of DHT, heartbeats, ...
        run("diloco", 0, 102_000.0, 100.0, 100_000.0),  # 2000 of them control plane
        run("diloco", 1, 102_000.0, 100.0, 100_000.0),  # no independent run of seed 1
    ]
    add_exchange_bytes(runs)
    diloco0, diloco1 = runs[1]["stats"], runs[2]["stats"]
    assert isinstance(diloco0, dict) and isinstance(diloco1, dict)
    assert diloco0["control_bytes_per_peer"] == pytest.approx(2000.0)
    assert diloco0["exchange_bytes_vs_theory"] == pytest.approx(1.0)
    assert diloco1["exchange_bytes_vs_theory"] is None
    summary = {"diloco": {"bytes_vs_theory": 1.02, "exchange_bytes_vs_theory": 1.06}}
    assert not sanity(summary, [])["bytes_within_5pct"]  # the exchange ratio decides when known
