"""Quality per token, without a network: every method's knobs over the exact in-process backend.

Which settings make the swarm's model better than training alone is a question about the math,
not the link, so it is asked here first, cheaply: N peers in one process (threads), the same
model, data streams (peer i reads stream "peer{i}" in every arm), seed, inner optimiser and a
constant learning rate after warm-up, each peer doing exactly `--steps` inner steps. Each run is
evaluated at that budget: every peer's anchor, the average of the peers' anchors (the swarm's
consensus model), and the best single peer. `independent` (no exchange) and `ideal`
(data-parallel, exact gradient averaging every step) run alongside, so each variant is also
reported as the fraction of the ideal collaboration gain it keeps:

    (L_independent − L_variant) / (L_independent − L_ideal)

    python -m bench.quality_sweep --steps 1500 --seeds 100 101 --out bench/results/sweep
    python -m bench.quality_sweep --list          # the variants

Runs are saved one by one (runs.json in --out) and skipped when run again, so a sweep can be
interrupted and extended. The table gives the median over seeds with min–max beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from bench.wan.budget import fmt_spread, fraction_of_ideal
from p2p_trainer.config import ExchangeConfig, OuterConfig, RunConfig, load_config
from p2p_trainer.run.threads import run_inprocess
from p2p_trainer.train.checkpoint import atomic_write_text

Variant = tuple[str, dict[str, Any]]
"""(method, [outer] overrides)."""

VARIANTS: dict[str, Variant] = {
    "independent": ("independent", {"num_inner_steps": 50}),
    "ideal": ("data-parallel", {"num_inner_steps": 50}),
    # DiLoCo: the reference α = 0.7, β = 0.9 at several H, and a gentler outer step
    "diloco-h10": ("diloco", {"num_inner_steps": 10}),
    "diloco-h20": ("diloco", {"num_inner_steps": 20}),
    "diloco-h50": ("diloco", {"num_inner_steps": 50}),
    "diloco-h20-a1.0-b0.5": ("diloco", {"num_inner_steps": 20, "outer_lr": 1.0, "outer_momentum": 0.5}),
    "diloco-h20-a0.5-b0.9": ("diloco", {"num_inner_steps": 20, "outer_lr": 0.5, "outer_momentum": 0.9}),
    # NoLoCo: pairs and groups of 4 (= all peers here)
    "noloco-h20": ("noloco", {"num_inner_steps": 20}),
    "noloco-h20-g4": ("noloco", {"num_inner_steps": 20, "group_size": 0}),
    # factored gossip: the shipped settings, then Mix2 over all peers, then stronger outer steps
    "factored-h20": ("factored", {"num_inner_steps": 20}),
    "factored-h20-mix2all": ("factored", {"num_inner_steps": 20, "mix2_group_size": 0}),
    "factored-h20-mix2all-b0.9": (
        "factored",
        {"num_inner_steps": 20, "mix2_group_size": 0, "outer_momentum": 0.9},
    ),
    "factored-h10-mix2all": ("factored", {"num_inner_steps": 10, "mix2_group_size": 0}),
    "factored-h20-g4-mix2all": ("factored", {"num_inner_steps": 20, "group_size": 0, "mix2_group_size": 0}),
    "factored-h20-unweighted": ("factored", {"num_inner_steps": 20, "token_weighted": False}),
}


def variant_config(
    base: RunConfig,
    name: str,
    steps: int,
    seed: int,
    batch_size: int | None = None,
    seq_len: int | None = None,
) -> RunConfig:
    method, overrides = VARIANTS[name]
    if method == "data-parallel":  # gradients averaged every step: H has no meaning
        overrides = {**overrides, "num_inner_steps": 1}
    outer = OuterConfig.for_method(method, **{"align_rounds": False, **overrides})
    h = outer.num_inner_steps
    # a constant learning rate after warm-up: every arm is at the same point of its schedule at
    # the budget, whatever its step count
    inner = dataclasses.replace(base.inner, min_lr_ratio=1.0, eval_every=0)
    data = dataclasses.replace(base.data, batch_size=batch_size or base.data.batch_size)
    model = dataclasses.replace(base.model, seq_len=seq_len or base.model.seq_len)
    return dataclasses.replace(
        base, seed=seed, rounds=steps // h, inner=inner, outer=outer, data=data, model=model
    )


def run_one(cfg: RunConfig, peers: int) -> dict[str, Any]:
    t0, load0 = time.monotonic(), os.getloadavg()[0]
    res = run_inprocess(cfg, peers, torch_threads=1)
    return {
        "peer_loss": res.val_loss,
        "mean_peer": statistics.fmean(res.val_loss),
        "best_peer": min(res.val_loss),
        "consensus": res.mean_model_val_loss,
        "consensus_distance": res.consensus_distance,
        "tokens": res.tokens,
        "steps_per_peer": cfg.rounds * cfg.outer.num_inner_steps,
        "failed_exchanges": res.failed_exchanges,
        "wall_s": round(time.monotonic() - t0, 1),
        "load_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }


def table(runs: list[dict[str, Any]], names: list[str], seeds: list[int]) -> str:
    """Median (min–max) over seeds; the fraction of ideal is computed per seed, then summarised."""
    by = {(r["variant"], r["seed"]): r for r in runs}
    lines = [
        "| variant | mean peer | consensus model | best peer | fraction of ideal (consensus) "
        "| fraction of ideal (mean peer) | consensus distance | seeds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        rs = [by[(name, s)] for s in seeds if (name, s) in by]
        if not rs:
            continue
        fractions: dict[str, list[float | None]] = {"consensus": [], "mean_peer": []}
        for r in rs:
            ind, ideal = by.get(("independent", r["seed"])), by.get(("ideal", r["seed"]))
            for key in fractions:
                fractions[key].append(
                    fraction_of_ideal(ind["mean_peer"], r[key], ideal["consensus"]) if ind and ideal else None
                )
        cells = [
            fmt_spread([r["mean_peer"] for r in rs], ".4f"),
            fmt_spread([r["consensus"] for r in rs], ".4f"),
            fmt_spread([r["best_peer"] for r in rs], ".4f"),
            fmt_spread(fractions["consensus"], ".2f"),
            fmt_spread(fractions["mean_peer"], ".2f"),
            fmt_spread([r["consensus_distance"] for r in rs], ".4f"),
        ]
        lines.append(f"| {name} | {' | '.join(cells)} | {len(rs)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs") / "sweep")
    p.add_argument("--steps", type=int, default=1500, help="Inner steps per peer (the budget).")
    p.add_argument("--peers", type=int, default=4)
    p.add_argument(
        "--batch-size", type=int, default=None, help="Sequences per micro-batch (default: the config's)."
    )
    p.add_argument("--seq-len", type=int, default=None, help="Tokens per sequence (default: the config's).")
    p.add_argument("--seeds", type=int, nargs="+", default=[100, 101])
    p.add_argument("--variants", nargs="+", default=None, help="Names (default: all); see --list.")
    p.add_argument("--list", action="store_true")
    args = p.parse_args(argv)
    if args.list:
        for name, (method, overrides) in VARIANTS.items():
            print(f"{name}: {method} {overrides}")
        return
    names = args.variants or list(VARIANTS)
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}: see --list")
    names = ["independent", "ideal", *[n for n in names if n not in ("independent", "ideal")]]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "runs.json"
    runs: list[dict[str, Any]] = json.loads(path.read_text()) if path.exists() else []
    done = {(r["variant"], r["seed"], r["steps"], r["peers"]) for r in runs}
    # the default model and data, but the plain exchange: each variant states its own rules
    base = dataclasses.replace(load_config(), exchange=ExchangeConfig())
    base = variant_config(base, "independent", 50, base.seed, args.batch_size, args.seq_len)
    for seed in args.seeds:
        for name in names:
            if (name, seed, args.steps, args.peers) in done:
                continue
            cfg = variant_config(base, name, args.steps, seed, args.batch_size, args.seq_len)
            print(f"{time.strftime('%H:%M:%S')} {name} seed {seed} ({cfg.rounds} rounds)", flush=True)
            result = run_one(cfg, args.peers)
            runs.append({"variant": name, "seed": seed, "steps": args.steps, "peers": args.peers, **result})
            atomic_write_text(path, json.dumps(runs, indent=1))
            print(f"  consensus {result['consensus']:.4f} mean peer {result['mean_peer']:.4f}", flush=True)
    mine = [r for r in runs if r["steps"] == args.steps and r["peers"] == args.peers]
    header = (
        f"{args.peers} peers, {args.steps} inner steps each, seeds {args.seeds}, default model "
        f"({base.model.d_model}d × {base.model.n_layers} layers, batch {base.data.batch_size} × "
        f"{base.model.seq_len}), AdamW lr {base.inner.lr} constant after {base.inner.warmup_steps} "
        f"warm-up steps; {platform.node()}, {os.cpu_count()} cores"
    )
    md = f"{header}\n\n{table(mine, names, args.seeds)}\n"
    atomic_write_text(args.out / "table.md", md)
    print(md)


if __name__ == "__main__":
    main()
