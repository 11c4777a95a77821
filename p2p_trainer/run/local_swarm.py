"""`p2p-trainer local --peers N`: a real swarm on loopback (one bootstrap node, N peer processes).

Shows live progress per peer, and at the end writes the run directory: per-peer metrics.jsonl
and checkpoints, summary.json, and a plot of validation loss over time. Ctrl-C stops every
process cleanly and still writes what was measured.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from p2p_trainer.algo.outer import consensus_distance
from p2p_trainer.config import LogConfig, OuterConfig, RunConfig
from p2p_trainer.processes import Child, wait_all
from p2p_trainer.round_log import ExchangeRecord, FinalRecord, RoundRecord, RunLog, read_log
from p2p_trainer.run.consensus import compare_peers, gain, mean_anchor
from p2p_trainer.run.final_agreement import BEFORE_FINAL_DIR
from p2p_trainer.run.launcher import (
    LocalOptions,
    LocalSwarm,
    check_dashboard_port,
    check_metrics_ports,
    local_options,
)
from p2p_trainer.run.progress_file import PROGRESS_FILE, peer_state, read_progress
from p2p_trainer.train.checkpoint import atomic_write_text, read_anchor
from p2p_trainer.train.data import check_corpus
from p2p_trainer.train.snapshots import list_snapshots, load_snapshot

logger = logging.getLogger(__name__)


def peer_rows(run_dir: Path, peers: int, exit_codes: Sequence[int | None] = ()) -> list[dict[str, Any]]:
    """The live table's rows, from each peer's metrics.jsonl and progress.json (`progress_file.py`);
    `exit_codes[i]`: peer i's exit status, None while it runs (all running where not given)."""
    rows = []
    for i in range(peers):
        peer_dir = run_dir / f"peer{i}"
        log = read_log(peer_dir / "metrics.jsonl")
        last, final = (log.rounds[-1] if log.rounds else None), log.final
        found = read_progress(peer_dir / PROGRESS_FILE)
        code = exit_codes[i] if i < len(exit_codes) else None
        rows.append(
            {
                "peer": f"peer{i}",
                "round": last.round + 1 if last else 0,
                "step": found[1].step if found and code is None else last.step if last else 0,
                "loss": last.train_loss if last else None,
                "val_loss": final.val_loss if final else last.val_loss if last else None,
                "tokens_per_s": last.tokens / last.time_s if last and last.time_s > 0 else 0.0,
                "last_exchange": ", ".join(_outcome(e) for e in (last.exchanges if last else ())),
                "done": final is not None,
                "state": peer_state(found, final, code),
            }
        )
    return rows


def _outcome(e: ExchangeRecord) -> str:
    """One exchange in the live table: merged fully, in part (and who was late), or failed."""
    if not e.ok:
        return f"{e.tag}:FAILED"
    if e.own_parts or e.late_parts or e.left_out:
        return f"{e.tag}:partial({e.group_size}, late: {','.join(e.left_out) or 'self'})"
    return f"{e.tag}:ok({e.group_size})"


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
            r["state"],
        )
    return table


def _own_loss(final: FinalRecord | None) -> float | None:
    """The loss of the peer's own model: before the final agreement where one ran."""
    if final is None:
        return None
    return final.own_val_loss if final.own_val_loss is not None else final.val_loss


def _agreement(final: FinalRecord | None) -> str | None:
    """The final agreement's outcome: "ok(<group size>)", "kept own (...)" where the average was
    worse than the peer's own model, "failed: <why>", or None where none ran."""
    rec = final.agreement if final is not None else None
    if final is None or rec is None:
        return None
    if rec.merged and final.kept_own:
        return f"kept own (the average of {rec.group_size} was worse)"
    if rec.merged:
        return f"ok({rec.group_size})"
    return f"failed: {rec.reason or 'averaged with no one'}"


def _peer_entry(name: str, log: RunLog) -> dict[str, Any]:
    rounds, final = log.rounds, log.final
    compute = sum(r.compute_s for r in rounds)
    wall = sum(r.wall_s for r in rounds)
    exchanges = [e for r in rounds for e in r.exchanges]
    skipped = sum(r.skipped_steps for r in rounds)
    # steps left out to line a round up with the others (or to catch up after a join) are compute
    # the peer could have done: they count as lost time, at the peer's own step time
    steps = rounds[-1].step - rounds[0].step if len(rounds) > 1 else 0
    step_s = sum(r.compute_s for r in rounds[1:]) / steps if steps > 0 else 0.0
    return {
        "peer": name,
        "rounds": len(rounds),
        "tokens": rounds[-1].tokens if rounds else 0,
        "val_loss": final.val_loss if final else None,
        "own_val_loss": _own_loss(final),
        "final_agreement": _agreement(final),
        "utilisation": compute / (wall + skipped * step_s) if wall else 0.0,
        "skipped_steps": skipped,
        "blocked_s": sum(r.blocked_s for r in rounds),
        "bytes_sent": sum(r.bytes_sent for r in rounds),
        "bytes_received": sum(r.bytes_received for r in rounds),
        "exchanges": len(exchanges),
        "failed_exchanges": sum(1 for e in exchanges if not e.ok),
    }


def own_anchor(peer_dir: Path, final: FinalRecord | None) -> list[torch.Tensor] | None:
    """A peer's own φ before the final agreement: the copy its finish saved when the agreement
    changed φ (this life's: same round and step), else its final checkpoint's."""
    if final is not None and final.agreement is not None and final.agreement.merged:
        snaps = list_snapshots(peer_dir / BEFORE_FINAL_DIR)
        if snaps and (snaps[-1].round, snaps[-1].step) == (final.round, final.step):
            return load_snapshot(snaps[-1].path)
    ckpt = peer_dir / "checkpoint.safetensors"
    return read_anchor(ckpt) if ckpt.exists() else None


def evaluate_anchor(cfg: RunConfig, anchor: list[torch.Tensor]) -> float:
    """Validation loss of a model holding `anchor` (the fixed batches every peer evaluates on)."""
    from p2p_trainer.train.data import load_corpus, validation_batches
    from p2p_trainer.train.model import build_model

    model = build_model(cfg.model, cfg.seed)
    with torch.no_grad():
        for p, v in zip(model.parameters(), anchor, strict=True):
            p.copy_(v)
    corpus = load_corpus(cfg.data, cfg.model.seq_len)
    batches = validation_batches(corpus, cfg.model.seq_len, cfg.data.batch_size, cfg.data.val_batches)
    model.eval()
    with torch.no_grad():
        return sum(float(model(x, y)) for x, y in batches) / len(batches)


def summarize(opts: LocalOptions, wall_s: float, interrupted: bool) -> dict[str, Any]:
    """Per-peer figures; the consensus model (mean of the final anchors) against the best and the
    mean single peer (their own models, before the final agreement) and the peers' spread."""
    peers: list[dict[str, Any]] = []
    finals, owns = [], []
    for i in range(opts.peers):
        d = opts.run_dir / f"peer{i}"
        log = read_log(d / "metrics.jsonl")
        peers.append(_peer_entry(f"peer{i}", log))
        if (d / "checkpoint.safetensors").exists():
            finals.append(read_anchor(d / "checkpoint.safetensors"))
            owns.append(own_anchor(d, log.final) or finals[-1])
    consensus = evaluate_anchor(opts.run, mean_anchor(finals)) if finals else None
    single = compare_peers({p["peer"]: p["own_val_loss"] for p in peers})
    return {
        "method": opts.run.outer.method,
        "peers": opts.peers,
        "wall_s": wall_s,
        "interrupted": interrupted,
        "averaged_model_val_loss": consensus,
        "consensus_val_loss": consensus,
        "best_peer": single.best_peer,
        "best_peer_val_loss": single.best_peer_val_loss,
        "mean_peer_val_loss": single.mean_peer_val_loss,
        "consensus_distance": consensus_distance(owns) if owns else None,
        "final_distance": consensus_distance(finals) if finals else None,
        "agreed_peers": sum(1 for p in peers if (p["final_agreement"] or "").startswith("ok")),
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
    """Run the swarm until its peers finish, the time bound passes or `stop` is set; then, with
    `opts.compare_independent` (and no stop), the independent peers. Returns the summary.

    Without `stop`, SIGINT and SIGTERM set one of its own for the duration (a caller that passes
    `stop` owns the signal handlers, e.g. to know which signal ended the run). Bad data raises
    `DataError` before any process starts.
    """
    check_corpus(opts.run)
    opts.run_dir.mkdir(parents=True, exist_ok=True)
    previous = {}
    if stop is None:
        own = stop = threading.Event()
        previous = {s: signal.signal(s, lambda *_: own.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        summary = _run_swarm(opts, show, stop)
        if opts.compare_independent and not stop.is_set():
            alone = _run_swarm(independent_options(opts), show, stop)
            summary = with_independent(summary, alone, opts.run_dir / INDEPENDENT_DIR)
            atomic_write_text(opts.run_dir / "summary.json", json.dumps(summary, indent=2))
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return summary


INDEPENDENT_DIR = "independent"
"""Under a `local --compare-independent` run directory: the independent peers' run."""


def independent_options(opts: LocalOptions) -> LocalOptions:
    """The same peers, rounds, time bound, data streams (peer i reads stream "peer{i}") and work
    per round as `opts`, each training alone."""
    outer = OuterConfig.for_method(
        "independent",
        num_inner_steps=opts.run.outer.num_inner_steps,
        target_tokens_per_round=opts.run.outer.target_tokens_per_round,
    )
    cfg = dataclasses.replace(opts.run, outer=outer)
    board = opts.run.log.tensorboard_dir
    if board:  # beside the swarm's curves, not over them
        cfg = dataclasses.replace(cfg, log=LogConfig(str(Path(board) / INDEPENDENT_DIR)))
    alone = local_options(
        opts.run_dir / INDEPENDENT_DIR, cfg, opts.peers, opts.torch_threads, opts.max_minutes
    )
    return dataclasses.replace(alone, startup_timeout_s=opts.startup_timeout_s)


def with_independent(swarm: dict[str, Any], alone: dict[str, Any], alone_dir: Path) -> dict[str, Any]:
    """The swarm's summary with the independent run's figures and the gain beside it."""
    return {
        **swarm,
        "independent": {
            "run_dir": str(alone_dir),
            "mean_peer_val_loss": alone["mean_peer_val_loss"],
            "best_peer_val_loss": alone["best_peer_val_loss"],
            "averaged_model_val_loss": alone["consensus_val_loss"],
            "tokens": alone["tokens"],
            "wall_s": alone["wall_s"],
            "interrupted": alone["interrupted"],
        },
        "gain_vs_independent": gain(alone["mean_peer_val_loss"], swarm["consensus_val_loss"]),
    }


def _run_swarm(opts: LocalOptions, show: bool, stop: threading.Event) -> dict[str, Any]:
    opts.run_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    check_metrics_ports(opts)
    check_dashboard_port(opts)
    swarm = LocalSwarm(opts)
    try:
        swarm.start_bootstrap()
        peers = [swarm.start_peer(i) for i in range(opts.peers)]
        if opts.dashboard_port is not None:
            logger.info("dashboard at %s", swarm.start_dashboard(opts.dashboard_port))
        _watch(opts, peers, stop, show)
    finally:
        swarm.stop(peer_timeout_s=60, boot_timeout_s=15)
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

    def rows() -> list[dict[str, Any]]:
        return peer_rows(opts.run_dir, opts.peers, [c.proc.poll() for c in children])

    with Live(render(rows()), refresh_per_second=1) as live:
        while (
            not stop.is_set() and any([c.alive() for c in children]) and time.monotonic() - started < limit_s
        ):
            time.sleep(1.0)
            live.update(render(rows()))
        live.update(render(rows()))  # the last word of each peer: done, stopped or failed
