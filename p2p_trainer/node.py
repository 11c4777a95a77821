"""A training peer in a real swarm (`p2p-trainer join`): DHT node, transport, view, training loop.

Order of business: enter the swarm (run definition checked), then resume from a checkpoint, or
download the current state from a live peer (late join), or start from the seed's weights; wait
for the expected peers; train round after round until the bound; leave cleanly.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from p2p_trainer.checkpoint import load_checkpoint, save_checkpoint
from p2p_trainer.config import RunConfig
from p2p_trainer.data import load_corpus
from p2p_trainer.exchange import Failed
from p2p_trainer.logs import CONTEXT
from p2p_trainer.metrics import MetricsWriter, round_record
from p2p_trainer.model import build_model
from p2p_trainer.net.dht import DHTConfig
from p2p_trainer.net.exchange import NetworkExchange
from p2p_trainer.net.join import join_swarm
from p2p_trainer.net.state_sync import StateServer, download_state
from p2p_trainer.net.swarm_view import SwarmView
from p2p_trainer.net.transport import Transport
from p2p_trainer.snapshots import save_snapshot
from p2p_trainer.trainer import Peer, adopt_state

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JoinOptions:
    run: RunConfig
    dht: DHTConfig
    run_dir: Path
    """Where this peer writes metrics.jsonl and its checkpoints."""
    wait_for_peers: int = 1
    """Wait (at most `wait_timeout_s`) until this many peers are live before the first round."""
    wait_timeout_s: float = 60.0
    max_minutes: float | None = None
    """Stop after this much wall time even if rounds remain."""
    checkpoint_every: int = 10
    """Checkpoint every this many rounds (and always at the end and on SIGINT/SIGTERM)."""
    resume: bool = False
    """Continue from run_dir/checkpoint.safetensors if it exists."""
    device: str = "cpu"
    snapshot_every: int = 0
    """Save φ to run_dir/snapshots every this many rounds (0: never), for evaluation after the run."""


def _late_join(
    peer: Peer, view: SwarmView, transport: Transport, run_id: str, patience_s: float = 30.0
) -> bool:
    """Download (φ, m, round) from the most advanced live peer; try the next one if a donor fails.

    Retried for `patience_s`, since a new node's p2p routing needs a few seconds to reach the others.
    """
    deadline = time.monotonic() + patience_s
    while True:
        beats = view.heartbeats()
        logger.info("swarm on arrival: %s", ", ".join(f"{h.peer_id[-8:]}@r{h.round}" for h in beats))
        donors = sorted(
            (h for h in beats if h.peer_id != transport.peer_id and h.round > 0), key=lambda h: -h.round
        )
        if not donors:
            return False
        for donor in donors:
            got = download_state(transport, donor.peer_id, run_id, peer.state.anchor, timeout_s=120)
            if isinstance(got, Failed):
                logger.warning("state download: %s; trying the next donor", got.reason.splitlines()[0])
                continue
            adopt_state(peer, got)
            logger.info("late join: adopted round %d from %s", got.round, donor.peer_id[-8:])
            return True
        if time.monotonic() > deadline:
            raise RuntimeError(f"no live peer could serve the swarm's state within {patience_s:.0f} s")
        time.sleep(2.0)


def run_peer(opts: JoinOptions, stop: threading.Event) -> int:
    cfg, run_id = opts.run, opts.run.run_id()
    node = join_swarm(opts.dht, run_name=run_id, run_definition=cfg.run_definition(), stop=stop)
    transport = view = None
    metrics = MetricsWriter(opts.run_dir / "metrics.jsonl")
    try:
        CONTEXT.peer = node.peer_id
        corpus = load_corpus(cfg.data, cfg.model.seq_len)
        n_floats = build_model(cfg.model, cfg.seed).num_params()
        transport = Transport(node.dht, max_payload_bytes=8 * n_floats + 1024)
        view = SwarmView(node, run_id)
        tokens_per_round = (
            cfg.outer.num_inner_steps * cfg.inner.grad_accum * cfg.data.batch_size * cfg.model.seq_len
        )
        exchange = NetworkExchange(
            transport, view.live_peers, run_id, cfg.seed, max_weight=4.0 * tokens_per_round
        )
        peer = Peer(cfg, exchange, corpus, peer_key=node.peer_id, device=opts.device)
        server = StateServer(transport, run_id)
        ckpt = opts.run_dir / "checkpoint.safetensors"
        started = time.monotonic()
        metrics.write({"kind": "start", "peer": node.peer_id, "unix_time": time.time(), "run_id": run_id})
        if opts.resume and ckpt.exists():
            logger.info("resumed round %d (state %s)", peer.state.round, load_checkpoint(peer, ckpt)[:12])
        elif not _late_join(peer, view, transport, run_id):
            live = view.wait_for(opts.wait_for_peers, opts.wait_timeout_s)
            logger.info("starting from the seed's weights with %d live peers", live)
        server.publish(peer.state)
        deadline = started + 60 * opts.max_minutes if opts.max_minutes else float("inf")
        while peer.state.round < cfg.rounds and not stop.is_set() and time.monotonic() < deadline:
            CONTEXT.round, CONTEXT.step = peer.state.round, peer.step
            m = peer.run_round()
            server.publish(peer.state)
            view.status.round, view.status.tokens_processed = peer.state.round, peer.tokens
            view.status.loss, view.status.throughput_tokens_per_s = (
                m.train_loss,
                m.tokens / max(1e-9, m.wall_s),
            )
            metrics.write(round_record(node.peer_id, m, started))
            if opts.snapshot_every and peer.state.round % opts.snapshot_every == 0:
                save_snapshot(
                    opts.run_dir / "snapshots",
                    peer.state.anchor,
                    peer.state.round,
                    peer.step,
                    peer.tokens,
                    time.monotonic() - started,
                )
            if peer.state.round % opts.checkpoint_every == 0:
                save_checkpoint(peer, ckpt)
        final_hash = save_checkpoint(peer, ckpt)
        metrics.write(
            {
                "kind": "final",
                "peer": node.peer_id,
                "round": peer.state.round,
                "tokens": peer.tokens,
                "val_loss": peer.evaluate(peer.state.anchor),
                "time_s": time.monotonic() - started,
                "state_hash": final_hash,
                "stopped": stop.is_set(),
            }
        )
        return 0
    finally:
        metrics.close()
        if view is not None:
            view.close()
        if transport is not None:
            transport.close()
        node.shutdown()
