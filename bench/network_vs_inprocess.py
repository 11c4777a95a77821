"""The network changes nothing about the math: networked swarm vs in-process reference.

For each method, the same config, seed, data streams (peer i reads stream "peer{i}") and token
budget run once over the exact in-process backend and once as a real swarm (bootstrap + N peer
processes with their own DHT node and p2p daemon on loopback). Prints both validation losses,
their difference, and how many exchanges failed or timed out in each.

    .venv/bin/python -m bench.network_vs_inprocess [--peers 4] [--rounds 30] [--h 10] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from p2p_trainer.config import DataConfig, InnerConfig, ModelConfig, OuterConfig, RunConfig, to_toml
from p2p_trainer.run.launcher import LocalOptions
from p2p_trainer.run.local_swarm import run_local
from p2p_trainer.run.threads import run_inprocess
from p2p_trainer.train.checkpoint import atomic_write_text

METHODS = ("data-parallel", "diloco", "noloco", "factored", "independent")


def config(method: str, rounds: int, h: int, seed: int) -> RunConfig:
    return RunConfig(
        seed=seed,
        rounds=rounds,
        model=ModelConfig(seq_len=64),
        data=DataConfig(batch_size=8),
        inner=InnerConfig(warmup_steps=10, eval_every=0),
        outer=OuterConfig.for_method(method, num_inner_steps=h),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--h", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", nargs="*", default=list(METHODS))
    ap.add_argument("--out", type=Path, default=Path("bench/results/network_vs_inprocess"))
    args = ap.parse_args()
    rows = []
    for method in args.methods:
        cfg = config(method, args.rounds, args.h, args.seed)
        t0 = time.monotonic()
        ref = run_inprocess(cfg, args.peers)
        t_ref = time.monotonic() - t0
        with tempfile.TemporaryDirectory(prefix="p2pt-bench-") as tmp:
            run_dir = Path(tmp)
            (run_dir / "config.toml").write_text(to_toml(cfg))
            opts = LocalOptions(
                config_path=run_dir / "config.toml", run=cfg, peers=args.peers, run_dir=run_dir
            )
            net = run_local(opts, show=False)
        net_losses = [p["val_loss"] for p in net["per_peer"] if p["val_loss"] is not None]
        row = {
            "method": method,
            "tokens": ref.tokens,
            "net_tokens": net["tokens"],
            "inprocess_val_loss": sum(ref.val_loss) / len(ref.val_loss),
            "network_val_loss": sum(net_losses) / max(1, len(net_losses)),
            "inprocess_failed_exchanges": ref.failed_exchanges,
            "network_failed_exchanges": sum(p["failed_exchanges"] for p in net["per_peer"]),
            "network_exchanges": sum(p["exchanges"] for p in net["per_peer"]),
            "inprocess_s": t_ref,
            "network_s": net["wall_s"],
        }
        row["difference"] = row["network_val_loss"] - row["inprocess_val_loss"]
        rows.append(row)
        print(
            f"{method:14s} in-process {row['inprocess_val_loss']:.4f}  network {row['network_val_loss']:.4f}  "
            f"diff {row['difference']:+.4f}  failed exchanges: in-process {row['inprocess_failed_exchanges']}, "
            f"network {row['network_failed_exchanges']}/{row['network_exchanges']}  tokens {row['tokens']}/{row['net_tokens']}",
            flush=True,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "results.json", json.dumps(rows, indent=2))
    worst = max(abs(r["difference"]) for r in rows)
    print(f"largest |network − in-process| = {worst:.4f} nats/byte (target ≤ 0.05)")


if __name__ == "__main__":
    main()
