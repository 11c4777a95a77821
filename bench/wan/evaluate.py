"""Each arm's models at the same instants of the shared clock, evaluated after the run.

At every evaluation time (evenly spaced, the last one exactly the budget) each peer's model is
its last snapshot at or before that time (bench/wan/budget.py). At the budget the bench also
scores the swarm's consensus model (the mean of the peers' models) and its best single peer, and
measures every peer's throughput over the whole rounds it did within the budget.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import torch

from bench.wan.analysis import Evaluator, consensus_distance
from bench.wan.budget import clock_offset, eval_times, rate, snapshot_at
from p2p_trainer.round_log import read_log
from p2p_trainer.train.snapshots import SnapshotInfo, list_snapshots, load_snapshot


class _Scores:
    """Validation loss per snapshot file, each evaluated once."""

    def __init__(self, ev: Evaluator) -> None:
        self.ev, self.done = ev, dict[Path, float]()

    def __call__(self, info: SnapshotInfo) -> float:
        if info.path not in self.done:
            self.done[info.path] = self.ev.loss(load_snapshot(info.path))
        return self.done[info.path]


def budget_eval(
    run_dir: Path, run: dict[str, Any], peers: int, ev: Evaluator, points: int, init_loss: float | None = None
) -> dict[str, Any]:
    """The run's loss curve on the shared clock and its models at exactly t0 + budget. `init_loss`
    (the seed's initial model, where every arm starts) opens the curve at 0 tokens, so that loss at
    equal tokens is defined down to the fewest tokens any arm processed."""
    t0, budget = run.get("t0_unix"), float(run["budget_s"])
    if t0 is None:
        return {"curve": [], "ok": False}
    snaps: list[list[SnapshotInfo]] = []
    offsets: list[float] = []
    rates: list[float | None] = []
    step_rates: list[float | None] = []
    for i in range(peers):
        rounds = read_log(run_dir / f"peer{i}" / "metrics.jsonl").rounds
        off = clock_offset(rounds)
        snaps.append(list_snapshots(run_dir / f"peer{i}" / "snapshots"))
        offsets.append(off if off is not None else 0.0)
        rates.append(rate(rounds, offsets[-1], t0, t0 + budget, "tokens") if off is not None else None)
        step_rates.append(rate(rounds, offsets[-1], t0, t0 + budget, "step") if off is not None else None)
    score = _Scores(ev)
    curve: list[dict[str, float]] = []
    if init_loss is not None:
        curve.append({"time_s": 0.0, "tokens": 0.0, "step": 0.0, "val_loss": init_loss, "age_s": 0.0})
    final: list[SnapshotInfo] = []
    times = eval_times(budget, points)
    for k, t in enumerate(times):
        picked = [snapshot_at(s, off, t0 + t) for s, off in zip(snaps, offsets, strict=True)]
        if any(p is None for p in picked):
            continue
        infos = [p for p in picked if p is not None]
        curve.append(
            {
                "time_s": t,
                "tokens": float(sum(i.tokens for i in infos)),
                "step": float(statistics.median(i.step for i in infos)),
                "val_loss": statistics.fmean(score(i) for i in infos),
                # how long before t the newest of these snapshots was taken (a round at most)
                "age_s": max(t0 + t - (off + i.time_s) for i, off in zip(infos, offsets, strict=True)),
            }
        )
        final = infos if k == len(times) - 1 else final
    out: dict[str, Any] = {"curve": curve, "ok": bool(final)}
    if final:
        models = [load_snapshot(i.path) for i in final]
        mean = [torch.stack(ts).mean(0) for ts in zip(*models, strict=True)]
        losses = [score(i) for i in final]
        out.update(
            peer_losses=losses,
            mean_peer_loss=statistics.fmean(losses),
            best_peer_loss=min(losses),
            consensus_loss=ev.loss(mean),
            consensus_distance=consensus_distance(models),
            steps=[i.step for i in final],
            tokens=[i.tokens for i in final],
        )
    known = [r for r in rates if r is not None]
    out["tokens_per_s_per_peer"] = statistics.fmean(known) if len(known) == peers else None
    known_steps = [r for r in step_rates if r is not None]
    out["steps_per_s"] = statistics.fmean(known_steps) if len(known_steps) == peers else None
    out["used_snapshots"] = sorted(str(p) for p in score.done)
    return out


def prune_snapshots(run_dir: Path, peers: int, keep: list[str]) -> int:
    """Delete the run's snapshots the evaluation did not use (disk: one per round per peer); returns
    how many were deleted."""
    kept, gone = set(keep), 0
    for i in range(peers):
        for s in list_snapshots(run_dir / f"peer{i}" / "snapshots"):
            if str(s.path) not in kept:
                s.path.unlink()
                gone += 1
    return gone
