"""Churn must not split the swarm: SIGKILL peers of a real swarm and watch the survivors re-agree.

A swarm of `--peers` real processes on loopback (bootstrap node + `join` peers, the same data
streams as any local swarm) trains `--rounds` rounds; when the first peer's log reaches each
`--kill ROUND:PEER`, that peer is SIGKILLed. Every peer saves φ after every round, so the
survivors' consensus distance (docs/algorithms.md §8) can be followed round by round. Reported:
the distance before each kill, its peak after it, the rounds it took to fall back below
`--agree` (0.01), and the survivors' final loss against a fault-free swarm of the survivors' count
run right after with the same config. With `--control`, that fault-free swarm runs twice, and the
difference between its two final losses says how far apart two runs of one configuration end
(processes on a shared machine do not train in the same order twice).

    python -m bench.reagree --method diloco --kill 30:3 --kill 60:4 --out runs/reagree-diloco
    python -m bench.reagree --method factored --kill 30:3 --kill 60:4 --out runs/reagree-factored
    python -m bench.reagree --method default --kill 20:3 --kill 45:4 --out runs/reagree-default
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import statistics
import time
from pathlib import Path
from typing import Any

from p2p_trainer.algo.outer import consensus_distance
from p2p_trainer.config import DataConfig, InnerConfig, ModelConfig, OuterConfig, RunConfig, load_config
from p2p_trainer.round_log import read_log
from p2p_trainer.run.launcher import LocalSwarm, local_options
from p2p_trainer.train.checkpoint import atomic_write_text
from p2p_trainer.train.snapshots import list_snapshots, load_snapshot

DEFAULT = "default"
"""--method value for the shipped default run's outer loop and exchange."""


def config(method: str, rounds: int, h: int, seed: int = 0) -> RunConfig:
    """A small model, so that a churned and a fault-free swarm run in minutes. `default`: the
    shipped run's [outer] and [exchange] (overlapped DiLoCo, int8 Δ) with H = `h`. `seed` sets the
    initial weights and the data order, the same in the churned and the fault-free swarm."""
    cfg = RunConfig(
        seed=seed,
        rounds=rounds,
        model=ModelConfig(d_model=64, n_layers=2, n_heads=2, seq_len=64),
        data=DataConfig(batch_size=8, val_batches=8),
        inner=InnerConfig(eval_every=0, warmup_steps=10),
    )
    if method != DEFAULT:
        return dataclasses.replace(cfg, outer=OuterConfig.for_method(method, num_inner_steps=h))
    shipped = load_config()
    outer = dataclasses.replace(shipped.outer, num_inner_steps=h)
    return dataclasses.replace(cfg, outer=outer, exchange=shipped.exchange)


def _round_of(run_dir: Path, i: int) -> int:
    rounds = read_log(run_dir / f"peer{i}" / "metrics.jsonl").rounds
    return rounds[-1].round + 1 if rounds else 0


def run_swarm(cfg: RunConfig, peers: int, out: Path, kills: list[tuple[int, int]]) -> list[int]:
    """Train, killing at the given rounds; returns the survivors."""
    opts = local_options(out, cfg, peers)
    pending = sorted(kills)
    with LocalSwarm(opts) as swarm:
        swarm.start_bootstrap()
        for i in range(peers):
            swarm.start_peer(i, extra=["--snapshot-every", "1"])
        survivors = [i for i in range(peers) if i not in {k for _, k in kills}]
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            watched = survivors[0]
            while pending and _round_of(out, watched) >= pending[0][0]:
                _, victim = pending.pop(0)
                swarm.peers[victim].send(signal.SIGKILL)
            if all(swarm.peers[i].proc.poll() is not None for i in survivors):
                break
            time.sleep(0.2)
    return survivors


def distances(out: Path, survivors: list[int]) -> dict[int, float]:
    """Consensus distance of the survivors' φ, for every round all of them saved."""
    snaps = [{s.round: s.path for s in list_snapshots(out / f"peer{i}" / "snapshots")} for i in survivors]
    common = sorted(set.intersection(*(set(s) for s in snaps)))
    return {r: consensus_distance([load_snapshot(s[r]) for s in snaps]) for r in common}


def recovery(dist: dict[int, float], kills: list[tuple[int, int]], agree: float) -> list[dict[str, Any]]:
    out = []
    for at, victim in sorted(kills):
        before = [d for r, d in dist.items() if r < at]
        after = {r: d for r, d in dist.items() if r >= at}
        back = next((r for r, d in sorted(after.items()) if d < agree and r > at), None)
        out.append(
            {
                "kill_round": at,
                "peer": victim,
                "distance_before": before[-1] if before else None,
                "peak_after": max(after.values()) if after else None,
                "rounds_to_agree": None if back is None else back - at,
            }
        )
    return out


def final_losses(out: Path, peers: list[int]) -> list[float]:
    finals = [read_log(out / f"peer{i}" / "metrics.jsonl").final for i in peers]
    return [f.val_loss for f in finals if f is not None and f.val_loss is not None]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", default="diloco", help=f"a method, or {DEFAULT!r}: the shipped run's")
    p.add_argument("--peers", type=int, default=5)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--h", type=int, default=10)
    p.add_argument("--kill", action="append", default=[], help="ROUND:PEER (repeatable).")
    p.add_argument("--agree", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0, help="the run's seed: initial weights and data order")
    p.add_argument("--control", action="store_true", help="run the fault-free swarm a second time")
    p.add_argument("--out", type=Path, default=Path("runs") / "reagree")
    args = p.parse_args(argv)
    kills = [(int(r), int(k)) for r, k in (spec.split(":") for spec in args.kill)]
    if any(not 0 <= k < args.peers for _, k in kills) or len({k for _, k in kills}) == args.peers:
        p.error("--kill ROUND:PEER: PEER must be one of the peers, and someone must survive")
    cfg = config(args.method, args.rounds, args.h, args.seed)
    t0 = time.monotonic()
    survivors = run_swarm(cfg, args.peers, args.out / "churn", kills)
    dist = distances(args.out / "churn", survivors)
    free_peers = list(range(len(survivors)))
    run_swarm(cfg, len(survivors), args.out / "fault-free", [])
    free_dist = distances(args.out / "fault-free", free_peers)
    churn_loss, free_loss = (
        final_losses(args.out / "churn", survivors),
        final_losses(args.out / "fault-free", free_peers),
    )
    control: dict[str, Any] = {}
    if args.control:
        run_swarm(cfg, len(survivors), args.out / "control", [])
        again = final_losses(args.out / "control", free_peers)
        control = {
            "control_final_loss": again,
            "control_difference": statistics.fmean(again) - statistics.fmean(free_loss)
            if again and free_loss
            else None,
        }
    result = {
        "method": args.method,
        "seed": args.seed,
        "peers": args.peers,
        "rounds": args.rounds,
        "kills": kills,
        "recovery": recovery(dist, kills, args.agree),
        "distance_by_round": dist,
        "fault_free_distance_max": max(free_dist.values()) if free_dist else None,
        "churn_final_loss": churn_loss,
        "fault_free_final_loss": free_loss,
        "final_loss_difference": statistics.fmean(churn_loss) - statistics.fmean(free_loss)
        if churn_loss and free_loss
        else None,
        **control,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    atomic_write_text(args.out / "result.json", json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "distance_by_round"}, indent=1))


if __name__ == "__main__":
    main()
