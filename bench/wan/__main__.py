"""Head-to-head on the emulated WAN: our methods vs DiLoCo, NoLoCo, data-parallel,
independent training and hivemind.Optimizer, same model, data, seed and inner optimizer.

    python -m bench.wan --out runs/wan            # the full comparison
    python -m bench.wan --quick --out runs/wanq   # a few minutes
    python -m bench.wan --scaling --out runs/wans # 2/4/8 peers

Each (method, seed) gets a fresh testbed (bootstrap + N peers in namespaces, capped links and CPUs)
and the same wall-time budget; methods are interleaved and the order reverses every seed, so slow
drift of a shared machine cancels. Peers save φ snapshots while training; they are evaluated after
each run. Writes results.json, table.md and PNG plots to --out, and prints the targets as ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.wan.analysis import Evaluator, add_exchange_bytes, loss_curve, median, run_stats
from bench.wan.runs import CANONICAL, SwarmSpec, Variant, run_swarm, variant_config
from bench.wan.sim_check import calibrate, sim_comparison
from bench.wan.tables import markdown, plots
from bench.wan.targets import sanity, seed_comparison, targets
from p2p_trainer.config import load_config
from p2p_trainer.lab.testbed import support_problem

logger = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
DEFAULT_TOTAL_STEPS = 400
"""Inner steps each peer is scheduled for (warm-up, then cosine to 0.1×): docs/algorithms.md's reference
setting (4 ranks × 400 steps). A peer stops at this many steps or at the wall-time budget, whichever
comes first, so a method that keeps its CPU busy gets further down the same schedule. (With an
unending schedule, i.e. a constant learning rate, the DiLoCo family falls behind independent
training per token in the quick run; the reference comparisons are made with the cosine.)"""


def variants(h: int, mix2_every: list[int], align_rounds: bool = True) -> list[Variant]:
    align = {"align_rounds": align_rounds}  # ours only: the baselines are blocking, which aligns them
    out = [
        Variant("data-parallel", "data-parallel", {"num_inner_steps": 1, **CANONICAL}, snapshot_every=h),
        Variant("diloco", "diloco", CANONICAL),
        Variant("noloco", "noloco", CANONICAL),
        Variant("factored-mix1", "factored", {"mix2_rounds": 0, **align}),
    ]
    out += [
        Variant(
            f"factored-mix2-k{k}",
            "factored",
            {"mix2_rounds": 1, "mix2_every": k, "mix2_group_size": 0, **align},
        )
        for k in mix2_every
    ]
    # float16 on the wire (exchange.wire_dtype): half the bytes; asked for by name with --methods
    half = {"wire_dtype": "float16"}
    extra = [Variant("factored-mix1-fp16", "factored", {"mix2_rounds": 0, **align, **half})]
    extra += [
        Variant(
            f"factored-mix2-k{k}-fp16",
            "factored",
            {"mix2_rounds": 1, "mix2_every": k, "mix2_group_size": 0, **align, **half},
        )
        for k in mix2_every
    ]
    return [*out, Variant("independent", "independent"), Variant("hivemind", "hivemind"), *extra]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs") / f"wan-{time.strftime('%Y%m%d-%H%M%S')}")
    p.add_argument("--quick", action="store_true", help="Small model, short runs, one seed, 5 methods.")
    p.add_argument(
        "--no-align-rounds",
        action="store_true",
        help="Factored variants without round alignment (outer.align_rounds), to measure what it does.",
    )
    p.add_argument("--scaling", action="store_true", help="2/4/8 peers, all-peer rounds vs random pairs.")
    p.add_argument("--seeds", type=int, nargs="+", default=None)
    p.add_argument("--budget-s", type=float, default=None, help="Wall time per run (default 270, quick 40).")
    p.add_argument("--inner-steps", type=int, default=None, help="H (default 10).")
    p.add_argument(
        "--total-steps", type=int, default=None, help="Scheduled inner steps per peer (400; quick 600)."
    )
    p.add_argument(
        "--min-rounds",
        type=int,
        default=None,
        help="Extend a run past the budget until every peer has this many rounds (default 30; quick 0).",
    )
    p.add_argument("--mix2-every", type=int, nargs="+", default=[4], help="K values for factored Mix1+Mix2.")
    p.add_argument("--methods", nargs="+", default=None, help="Subset of variant names.")
    p.add_argument("--peers", type=int, default=4)
    p.add_argument("--rate-mbit", type=float, default=10.0)
    p.add_argument("--cpu-cores", type=float, default=0.45)
    p.add_argument("--max-points", type=int, default=None, help="Snapshots evaluated per run (20; quick 10).")
    p.add_argument("--analyse-only", action="store_true", help="Re-analyse the runs already in --out.")
    p.add_argument("--loaded", action="store_true", help="Label the results as measured on a loaded machine.")
    p.add_argument(
        "--no-calibration",
        action="store_true",
        help="Skip the 2-peer runs that measure the simulator's testbed terms (the simulator comparison).",
    )
    return p.parse_args(argv)


def base_config(quick: bool) -> Any:
    cfg = load_config()  # the packaged default run
    cfg = dataclasses.replace(cfg, inner=dataclasses.replace(cfg.inner, eval_every=0))
    if quick:  # a model small enough that data-parallel takes enough steps in seconds
        model = dataclasses.replace(cfg.model, d_model=48, n_layers=2, seq_len=64)
        cfg = dataclasses.replace(cfg, model=model, inner=dataclasses.replace(cfg.inner, warmup_steps=5))
    return cfg


# ------------------------------------------------------------------------------------------- runs
def run_all(args: argparse.Namespace, vs: list[Variant], spec: SwarmSpec, h: int) -> dict[str, Any]:
    cfg0 = base_config(args.quick)
    ev = Evaluator(cfg0)
    runs: list[dict[str, Any]] = []
    partial = args.out / "runs.partial.json"
    planned = {(v.name, seed) for v in vs for seed in args.seeds}
    earlier = json.loads(partial.read_text()) if partial.exists() else []
    # --analyse-only reuses the loss curves evaluated before; a new run into the same --out (e.g. a
    # method and seed that were interrupted) keeps the other runs' entries
    evaluated = {(r["variant"], r["seed"]): r["curve"] for r in earlier} if args.analyse_only else {}
    kept = [r for r in earlier if (r["variant"], r["seed"]) not in planned]
    for n, seed in enumerate(args.seeds):
        order = vs if n % 2 == 0 else vs[::-1]
        for v in order:
            cfg = variant_config(dataclasses.replace(cfg0, seed=seed), v, h, spec.timeout_s)
            cfg = dataclasses.replace(cfg, rounds=max(1, args.total_steps // cfg.outer.num_inner_steps))
            run_dir = args.out / "runs" / f"{v.name}-s{seed}"
            logger.info("run %s seed %d (%s)", v.name, seed, run_dir)
            if args.analyse_only:  # a finished run's files, analysed again; unfinished ones skipped
                if not (run_dir / "run.json").exists():
                    continue
                run = json.loads((run_dir / "run.json").read_text())
            else:
                run = run_swarm(v, cfg, spec, run_dir)
            # a run extended for --min-rounds is measured over all of it; comparisons stay at the budget
            window = max(spec.budget_s, run.get("stop_s", spec.budget_s))
            value_bytes = 2 if cfg.exchange.wire_dtype == "float16" else 4  # the theory and bounds follow it
            stats = run_stats(run_dir, run, spec.peers, spec.rate_mbit, window, ev.num_params, value_bytes)
            curve = evaluated.get((v.name, seed)) or loss_curve(
                run_dir, spec.peers, ev, args.max_points, window
            )
            runs.append({"variant": v.name, "seed": seed, "run": run, "stats": stats, "curve": curve})
            logger.info(
                "  %s: utilisation %s, rounds %d, final loss %s, tx %.1f MB/peer (x%.3f theory)",
                v.name, stats["utilisation"], stats["rounds_min"], curve[-1]["val_loss"] if curve else None,
                stats["tx_bytes_per_peer"] / 1e6, stats["bytes_vs_theory"] or float("nan"),
            )  # fmt: skip
            if not args.analyse_only:
                partial.write_text(json.dumps(kept + runs, indent=1))
    add_exchange_bytes(runs)
    return {"runs": runs, "num_params": ev.num_params}


def summarise(
    runs: list[dict[str, Any]], names: list[str], seeds: list[int], budget_s: float
) -> tuple[dict[str, Any], list[Any]]:
    per_seed = [
        seed_comparison({r["variant"]: r["curve"] for r in runs if r["seed"] == s}, budget_s) for s in seeds
    ]
    summary: dict[str, Any] = {}
    for v in names:
        rs = [r["stats"] for r in runs if r["variant"] == v]
        if not rs:
            continue
        keys = (
            "utilisation",
            "round_time_s",
            "step_compute_s",
            "blocked_p50_s",
            "blocked_p95_s",
            "blocked_max_s",
        )
        keys += ("tx_bytes_per_peer", "rx_bytes_per_peer", "theory_bytes_per_peer", "bytes_vs_theory")
        keys += ("control_bytes_per_peer", "exchange_bytes_vs_theory")
        keys += ("tx_bytes_per_peer_per_round", "consensus_distance")
        s: dict[str, Any] = {k: median([r[k] for r in rs]) for k in keys}
        s["rounds_min"] = min(r["rounds_min"] for r in rs)
        s["failed_exchanges"] = sum(r["failed_exchanges"] for r in rs)
        tags = {t for r in rs for t in r["exchange_time_vs_bound"]}
        s["exchange_time_vs_bound"] = {
            t: median([r["exchange_time_vs_bound"].get(t, {}).get("p50") for r in rs]) for t in sorted(tags)
        }
        ttags = {t for r in rs for t in r.get("transfer_time_vs_bound", {})}
        s["transfer_time_vs_bound"] = {
            t: median([r["transfer_time_vs_bound"].get(t, {}).get("p50") for r in rs]) for t in sorted(ttags)
        }
        for k in (
            "loss_at_equal_time",
            "loss_at_equal_tokens",
            "final_loss",
            "final_tokens",
            "time_to_diloco_final_s",
        ):
            s[k] = median([c.get("methods", {}).get(v, {}).get(k) for c in per_seed])
        summary[v] = s
    return summary, per_seed


# ------------------------------------------------------------------------------------------- scaling
def run_scaling(args: argparse.Namespace) -> dict[str, Any]:
    """Bytes per peer per round and blocked time, all-peer rounds (DiLoCo) vs random pairs (NoLoCo)."""
    cfg0 = base_config(args.quick)
    h = args.inner_steps or 10
    args.total_steps = args.total_steps or 100_000  # bytes and blocking only: run to the budget
    budget = args.budget_s or 90.0  # includes start-up: 8 peers at 0.2 core need ~30 s
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
            cfg = dataclasses.replace(
                variant_config(cfg0, v, h, spec.timeout_s), rounds=max(1, args.total_steps // h)
            )
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


# ------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    problem = support_problem()
    if problem is not None:
        print(f"cannot run the WAN testbed here: {problem}")
        return 2
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": " ".join(["python -m bench.wan", *(argv if argv is not None else sys.argv[1:])]),
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "load_avg_at_start": os.getloadavg(), "loaded": args.loaded, "align_rounds": not args.no_align_rounds,
        "peers": args.peers, "rate_mbit": args.rate_mbit, "cpu_cores": args.cpu_cores,
    }  # fmt: skip
    if args.scaling:
        sc = run_scaling(args)
        meta["load_avg_at_end"] = os.getloadavg()
        (args.out / "scaling.json").write_text(json.dumps({"meta": meta, **sc}, indent=2))
        (args.out / "scaling.md").write_text(scaling_markdown(sc))
        print(scaling_markdown(sc))
        return 0
    h = args.inner_steps or 10
    args.max_points = args.max_points or (10 if args.quick else 20)
    args.total_steps = args.total_steps or (600 if args.quick else DEFAULT_TOTAL_STEPS)
    args.seeds = args.seeds or ([0] if args.quick else [0, 1])
    budget = args.budget_s or (40.0 if args.quick else 270.0)
    quick_names = ("data-parallel", "diloco", "factored-mix2-k2", "independent", "hivemind")
    ks = [2] if args.quick else args.mix2_every
    wanted = args.methods or (quick_names if args.quick else None)
    vs = [
        v
        for v in variants(h, ks, not args.no_align_rounds)
        if (v.name in wanted if wanted is not None else not v.name.endswith("-fp16"))
    ]
    min_rounds = args.min_rounds if args.min_rounds is not None else (0 if args.quick else 30)
    spec = SwarmSpec(
        args.peers, args.rate_mbit, args.cpu_cores, budget, min_rounds=min_rounds,
        timeout_s=15.0 if args.quick else 30.0,
    )  # fmt: skip
    done = run_all(args, vs, spec, h)
    summary, per_seed = summarise(done["runs"], [v.name for v in vs], args.seeds, budget)
    meta.update(
        {
            "inner_steps": h,
            "budget_s": budget,
            "min_rounds": min_rounds,
            "seeds": args.seeds,
            "mix2_every": ks,
            "num_params": done["num_params"],
            "load_avg_at_end": os.getloadavg(),
        }
    )
    results: dict[str, Any] = {"meta": meta, "summary": summary, "per_seed": per_seed, "runs": done["runs"]}
    results["targets"] = targets(summary, per_seed)
    results["sanity"] = sanity(summary, per_seed)
    if not (args.quick or args.no_calibration) and "independent" in summary:
        terms = calibrate(base_config(args.quick), spec, h, args.out, done["num_params"])
        results["sim"] = sim_comparison(summary, spec, h, done["num_params"], ks, terms)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    table = markdown(results)
    (args.out / "table.md").write_text(table)
    plots(results, args.out)
    print(table)
    print("sanity:", json.dumps(results["sanity"]))
    for t in results["targets"]:
        print(f"target {t['target']}: {t['value']} (bound {t['bound']}) {'MET' if t['met'] else 'MISSED'}")
    print(
        f"output: {args.out} (results.json, table.md, loss_vs_time.png, loss_vs_tokens.png, utilisation.png)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
