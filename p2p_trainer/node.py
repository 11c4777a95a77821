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
from p2p_trainer.logs import CONTEXT
from p2p_trainer.metrics import MetricsWriter, read_records, round_record
from p2p_trainer.model import build_model
from p2p_trainer.net.dht import DHTConfig
from p2p_trainer.net.exchange import NetworkExchange
from p2p_trainer.net.join import join_swarm
from p2p_trainer.net.state_sync import StateServer, donor_order, download_state, first_download
from p2p_trainer.net.swarm_view import SwarmView
from p2p_trainer.net.transport import Transport
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
    rejoin_wait_s: float = 30.0
    """A peer restarted in a run directory it trained in before looks this long for a live donor of
    the swarm's state before it falls back to its own checkpoint (or, without one, the seed)."""
    device: str = "cpu"


def _late_join(
    peer: Peer,
    view: SwarmView,
    transport: Transport,
    run_id: str,
    patience_s: float = 30.0,
    donor_wait_s: float = 0.0,
) -> bool:
    """Download (φ, m, round) from a live peer at the swarm's latest round; the next one if it fails.

    Joiners spread over the freshest donors (`donor_order`); a donor that dies or stalls mid-transfer
    fails within the stall timeout and the next donor is tried. Retried for `patience_s`, since a new
    node's p2p routing needs a few seconds to reach the others. With no donor in sight, a new swarm
    is assumed at once, unless `donor_wait_s` > 0 (a peer rejoining its swarm): it keeps looking.
    """
    deadline = time.monotonic() + patience_s
    donor_deadline = time.monotonic() + donor_wait_s
    while True:
        beats = view.heartbeats()
        logger.info("swarm on arrival: %s", ", ".join(f"{h.peer_id[-8:]}@r{h.round}" for h in beats))
        donors = donor_order(transport.peer_id, [(h.peer_id, h.round) for h in beats])
        if not donors and time.monotonic() >= donor_deadline:
            return False
        got = first_download(
            donors, lambda d: download_state(transport, d, run_id, peer.state.anchor, timeout_s=120)
        )
        if not isinstance(got, list):
            state, donor = got
            adopt_state(peer, state)
            logger.info("late join: adopted round %d from %s", state.round, donor[-8:])
            return True
        if donors and time.monotonic() > deadline:
            raise RuntimeError(f"no live peer could serve the swarm's state within {patience_s:.0f} s")
        time.sleep(2.0)


def _trained_before(metrics_path: Path) -> bool:
    """This run directory holds rounds of an earlier life of this peer: it is rejoining its swarm."""
    return any(r.get("kind") == "round" for r in read_records(metrics_path))


def run_peer(opts: JoinOptions, stop: threading.Event) -> int:
    cfg, run_id = opts.run, opts.run.run_id()
    node = join_swarm(opts.dht, run_name=run_id, run_definition=cfg.run_definition(), stop=stop)
    transport = view = None
    rejoining = _trained_before(opts.run_dir / "metrics.jsonl")
    metrics = MetricsWriter(opts.run_dir / "metrics.jsonl")
    try:
        CONTEXT.peer = node.peer_id
        corpus = load_corpus(cfg.data, cfg.model.seq_len)
        n_floats = build_model(cfg.model, cfg.seed).num_params()
        transport = Transport(node.dht, max_payload_bytes=8 * n_floats + 1024)
        view = SwarmView(node, run_id)
        tokens_per_round = max(
            cfg.outer.num_inner_steps * cfg.inner.grad_accum * cfg.data.batch_size * cfg.model.seq_len,
            cfg.outer.target_tokens_per_round,  # §6: a lone survivor may do the whole swarm's share
        )
        exchange = NetworkExchange(
            transport, view.live_peers, run_id, cfg.seed, max_weight=4.0 * tokens_per_round
        )
        peer = Peer(
            cfg, exchange, corpus, peer_key=node.peer_id, device=opts.device, live_peers=view.live_peers
        )
        server = StateServer(transport, run_id)
        ckpt = opts.run_dir / "checkpoint.safetensors"
        started = time.monotonic()
        metrics.write({"kind": "start", "peer": node.peer_id, "unix_time": time.time(), "run_id": run_id})
        if opts.resume and ckpt.exists():
            state_hash = load_checkpoint(peer, ckpt)
            logger.info("resumed round %d (state %s)", peer.state.round, state_hash[:12])
            # a swarm restarted from checkpoints starts its next round together (blocking methods)
            view.wait_for(opts.wait_for_peers, opts.wait_timeout_s)
        elif not _late_join(
            peer, view, transport, run_id, donor_wait_s=opts.rejoin_wait_s if rejoining else 0
        ):
            if rejoining and ckpt.exists():  # the whole swarm is gone: carry on from our own state
                load_checkpoint(peer, ckpt)
                logger.info("no live donor; resumed own round %d from the checkpoint", peer.state.round)
            else:
                live = view.wait_for(opts.wait_for_peers, opts.wait_timeout_s)
                logger.info("starting from the seed's weights with %d live peers", live)
        server.publish(peer.state)
        view.status.round = peer.state.round  # a resumed or late-joined peer can serve joiners at once
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
