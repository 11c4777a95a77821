"""`python -m bench.wan --scaling`: bytes per peer per round and blocked time at 2, 4 and 8 peers,
all-peer rounds (DiLoCo) vs random pairs (NoLoCo), with independent peers for the control plane."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import Any

from bench.wan.analysis import Evaluator, add_exchange_bytes, run_stats
from bench.wan.runs import SwarmSpec, Variant, run_swarm, variant_config
from p2p_trainer.config import RunConfig

logger = logging.getLogger(__name__)


def run_scaling(args: argparse.Namespace, cfg0: RunConfig) -> dict[str, Any]:
    """Bytes per peer per round and blocked time, all-peer rounds (DiLoCo) vs random pairs (NoLoCo)."""
    h = args.inner_steps or 10
    budget = args.budget_s or 60.0  # after the shared start (start-up of 8 peers at 0.2 core: ~30 s)
    ev = Evaluator(cfg0)
    rows: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    for n in (2, 4, 8):
        # the same CPU cap at every size, so that blocked time compares like with like
        spec = SwarmSpec(n, args.rate_mbit, min(args.cpu_cores, 0.2), budget)
        # independent peers move only the control plane (DHT, heartbeats): measured at each size,
        # so the exchange bytes per round can be told apart from it (add_exchange_bytes)
        for v in (
            Variant("diloco", "diloco"),
            Variant("noloco", "noloco"),
            Variant("independent", "independent"),
        ):
            cfg = dataclasses.replace(variant_config(cfg0, v, h, spec.timeout_s), rounds=100_000 // h)
            run_dir = args.out / "scaling" / f"{v.name}-n{n}"
            run = run_swarm(v, cfg, spec, run_dir)
            st = run_stats(run_dir, run, n, args.rate_mbit, budget, ev.num_params)
            runs.append({"variant": v.name, "seed": n, "stats": st})
            rows.append(
                {
                    "peers": n, "method": v.name, "cpu_cores": spec.cpu_cores, "rounds_min": st["rounds_min"],
                    "rounds_mean": st["rounds_all"],
                    "tx_bytes_per_peer_per_round": st["tx_bytes_per_peer_per_round"],
                    "theory_bytes_per_round": st["theory_bytes_per_peer"] / max(1, st["rounds_all"]),
                    "blocked_p50_s": st["blocked_p50_s"], "blocked_p95_s": st["blocked_p95_s"],
                    "blocked_max_s": st["blocked_max_s"], "utilisation": st["utilisation"],
                }
            )  # fmt: skip
            logger.info("scaling %s", rows[-1])
    add_exchange_bytes(runs)  # "seed" is the peer count here: each size's own control plane
    for row, r in zip(rows, runs, strict=True):
        st = r["stats"]
        control = st.get("control_bytes_per_peer")
        row["control_bytes_per_peer_per_s"] = control / st["wall_s"] if control is not None else None
        row["exchange_bytes_per_peer_per_round"] = (
            (st["tx_payload_bytes_per_peer"] - control) / row["rounds_mean"]
            if control is not None and row["rounds_mean"] and row["method"] != "independent"
            else None
        )
    rows = [r for r in rows if r["method"] != "independent"] + [
        r for r in rows if r["method"] == "independent"
    ]

    def spread_of(key: str) -> float | None:
        vals = [r[key] for r in rows if r["method"] == "noloco" and r[key]]
        return (max(vals) / min(vals) - 1) if len(vals) > 1 else None

    # the target is about what the mixing moves; the wire total (control plane included) is reported too
    spread, wire_spread = (
        spread_of("exchange_bytes_per_peer_per_round"),
        spread_of("tx_bytes_per_peer_per_round"),
    )
    return {
        "rows": rows,
        "random_groups_bytes_spread": spread,
        "random_groups_wire_bytes_spread": wire_spread,
        "met": spread is not None and spread <= 0.10,
        "budget_s": budget,
        "inner_steps": h,
    }


def scaling_markdown(sc: dict[str, Any]) -> str:
    lines = [
        "| peers | method | CPU cap | rounds | MB sent/peer/round: wire | exchange | theory "
        "| control plane kB/s/peer | blocked p50 / p95 / max (s) | utilisation |"
    ]
    lines.append("|---|---|---|---|---|---|---|---|---|---|")

    def mb(x: float | None) -> str:
        return f"{x / 1e6:.3f}" if x else "-"

    for r in sc["rows"]:
        c = r.get("control_bytes_per_peer_per_s")
        lines.append(
            f"| {r['peers']} | {r['method']} | {r['cpu_cores']:.2f} | {r['rounds_min']} | "
            f"{mb(r['tx_bytes_per_peer_per_round'])} | {mb(r.get('exchange_bytes_per_peer_per_round'))} | "
            f"{mb(r['theory_bytes_per_round'])} | {f'{c / 1e3:.1f}' if c is not None else '-'} | "
            f"{r['blocked_p50_s'] or 0:.2f} / {r['blocked_p95_s'] or 0:.2f} / {r['blocked_max_s'] or 0:.2f} | "
            f"{r['utilisation'] or 0:.3f} |"
        )
    spread, wire = sc["random_groups_bytes_spread"], sc.get("random_groups_wire_bytes_spread")
    if spread is not None:
        lines.append(
            f"\nRandom groups: exchange bytes per peer per round vary by {spread * 100:.1f}% from 2 to 8 peers "
            f"(target <= 10%); on the wire, control plane included, by {(wire or 0) * 100:.1f}%."
        )
    return "\n".join(lines) + "\n"
