"""`p2p-trainer local --peers N`: a real swarm on loopback (one bootstrap node, N peer processes).

Shows live progress per peer, and at the end writes the run directory: per-peer metrics.jsonl
and checkpoints, summary.json, and a plot of validation loss over time. Ctrl-C stops every
process cleanly and still writes what was measured.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch

from p2p_trainer.processes import Child, wait_all
from p2p_trainer.round_log import FinalRecord, RoundRecord, read_log
from p2p_trainer.run.launcher import LocalOptions, LocalSwarm
from p2p_trainer.train.checkpoint import atomic_write_text, read_anchor

logger = logging.getLogger(__name__)


def peer_rows(run_dir: Path, peers: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(peers):
        log = read_log(run_dir / f"peer{i}" / "metrics.jsonl")
        last, final = (log.rounds[-1] if log.rounds else None), log.final
        rows.append(
            {
                "peer": f"peer{i}",
                "round": last.round + 1 if last else 0,
                "step": last.step if last else 0,
                "loss": last.train_loss if last else None,
                "val_loss": final.val_loss if final else last.val_loss if last else None,
                "tokens_per_s": last.tokens / last.time_s if last and last.time_s > 0 else 0.0,
                "last_exchange": ", ".join(
                    f"{e.tag}:{'ok' if e.ok else 'FAILED'}({e.group_size})"
                    for e in (last.exchanges if last else ())
                ),
                "done": final is not None,
            }
        )
    return rows


def render(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(title="p2p-trainer local swarm")
    for col in ("peer", "round", "step", "train loss", "tokens/s", "last exchange", "state"):
        table.add_column(col)
    for r in rows:
        loss = f"{r['loss']:.3f}" if r["loss"] is not None else "-"
        table.add_row(
            r["peer"],
            str(r["round"]),
            str(r["step"]),
            loss,
            f"{r['tokens_per_s']:.0f}",
            r["last_exchange"] or "-",
            "done" if r["done"] else "training",
        )
    return table


def summarize(opts: LocalOptions, wall_s: float, interrupted: bool) -> dict[str, Any]:
    """Per-peer and averaged-model validation loss, tokens, utilisation, bytes, failed exchanges."""
    from p2p_trainer.train.data import load_corpus, validation_batches
    from p2p_trainer.train.model import build_model

    peers: list[dict[str, Any]] = []
    anchors = []
    for i in range(opts.peers):
        d = opts.run_dir / f"peer{i}"
        log = read_log(d / "metrics.jsonl")
        rounds, final = log.rounds, log.final
        compute = sum(r.compute_s for r in rounds)
        wall = sum(r.wall_s for r in rounds)
        exchanges = [e for r in rounds for e in r.exchanges]
        peers.append(
            {
                "peer": f"peer{i}",
                "rounds": len(rounds),
                "tokens": rounds[-1].tokens if rounds else 0,
                "val_loss": final.val_loss if final else None,
                "utilisation": compute / wall if wall else 0.0,
                "blocked_s": sum(r.blocked_s for r in rounds),
                "bytes_sent": sum(r.bytes_sent for r in rounds),
                "bytes_received": sum(r.bytes_received for r in rounds),
                "exchanges": len(exchanges),
                "failed_exchanges": sum(1 for e in exchanges if not e.ok),
            }
        )
        if (d / "checkpoint.safetensors").exists():
            anchors.append(read_anchor(d / "checkpoint.safetensors"))
    mean_loss = None
    if anchors:
        model = build_model(opts.run.model, opts.run.seed)
        with torch.no_grad():
            for p, *vals in zip(model.parameters(), *anchors, strict=True):
                p.copy_(torch.stack(vals).mean(0))
        corpus = load_corpus(opts.run.data, opts.run.model.seq_len)
        batches = validation_batches(
            corpus, opts.run.model.seq_len, opts.run.data.batch_size, opts.run.data.val_batches
        )
        model.eval()
        with torch.no_grad():
            mean_loss = sum(float(model(x, y)) for x, y in batches) / len(batches)
    return {
        "method": opts.run.outer.method,
        "peers": opts.peers,
        "wall_s": wall_s,
        "interrupted": interrupted,
        "averaged_model_val_loss": mean_loss,
        "tokens": sum(p["tokens"] for p in peers),
        "mean_utilisation": sum(p["utilisation"] for p in peers) / max(1, len(peers)),
        "per_peer": peers,
    }


def plot_val_loss(run_dir: Path, peers: int, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i in range(peers):
        points = [
            (r.time_s, r.val_loss)
            for r in read_log(run_dir / f"peer{i}" / "metrics.jsonl").records
            if isinstance(r, RoundRecord | FinalRecord) and r.val_loss is not None
        ]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", ms=3, label=f"peer{i}")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("validation loss (nats/byte)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, out)


def run_local(opts: LocalOptions, show: bool = True, stop: threading.Event | None = None) -> dict[str, Any]:
    """Run the swarm until its peers finish, the time bound passes or `stop` is set.

    Without `stop`, SIGINT and SIGTERM set one of its own for the duration (a caller that passes
    `stop` owns the signal handlers, e.g. to know which signal ended the run).
    """
    opts.run_dir.mkdir(parents=True, exist_ok=True)
    previous = {}
    if stop is None:
        own = stop = threading.Event()
        previous = {s: signal.signal(s, lambda *_: own.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    swarm = LocalSwarm(opts)
    try:
        swarm.start_bootstrap()
        _watch(opts, [swarm.start_peer(i) for i in range(opts.peers)], stop, show)
    finally:
        swarm.stop(peer_timeout_s=60, boot_timeout_s=15)
        for s, h in previous.items():
            signal.signal(s, h)
    summary = summarize(opts, time.monotonic() - started, stop.is_set())
    atomic_write_text(opts.run_dir / "summary.json", json.dumps(summary, indent=2))
    plot_val_loss(opts.run_dir, opts.peers, opts.run_dir / "val_loss.png")
    return summary


def _watch(opts: LocalOptions, children: list[Child], stop: threading.Event, show: bool) -> None:
    limit_s = 60 * opts.max_minutes + 120 if opts.max_minutes else math.inf
    started = time.monotonic()
    if not show:
        while not stop.is_set() and not wait_all(children, 1.0) and time.monotonic() - started < limit_s:
            pass
        return
    from rich.live import Live

    with Live(render(peer_rows(opts.run_dir, opts.peers)), refresh_per_second=1) as live:
        while not stop.is_set() and any(c.alive() for c in children) and time.monotonic() - started < limit_s:
            time.sleep(1.0)
            live.update(render(peer_rows(opts.run_dir, opts.peers)))
