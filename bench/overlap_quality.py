"""Loss at equal tokens of overlapped DiLoCo (`outer.overlap`) against blocking DiLoCo.

Overlapping the all-reduce with the next round's inner steps removes its blocked time on a slow
link, but each outer step lands one round late. This bench measures what the delay costs per
token, apart from any link: four peers in one process (the exact in-process backend), a small
GPT (d_model 64, 2 layers, sequence 64, batch 8), H = 20, the same seed, data streams, schedule
and budget of `--rounds` × H inner steps per peer for every arm, evaluated exactly at the budget.

Arms: training alone (`independent`), DiLoCo with the reference outer step (α = 0.7, β = 0.9),
overlapped DiLoCo with the same step, overlapped DiLoCo with `--tuned-lr` / `--tuned-momentum`
(chosen on the tuning seed, by the mean peer's loss; a delayed step tolerates less momentum), and
overlapped DiLoCo with the reference step whose mean lands `LAND_AT` inner steps into the next
round (`outer.land_at_step`) instead of at its end. `--arms` runs a subset (DiLoCo always).

    python -m bench.overlap_quality --seeds 1 2 3 --out bench/results/overlap-quality

Reported per arm: the mean peer's validation loss (median, min–max over seeds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.wan.budget import fmt_spread
from p2p_trainer.config import DataConfig, InnerConfig, ModelConfig, OuterConfig, RunConfig
from p2p_trainer.run.threads import run_inprocess
from p2p_trainer.train.checkpoint import atomic_write_text

MODEL = ModelConfig(d_model=64, n_layers=2, n_heads=4, seq_len=64)
PEERS, H = 4, 20
LAND_AT = 5
"""`outer.land_at_step` of the land arm: on the WAN testbed the blocking all-reduce of the
default's int8 Δ takes about 1.3 s against 0.28 s inner steps, so 5 steps cover it."""


def arm_config(method: str, seed: int, rounds: int, **outer: Any) -> RunConfig:
    return RunConfig(
        seed=seed,
        rounds=rounds,
        model=MODEL,
        data=DataConfig(batch_size=8, val_batches=8),
        inner=InnerConfig(lr=1e-3, warmup_steps=10, eval_every=0),
        outer=OuterConfig.for_method(method, num_inner_steps=H, **outer),
    )


def arms(tuned_lr: float, tuned_momentum: float) -> dict[str, tuple[str, dict[str, Any]]]:
    return {
        "independent": ("independent", {}),
        "diloco": ("diloco", {}),
        "overlap": ("diloco", {"overlap": True}),
        "overlap-tuned": (
            "diloco",
            {"overlap": True, "outer_lr": tuned_lr, "outer_momentum": tuned_momentum},
        ),
        # the mean lands LAND_AT inner steps into the next round instead of at its end
        f"land-{LAND_AT}": ("diloco", {"overlap": True, "land_at_step": LAND_AT}),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--rounds", type=int, default=40, help="Rounds of H = 20 inner steps per arm.")
    p.add_argument("--tuned-lr", type=float, default=1.0)
    p.add_argument("--tuned-momentum", type=float, default=0.5)
    p.add_argument("--arms", nargs="+", default=None, help="A subset of the arms (default: all).")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    every = arms(args.tuned_lr, args.tuned_momentum)
    chosen = [a for a in every if args.arms is None or a in args.arms or a == "diloco"]
    unknown = set(args.arms or ()) - set(every)
    if unknown:
        p.error(f"unknown arms {sorted(unknown)}: use some of {', '.join(every)}")
    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()
    for seed in args.seeds:
        for name in chosen:
            method, outer = every[name]
            res = run_inprocess(arm_config(method, seed, args.rounds, **outer), PEERS)
            loss = statistics.fmean(res.val_loss)
            runs.append({"arm": name, "seed": seed, "mean_peer_loss": loss, "failed": res.failed_exchanges})
            print(f"{name:14s} seed {seed}: mean peer {loss:.4f}", flush=True)
    lines = [
        f"Overlapped DiLoCo at equal tokens: {PEERS} peers in process, H = {H}, "
        f"{args.rounds * H} inner steps per peer, seeds {args.seeds}; "
        f"overlap-tuned: α = {args.tuned_lr}, β = {args.tuned_momentum}.",
        "",
        "| arm | mean peer loss | − DiLoCo, per seed |",
        "|---|---|---|",
    ]
    by_seed = {(r["arm"], r["seed"]): r["mean_peer_loss"] for r in runs}
    for name in chosen:
        losses = [by_seed[(name, s)] for s in args.seeds]
        gaps = ", ".join(f"{by_seed[(name, s)] - by_seed[('diloco', s)]:+.3f}" for s in args.seeds)
        lines.append(f"| {name} | {fmt_spread(losses)} | {gaps} |")
    meta = {
        "command": "python -m bench.overlap_quality " + " ".join(argv or sys.argv[1:]),
        "date_utc": started,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_avg_before_after": [load_before, os.getloadavg()],
    }
    lines += [
        "",
        f"Command: `{meta['command']}`; {started}; load {load_before[0]:.1f} → {os.getloadavg()[0]:.1f}",
    ]
    table = "\n".join(lines) + "\n"
    atomic_write_text(args.out / "results.json", json.dumps({"meta": meta, "runs": runs}, indent=1))
    atomic_write_text(args.out / "table.md", table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
