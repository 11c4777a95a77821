"""Loss at equal tokens per codec: what compressing the pseudo-gradient costs in model quality.

Four peers in one process (the exact in-process backend, which applies the same codecs as the
network: `exchange/codecs.py`), the default model, DiLoCo at H = 20 with the reference outer step
(α = 0.7, β = 0.9), every arm with the same seed, data streams, schedule (constant learning rate
after warm-up) and budget of `--steps` inner steps per peer, evaluated exactly at the budget. Only
`exchange.update_codec`, `result_codec` and `error_feedback` differ between arms. The codecs'
parameters are the shipped defaults (int8/int4: a scale per 128 values; top-k: 1/64 of each
4096-value chunk, int8 values) and were not tuned, so no tuning seeds are set aside.

    python -m bench.codec_quality --steps 1000 --seeds 200 201 202 --out bench/results/codecs

Reported per arm: the consensus model's validation loss (median, min–max over seeds), its
relative change against float32 on the same seed, and the bytes each peer sent per round.
Runs are saved one by one (runs.json) and skipped when run again.
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

from bench.quality_sweep import variant_config
from bench.wan.budget import fmt_spread
from p2p_trainer.config import ExchangeConfig, RunConfig, load_config
from p2p_trainer.run.threads import run_inprocess
from p2p_trainer.train.checkpoint import atomic_write_text

SPARSELOCO_STEP = {"outer_momentum": 0.0, "outer_lr": 4.0}
"""SparseLoCo's outer step (no outer momentum: the decayed residual plays it), with α tuned on seed
300 over 1, 2, 4, 8 (bench/results/codecs-tuning): the mean of sparse contributions whose
supports differ is diluted up to the group size, and a larger step makes up for it."""
TOPK = {"update_codec": "topk", "result_codec": "topk"}

ARMS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # name: ([exchange] overrides, [outer] overrides); the reported arms
    "float32": ({"update_codec": "float32"}, {}),
    "int8": ({"update_codec": "int8", "result_codec": "int8"}, {}),
    "int8-no-ef": ({"update_codec": "int8", "result_codec": "int8", "error_feedback": False}, {}),
    "int4": ({"update_codec": "int4", "result_codec": "int8"}, {}),
    "int4-no-ef": ({"update_codec": "int4", "result_codec": "int8", "error_feedback": False}, {}),
    "topk": ({**TOPK, "error_feedback_decay": 0.95}, SPARSELOCO_STEP),
    "topk-no-ef": ({**TOPK, "error_feedback": False}, SPARSELOCO_STEP),
}
TUNING: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # top-k's outer step, on the tuning seed only
    "topk-diloco-step": (TOPK, {}),
    "topk-diloco-step-a2": (TOPK, {"outer_lr": 2.0}),
    "topk-m0-a4": (TOPK, {"outer_momentum": 0.0, "outer_lr": 4.0}),
    **{
        f"topk-sparseloco-a{a:g}": (
            {**TOPK, "error_feedback_decay": 0.95},
            {"outer_momentum": 0.0, "outer_lr": a},
        )
        for a in (1.0, 2.0, 4.0, 8.0)
    },
}
ALL_ARMS = {**ARMS, **TUNING}
TARGETS = {"int8": 0.005, "int4": 0.01, "topk": 0.02}
"""The issue's acceptance: relative loss increase over float32 at equal tokens."""
METHOD = "diloco-h20"


def arm_config(base: RunConfig, arm: str, steps: int, seed: int, batch: int, seq_len: int) -> RunConfig:
    cfg = variant_config(base, METHOD, steps, seed, batch, seq_len)
    exchange, outer = ALL_ARMS[arm]
    return dataclasses.replace(
        cfg,
        exchange=dataclasses.replace(cfg.exchange, **exchange),
        outer=dataclasses.replace(cfg.outer, **outer),
    )


def bytes_per_round(history: list[list[Any]]) -> float:
    sent = [e.bytes_sent for peer in history for m in peer for e in m.report.exchanges if e.tag == "outer"]
    rounds = sum(len(peer) for peer in history)
    return sum(sent) / rounds if rounds else 0.0


def table(runs: list[dict[str, Any]], seeds: list[int]) -> str:
    by = {(r["arm"], r["seed"]): r for r in runs}
    lines = [
        "| arm | consensus loss | vs float32 (relative) | target | bytes sent per peer per round | "
        "× fewer than float32 | seeds |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm in [a for a in ALL_ARMS if any(r["arm"] == a for r in runs)]:
        rs = [by[(arm, s)] for s in seeds if (arm, s) in by]
        if not rs:
            continue
        rel = [
            r["consensus"] / by[("float32", r["seed"])]["consensus"] - 1
            for r in rs
            if ("float32", r["seed"]) in by
        ]
        ratio = [
            by[("float32", r["seed"])]["bytes_per_round"] / r["bytes_per_round"]
            for r in rs
            if ("float32", r["seed"]) in by and r["bytes_per_round"]
        ]
        target = TARGETS.get(arm)
        met = ""
        if target is not None and rel:
            met = f"≤ {target:.1%}: {'met' if statistics.median(rel) <= target else 'missed'}"
        lines.append(
            f"| {arm} | {fmt_spread([r['consensus'] for r in rs], '.4f')} | "
            f"{fmt_spread([100 * x for x in rel], '+.2f')} % | {met} | "
            f"{statistics.median(r['bytes_per_round'] for r in rs):,.0f} | {fmt_spread(ratio, '.1f')} | {len(rs)} |"
        )
    return "\n".join(lines)


def _header(args: argparse.Namespace) -> str:
    return (
        f"{args.peers} peers in process, DiLoCo H=20 (α 0.7, β 0.9 unless the arm says), "
        f"{args.steps} inner steps each, seeds {args.seeds}, default model, batch {args.batch_size} × "
        f"{args.seq_len}; {platform.node()}, {os.cpu_count()} cores"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs") / "codecs")
    p.add_argument("--steps", type=int, default=1000, help="Inner steps per peer (the budget).")
    p.add_argument("--peers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--seeds", type=int, nargs="+", default=[200, 201, 202])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ALL_ARMS))
    p.add_argument("--merge", type=Path, nargs="+", default=[], help="Only tabulate these runs.json dirs.")
    args = p.parse_args(argv)
    if args.merge:
        merged = [r for d in args.merge for r in json.loads((d / "runs.json").read_text())]
        merged = [r for r in merged if r["steps"] == args.steps]
        md = f"{_header(args)}\n\n{table(merged, args.seeds)}\n"
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out / "table.md", md)
        print(md)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "runs.json"
    runs: list[dict[str, Any]] = json.loads(path.read_text()) if path.exists() else []
    done = {(r["arm"], r["seed"], r["steps"]) for r in runs}
    # the default model and data; float32 everywhere unless an arm's codec says otherwise
    base = dataclasses.replace(load_config(), exchange=ExchangeConfig())
    for seed in args.seeds:
        for arm in ["float32", *[a for a in args.arms if a != "float32"]]:
            if (arm, seed, args.steps) in done:
                continue
            cfg = arm_config(base, arm, args.steps, seed, args.batch_size, args.seq_len)
            print(f"{time.strftime('%H:%M:%S')} {arm} seed {seed} ({cfg.rounds} rounds)", flush=True)
            t0, load0 = time.monotonic(), os.getloadavg()[0]
            res = run_inprocess(cfg, args.peers, torch_threads=1)
            result = {
                "consensus": res.mean_model_val_loss,
                "mean_peer": statistics.fmean(res.val_loss),
                "bytes_per_round": bytes_per_round(res.history),
                "failed_exchanges": res.failed_exchanges,
                "tokens": res.tokens,
                "wall_s": round(time.monotonic() - t0, 1),
                "load_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],
            }
            runs.append({"arm": arm, "seed": seed, "steps": args.steps, **result})
            atomic_write_text(path, json.dumps(runs, indent=1))
            print(
                f"  consensus {result['consensus']:.4f}, {result['bytes_per_round']:,.0f} B/round", flush=True
            )
    mine = [r for r in runs if r["steps"] == args.steps]
    md = f"{_header(args)}\n\n{table(mine, args.seeds)}\n"
    atomic_write_text(args.out / "table.md", md)
    print(md)


if __name__ == "__main__":
    main()
