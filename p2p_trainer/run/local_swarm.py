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
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from p2p_trainer.config import RunConfig
from p2p_trainer.procs import Child, wait_all
from p2p_trainer.train.checkpoint import atomic_write_text, read_anchor
from p2p_trainer.train.metrics import read_records

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalOptions:
    config_path: Path
    """The run config every peer loads (written into the run directory)."""
    run: RunConfig
    peers: int
    run_dir: Path
    max_minutes: float | None = None
    torch_threads: int = 1
    startup_timeout_s: float = 60.0


def _python() -> list[str]:
    return [sys.executable, "-m", "p2p_trainer"]


def bootstrap_argv(run_dir: Path, host: str = "127.0.0.1") -> list[str]:
    return [
        *_python(),
        "bootstrap",
        "--host",
        host,
        "--port",
        "0",
        "--identity",
        str(run_dir / "keys" / "bootstrap.key"),
        "--status-interval-s",
        "30",
    ]


def read_initial_peers(boot: Child, run_dir: Path, timeout_s: float) -> str:
    """The `--initial-peers ...` line a starting bootstrap node prints first (stops it if none comes)."""
    stdout = boot.proc.stdout
    assert stdout is not None
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(stdout.readline().decode().strip()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not box or not box[0].startswith("--initial-peers"):
        boot.stop(timeout_s=5)
        raise RuntimeError(f"the bootstrap node did not start; see {run_dir / 'bootstrap.log'}")
    return box[0]


def start_bootstrap(run_dir: Path, timeout_s: float) -> tuple[Child, str]:
    boot = Child("bootstrap", bootstrap_argv(run_dir), run_dir / "bootstrap.log")
    return boot, read_initial_peers(boot, run_dir, timeout_s)


def peer_argv(
    opts: LocalOptions, i: int, initial_peers: str, threads: int, host: str = "127.0.0.1"
) -> list[str]:
    """`p2p-trainer join` for peer i: identity keys/peer{i}.key, run directory peer{i}/."""
    argv = [
        *_python(),
        "join",
        "--config",
        str(opts.config_path),
        *initial_peers.split(),
        "--identity",
        str(opts.run_dir / "keys" / f"peer{i}.key"),
        "--host",
        host,
        "--run-dir",
        str(opts.run_dir / f"peer{i}"),
        "--wait-for-peers",
        str(opts.peers),
        "--torch-threads",
        str(threads),
        "--data-key",
        f"peer{i}",  # the same streams as the in-process reference's peer i
    ]
    if opts.max_minutes:
        argv += ["--max-minutes", str(opts.max_minutes)]
    return argv


def thread_env(threads: int) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def start_peer(
    opts: LocalOptions, i: int, initial_peers: str, threads: int, extra: list[str] | None = None
) -> Child:
    argv = peer_argv(opts, i, initial_peers, threads) + (extra or [])
    return Child(f"peer{i}", argv, opts.run_dir / f"peer{i}" / "log.txt", thread_env(threads))


def peer_rows(run_dir: Path, peers: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(peers):
        recs = read_records(run_dir / f"peer{i}" / "metrics.jsonl")
        rounds = [r for r in recs if r.get("kind") == "round"]
        final = next((r for r in recs if r.get("kind") == "final"), None)
        last = rounds[-1] if rounds else {}
        last_ex = last.get("exchanges", [])
        rows.append(
            {
                "peer": f"peer{i}",
                "round": last.get("round", -1) + 1 if rounds else 0,
                "step": last.get("step", 0),
                "loss": last.get("train_loss"),
                "val_loss": final["val_loss"] if final else last.get("val_loss"),
                "tokens_per_s": last["tokens"] / last["time_s"] if rounds and last["time_s"] > 0 else 0.0,
                "last_exchange": ", ".join(
                    f"{e['tag']}:{'ok' if e['ok'] else 'FAILED'}({e['group_size']})" for e in last_ex
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
        recs = read_records(d / "metrics.jsonl")
        rounds = [r for r in recs if r.get("kind") == "round"]
        final = next((r for r in recs if r.get("kind") == "final"), {})
        compute = sum(r["compute_s"] for r in rounds)
        wall = sum(r["wall_s"] for r in rounds)
        exchanges = [e for r in rounds for e in r["exchanges"]]
        peers.append(
            {
                "peer": f"peer{i}",
                "rounds": len(rounds),
                "tokens": rounds[-1]["tokens"] if rounds else 0,
                "val_loss": final.get("val_loss"),
                "utilisation": compute / wall if wall else 0.0,
                "blocked_s": sum(r["blocked_s"] for r in rounds),
                "bytes_sent": sum(r["bytes_sent"] for r in rounds),
                "bytes_received": sum(r["bytes_received"] for r in rounds),
                "exchanges": len(exchanges),
                "failed_exchanges": sum(1 for e in exchanges if not e["ok"]),
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
        recs = [
            r for r in read_records(run_dir / f"peer{i}" / "metrics.jsonl") if r.get("val_loss") is not None
        ]
        if recs:
            ax.plot(
                [r["time_s"] for r in recs], [r["val_loss"] for r in recs], marker="o", ms=3, label=f"peer{i}"
            )
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("validation loss (nats/byte)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, out)


def run_local(opts: LocalOptions, show: bool = True) -> dict[str, Any]:
    opts.run_dir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    boot, initial = start_bootstrap(opts.run_dir, opts.startup_timeout_s)
    children: list[Child] = []
    try:
        children = [start_peer(opts, i, initial, opts.torch_threads) for i in range(opts.peers)]
        _watch(opts, children, stop, show)
    finally:
        for c in children:  # all at once: a peer waiting on an already-stopped partner would stall
            c.send(signal.SIGINT)
        for c in children:
            c.stop(timeout_s=60)
        boot.stop(timeout_s=15)
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
