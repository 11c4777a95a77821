"""Write a simulation's results: results.json, table.md and PNG plots, each atomically (temp + os.replace)."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from p2p_trainer.lab.sim.calibration import PublishedPoint
from p2p_trainer.lab.sim.scenario import Scenario
from p2p_trainer.lab.sim.surrogate import SurrogateResult
from p2p_trainer.lab.sim.timing import MethodResult
from p2p_trainer.train.atomic_files import atomic_write_bytes


def _fmt(x: float, digits: int = 3) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.{digits}f}"


def results_table(results: Mapping[str, MethodResult]) -> str:
    """Markdown table, one row per method."""
    lines = [
        "| method | goodput | utilisation | uptime | mean round (s) | rounds | MB/peer/round | GB/peer total | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        notes = ", ".join(f"{k}={_fmt(v, 2)}" for k, v in r.extra.items())
        lines.append(
            f"| {name} | {_fmt(r.goodput)} | {_fmt(r.utilisation)} | {_fmt(r.uptime)} | "
            f"{_fmt(r.mean_round_s, 2)} | {r.rounds} | {_fmt(r.bytes_per_peer_per_round / 1e6, 1)} | "
            f"{_fmt(r.bytes_per_peer_total / 1e9, 2)} | {notes} |"
        )
    return "\n".join(lines) + "\n"


def published_table(rows: Sequence[tuple[PublishedPoint, float]]) -> str:
    """Published vs simulated goodput (docs/simulator.md states the assumptions)."""
    lines = ["| point | published | simulated | difference (points) |", "|---|---|---|---|"]
    for p, got in rows:
        lines.append(f"| {p.label} | {p.goodput:.2f} | {got:.3f} | {100 * (got - p.goodput):+.1f} |")
    return "\n".join(lines) + "\n"


def surrogate_table(sur: Mapping[str, SurrogateResult]) -> str:
    """Quality per method on the noisy-quadratic surrogate (surrogate.py)."""
    lines = ["| method | surrogate rounds | excess loss | consensus distance |", "|---|---|---|---|"]
    for name, r in sur.items():
        lines.append(f"| {name} | {r.rounds} | {r.excess_loss:.4g} | {r.consensus_distance:.4g} |")
    return "\n".join(lines) + "\n"


def plot_surrogate(sur: Mapping[str, SurrogateResult]) -> bytes:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    longest = max((r.rounds for r in sur.values()), default=1)
    for name, r in sur.items():
        ax.plot(np.arange(len(r.loss_trace)) / max(longest, 1), r.loss_trace, label=name)
    ax.set(xlabel="fraction of the horizon (fastest method)", ylabel="excess loss", yscale="log")
    ax.set_title("Surrogate: noisy quadratics, rounds each method completes in the same time")
    ax.grid(alpha=0.3)
    ax.legend()
    return _png(fig)


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def plot_goodput_over_time(results: Mapping[str, MethodResult], horizon_s: float) -> bytes:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, r in results.items():
        bins = len(r.series_goodput)
        t_h = (np.arange(bins) + 0.5) * horizon_s / bins / 3600.0
        ax.plot(t_h, r.series_goodput, label=name)
    ax.set(xlabel="time (h)", ylabel="goodput", ylim=(0, 1.05), title="Goodput over time")
    ax.grid(alpha=0.3)
    ax.legend()
    return _png(fig)


def plot_round_times(results: Mapping[str, MethodResult]) -> bytes:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, r in results.items():
        if r.round_trace:
            t, d = np.array(r.round_trace).T
            ax.plot(t / 3600.0, d, ".", markersize=2, label=name)
    ax.set(xlabel="time (h)", ylabel="outer round time (s)", title="Round times", yscale="log")
    ax.grid(alpha=0.3)
    ax.legend()
    return _png(fig)


def plot_summary(results: Mapping[str, MethodResult]) -> bytes:
    names = list(results)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, key in enumerate(("goodput", "utilisation", "uptime")):
        ax.bar(x + (i - 1) * 0.27, [getattr(results[n], key) for n in names], width=0.27, label=key)
    ax.set_xticks(x, names)
    ax.set(ylim=(0, 1.05), title="Totals over the horizon")
    ax.legend()
    return _png(fig)


def write_report(
    out_dir: Path,
    scenario: Scenario,
    results: Mapping[str, MethodResult],
    surrogate: Mapping[str, SurrogateResult] | None = None,
) -> list[Path]:
    """Write results.json, table.md and the PNGs into `out_dir`; return the paths written."""
    payload: dict[str, Any] = {
        "scenario": scenario.to_dict(),
        "results": {k: r.to_dict() for k, r in results.items()},
    }
    table = results_table(results)
    if surrogate:
        payload["surrogate"] = {k: dict(r.__dict__) for k, r in surrogate.items()}
        table += "\n" + surrogate_table(surrogate)
    written = {
        "results.json": json.dumps(payload, indent=1).encode(),
        "table.md": table.encode(),
        "goodput_over_time.png": plot_goodput_over_time(results, scenario.horizon_s),
        "round_times.png": plot_round_times(results),
        "summary.png": plot_summary(results),
    }
    if surrogate:
        written["surrogate.png"] = plot_surrogate(surrogate)
    paths = []
    for name, data in written.items():
        atomic_write_bytes(out_dir / name, data)
        paths.append(out_dir / name)
    return paths
