"""The simulator checked on the WAN testbed: the simulator's predicted utilisation and round time per method.

The simulator's alpha-beta model assumes the ideal: exchanges at the link rate, and inner steps
untouched by a background exchange. CPU-capped testbed peers are not ideal, so the prediction uses
three measured terms (Scenario fields, docs/simulator.md). None is fitted to a compared run:

- `step_s` and `round_overhead_s`: the 4-peer *independent* run (no exchanges): compute per step,
  and round wall time beyond its steps (outer step, snapshot, metrics).
- `link_efficiency`: a 2-peer DiLoCo run (blocking pair average every H): link bound / measured
  exchange time, median over its exchanges.
- `overlap_cpu_s_per_mb`: a 2-peer Mix1-only run against a 2-peer independent run: the extra step
  time per round per MB the peer sent in the background.
- `round_jitter_sigma`: the 2-peer independent run: spread (std of the log) of a peer's compute
  time from round to round. Peers without a barrier drift apart by it and then wait for partners.

The compared runs are the 4-peer methods; their utilisation and round time are predictions.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import statistics
from pathlib import Path
from typing import Any

from bench.wan.analysis import pair_bytes, run_stats
from bench.wan.runs import CANONICAL, SwarmSpec, Variant, run_swarm, variant_config
from p2p_trainer.config import RunConfig
from p2p_trainer.round_log import read_log

logger = logging.getLogger(__name__)
CALIBRATION = (
    Variant("calib-diloco", "diloco", CANONICAL),
    Variant("calib-mix1", "factored", {"mix2_rounds": 0}),
    Variant("calib-independent", "independent"),
)
TOLERANCE = 0.15


def calibrate(cfg0: RunConfig, spec: SwarmSpec, h: int, out: Path, num_params: int) -> dict[str, float]:
    """Run (or re-read) the three 2-peer calibration runs; return the measured terms."""
    pair = dataclasses.replace(spec, peers=2)
    stats = {}
    for v in CALIBRATION:
        cfg = dataclasses.replace(variant_config(cfg0, v, h, spec.timeout_s), rounds=100_000)
        run_dir = out / "calibration" / v.name
        if (run_dir / "run.json").exists():
            run = json.loads((run_dir / "run.json").read_text())
        else:
            logger.info("calibration run %s (%s)", v.name, run_dir)
            run = run_swarm(v, cfg, pair, run_dir)
        stats[v.name] = run_stats(run_dir, run, 2, spec.rate_mbit, spec.budget_s, num_params)
    ratio = stats["calib-diloco"]["exchange_time_vs_bound"].get("outer", {}).get("p50")
    extra_step_s = stats["calib-mix1"]["step_compute_s"] - stats["calib-independent"]["step_compute_s"]
    mix1_mb = pair_bytes(2, num_params) / 1e6
    return {
        "round_jitter_sigma": round_jitter(out / "calibration" / "calib-independent", 2),
        "link_efficiency": min(1.0, 1.0 / ratio) if ratio else 1.0,
        "overlap_cpu_s_per_mb": max(0.0, extra_step_s * h / mix1_mb),
        "calib_diloco_exchange_vs_bound_p50": ratio or float("nan"),
        "calib_mix1_step_s": stats["calib-mix1"]["step_compute_s"],
        "calib_independent_step_s": stats["calib-independent"]["step_compute_s"],
    }


def round_jitter(run_dir: Path, peers: int) -> float:
    """Std of log(compute time per round) around each peer's own mean (first and last round out:
    start-up, and a round cut by the budget)."""
    dev: list[float] = []
    for i in range(peers):
        rounds = read_log(run_dir / f"peer{i}" / "metrics.jsonl").rounds
        logs = [math.log(r.compute_s) for r in rounds[1:-1] if r.compute_s > 0]
        if len(logs) > 1:
            mean = statistics.fmean(logs)
            dev += [x - mean for x in logs]
    return statistics.pstdev(dev) if len(dev) > 1 else 0.0


def sim_comparison(
    summary: dict[str, Any], spec: SwarmSpec, h: int, num_params: int, ks: list[int], terms: dict[str, float]
) -> dict[str, Any]:
    """Predicted vs measured utilisation and round time for every compared method."""
    from p2p_trainer.lab.sim.engine import predict
    from p2p_trainer.lab.sim.scenario import Scenario

    indep = summary.get("independent") or {}
    step_s = indep.get("step_compute_s")
    if not step_s:
        return {}
    overhead_s = max(0.0, indep["round_time_s"] - h * step_s)
    mapping = {
        "data-parallel": ("sync_dp", 0),
        "diloco": ("diloco", 0),
        "noloco": ("noloco", 0),
        "factored-mix1": ("gossip", 0),
    }
    mapping.update({f"factored-mix2-k{k}": ("gossip", k) for k in ks})
    out: dict[str, Any] = {
        "_terms": {**terms, "step_s": step_s, "round_overhead_s": overhead_s},
    }
    for v, (sim_name, k) in mapping.items():
        if v not in summary:
            continue
        # data-parallel's rounds are single steps: its per-step overhead is one metrics record,
        # not the snapshot of an outer round (it snapshots every H steps)
        sc = Scenario(
            num_chips=spec.peers, num_peers=spec.peers, chips_per_slice=1, mtbi_chip_s=1e12,
            step_s=step_s, num_inner_steps=1 if v == "data-parallel" else h, model_params=float(num_params),
            bandwidth_gbps=spec.rate_mbit / 1000, latency_ms=0.05, exchange_overhead_s=0.0,
            link_efficiency=terms["link_efficiency"], overlap_cpu_s_per_mb=terms["overlap_cpu_s_per_mb"],
            round_overhead_s=overhead_s / h if v == "data-parallel" else overhead_s,
            round_jitter_sigma=terms.get("round_jitter_sigma", 0.0),
            group_size=2, mix2_every=k, mix2_group_size=0, horizon_s=spec.budget_s, methods=(sim_name,),
        )  # fmt: skip
        pred = predict(sc)[sim_name]
        s = summary[v]
        util, rt = s["utilisation"], s["round_time_s"]
        pairs = ((util, pred["utilisation"]), (rt, pred["round_time_s"]))
        ok = all(m is not None and abs(m - p) <= TOLERANCE * p for m, p in pairs)
        out[v] = {
            "utilisation": util, "predicted_utilisation": pred["utilisation"],
            "round_time_s": rt, "predicted_round_time_s": pred["round_time_s"], "within_15pct": ok,
        }  # fmt: skip
    return out
