"""What a chaos run did, from the peers' metrics files: per-peer rounds, tokens, pauses, failures.

A peer's metrics file spans all its lives (a `start` record opens each); pauses are measured
within one life: the longest stretch between two round records not spent in inner steps.
"""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path
from typing import Any

from p2p_trainer.round_log import read_log


def peer_summary(run_dir: Path, i: int) -> dict[str, Any]:
    log = read_log(run_dir / f"peer{i}" / "metrics.jsonl")
    lives = log.lives()
    rounds, final = log.rounds, log.final
    exchanges = [e for r in rounds for e in r.exchanges]
    longest_pause_s = 0.0
    for life in lives:
        for prev, cur in itertools.pairwise(life.rounds):
            gap = cur.time_s - prev.time_s - cur.compute_s
            longest_pause_s = max(longest_pause_s, gap)
    return {
        "peer": f"peer{i}",
        "lives": sum(1 for life in lives if life.starts),
        "rounds_done": len(rounds),
        "last_round": rounds[-1].round if rounds else None,
        "tokens": sum(r.round_tokens for r in rounds),
        "exchanges": len(exchanges),
        "failed_exchanges": sum(1 for e in exchanges if not e.ok),
        "max_blocked_s": max((r.blocked_s for r in rounds), default=0.0),
        "longest_pause_s": longest_pause_s,
        "final_val_loss": final.val_loss if final else None,
        "final_round": final.round if final else None,
    }


def tokens_per_round(run_dir: Path, peers: int, target: int) -> dict[str, Any]:
    """The swarm's tokens per outer round (the last record of each peer and round), against `target`.

    Only rounds that every peer alive at the end has completed count (the last rounds are ragged).
    """
    by_round: dict[int, dict[int, int]] = {}
    last_round: list[int] = []
    for i in range(peers):
        rounds = read_log(run_dir / f"peer{i}" / "metrics.jsonl").rounds
        for r in rounds:
            by_round.setdefault(r.round, {})[i] = r.round_tokens
        if rounds:
            last_round.append(rounds[-1].round)
    if not by_round or not target:
        return {"target": target, "rounds": {}}
    complete_until = min(last_round)
    totals = {rnd: sum(v.values()) for rnd, v in sorted(by_round.items()) if rnd <= complete_until}
    devs = {rnd: (t - target) / target for rnd, t in totals.items()}
    return {
        "target": target,
        "rounds": totals,
        "deviation": devs,
        "mean_abs_deviation": statistics.fmean(abs(d) for d in devs.values()) if devs else None,
        "max_abs_deviation": max((abs(d) for d in devs.values()), default=None),
        "within_5pct": sum(1 for d in devs.values() if abs(d) <= 0.05),
        "counted_rounds": len(devs),
    }


def render_table(report: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title=f"chaos: {report['scenario']} ({report['wall_s']:.0f} s)")
    cols = ("peer", "lives", "rounds", "tokens", "failed ex.", "max blocked s", "longest pause s", "val loss")
    for col in cols:
        table.add_column(col)
    for p in report["per_peer"]:
        vl = f"{p['final_val_loss']:.3f}" if p["final_val_loss"] is not None else "-"
        table.add_row(
            p["peer"],
            str(p["lives"]),
            str(p["rounds_done"]),
            str(p["tokens"]),
            f"{p['failed_exchanges']}/{p['exchanges']}",
            f"{p['max_blocked_s']:.1f}",
            f"{p['longest_pause_s']:.1f}",
            vl,
        )
    return table
