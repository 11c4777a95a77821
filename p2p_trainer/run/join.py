"""A training peer in a real swarm (`p2p-trainer join`): DHT node, transport, view, training loop.

Order of business: enter the swarm (run definition checked), then resume from a checkpoint, or
download the current state from a live peer (late join), or start from the seed's weights; wait
for the expected peers; train round after round until the bound; leave cleanly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from p2p_trainer.config import RunConfig
from p2p_trainer.exchange.interface import Failed
from p2p_trainer.logs import CONTEXT
from p2p_trainer.net import records
from p2p_trainer.net.align import RoundAligner
from p2p_trainer.net.dht import DHTConfig
from p2p_trainer.net.health import PeerHealth
from p2p_trainer.net.network_exchange import NetworkExchange
from p2p_trainer.net.records import Heartbeat
from p2p_trainer.net.self_kill import SelfKill
from p2p_trainer.net.state_sync import (
    StateServer,
    catch_up_steps,
    donor_order,
    download_state,
    first_download,
    heartbeat_lag_rounds,
)
from p2p_trainer.net.swarm_entry import join_swarm
from p2p_trainer.net.swarm_view import SwarmView
from p2p_trainer.net.transport import Transport
from p2p_trainer.round_log import FinalRecord, RejoinRecord, ResumeRecord, StartRecord, read_log
from p2p_trainer.train.checkpoint import load_checkpoint, save_checkpoint
from p2p_trainer.train.data import load_corpus
from p2p_trainer.train.metrics import MetricsWriter, round_record
from p2p_trainer.train.model import build_model
from p2p_trainer.train.snapshots import save_snapshot
from p2p_trainer.train.trainer import Peer, RoundMetrics, adopt_state

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
    data_key: str | None = None
    """Seeds this peer's data stream; None uses the peer id (distinct per identity)."""
    swarm: str = "default"
    """Name of the swarm to join (several runs can share bootstrap nodes under different names)."""
    kill_self_at: tuple[str, int] | None = None
    """Test tool: (phase, round) at which this node SIGKILLs itself (`net/self_kill.py`)."""
    rejoin_lag_rounds: int = 3
    """A peer that merged with no one for this many rounds and is this many rounds off the swarm's
    (median) round, behind after a stall or ahead after training alone behind a cut link,
    downloads the swarm's state; 0 never does."""
    snapshot_every: int = 0
    """Save φ to run_dir/snapshots every this many rounds (0: never), for evaluation after the run."""


def _late_join(
    peer: Peer,
    view: SwarmView,
    transport: Transport,
    run_id: str,
    tokens_per_round: int,
    patience_s: float = 30.0,
    donor_wait_s: float = 0.0,
    on_download: Callable[[str, int], None] | None = None,
) -> bool:
    """Download (φ, m, round) from a live peer at the swarm's latest round; the next one if it fails.

    Joiners spread over the freshest donors (`donor_order`); a donor that dies or stalls mid-transfer
    fails within the stall timeout and the next donor is tried. Retried for `patience_s`, since a new
    node's p2p routing needs a few seconds to reach the others. With no donor in sight, a new swarm
    is assumed at once, unless `donor_wait_s` > 0 (a peer rejoining its swarm): it keeps looking.
    """
    deadline = time.monotonic() + patience_s
    donor_deadline = time.monotonic() + donor_wait_s
    attempt = 0
    while True:
        beats = view.heartbeats()
        logger.info("swarm on arrival: %s", ", ".join(f"{h.peer_id[-8:]}@r{h.round}" for h in beats))
        # heartbeats say the rounds per second (throughput / tokens per round) of their peers
        rounds_per_s = max((h.throughput_tokens_per_s for h in beats), default=0.0) / tokens_per_round
        slack = heartbeat_lag_rounds(rounds_per_s, 2 * view.period_s)
        donors = donor_order(transport.peer_id, [(h.peer_id, h.round) for h in beats], slack)
        if not donors and time.monotonic() >= donor_deadline:
            return False
        attempt += 1
        if donors and on_download is not None:
            on_download("download", attempt)  # fault injection (tests)
        got = first_download(
            donors, lambda d: download_state(transport, d, run_id, peer.state.anchor, timeout_s=120)
        )
        if not isinstance(got, list):
            state, donor = got
            skip = catch_up_steps(state, peer.cfg.outer.num_inner_steps, peer.timing.t_step_s)
            adopt_state(peer, state, skip)
            logger.info("late join: adopted round %d from %s, %d steps in", state.round, donor[-8:], skip)
            return True
        if donors and time.monotonic() > deadline:
            raise RuntimeError(f"no live peer could serve the swarm's state within {patience_s:.0f} s")
        time.sleep(2.0)


def rejoin_target(my_round: int, other_rounds: list[int], lag_rounds: int) -> int | None:
    """The swarm's round to rejoin, or None if this peer is within `lag_rounds` of it.

    The swarm's round is the (upper) median of all live peers' rounds, this one's included: the
    majority's. Groups meet only within one round, so a peer left behind (stalled, cut off) would
    otherwise average with nobody for the rest of the run, and a peer cut off alone races ahead
    (its rounds have no one to wait for) and must come back to the majority, not pull it along.
    """
    if lag_rounds <= 0 or not other_rounds:
        return None
    rounds = sorted([my_round, *other_rounds])
    target = rounds[len(rounds) // 2]
    if target - my_round >= lag_rounds:
        return target
    # Going back discards work, and heartbeats of a starved machine make others look behind:
    # only a peer far ahead (one that trained alone behind a cut link) goes back.
    return target if my_round - target >= 3 * lag_rounds else None


def alone_rounds(previous: int, m: RoundMetrics) -> int:
    """Consecutive rounds in which this peer met its groups late or not at all (rounds without
    exchanges do not count).

    Late: a partial merge whose other parts came back without this peer's values (`late_parts`),
    i.e. its group had moved on; a peer a part-round behind stays there, since every late round
    costs it the result waits. A partial merge because a partner died is not this peer's lag.
    Heartbeat rounds lag by up to a heartbeat period (many rounds when rounds are short), so a
    peer that still meets its groups must never act on them; one that keeps missing them may, and
    `rejoin_target` still requires the heartbeats to put it `lag_rounds` behind.
    """
    if not m.report.exchanges:
        return previous
    met = any(e.merged and e.late_parts == 0 for e in m.report.exchanges)
    return 0 if met else previous + 1


def estimated_round(beat: Heartbeat, now: float, tokens_per_round: int) -> int:
    """A peer's round now, from its heartbeat: the round it reported plus the rounds its reported
    throughput allows since then (heartbeats are up to a period old; rounds can be much shorter)."""
    rounds_since = max(0.0, now - beat.timestamp) * beat.throughput_tokens_per_s / max(1, tokens_per_round)
    return beat.round + int(rounds_since)


class Rejoin:
    """Brings a peer back to the swarm's round after `lag_rounds` rounds that merged with no one."""

    def __init__(
        self,
        peer: Peer,
        view: SwarmView,
        transport: Transport,
        run_id: str,
        lag_rounds: int,
        tokens_per_round: int,
    ) -> None:
        self.peer, self.view, self.transport, self.run_id = peer, view, transport, run_id
        self.lag_rounds, self.tokens_per_round = lag_rounds, tokens_per_round
        self.alone = 0

    def after_round(self, m: RoundMetrics) -> RejoinRecord | None:
        """Call after every round; returns a metrics record if the peer rejoined."""
        self.alone = alone_rounds(self.alone, m)
        if self.lag_rounds <= 0 or self.alone < self.lag_rounds:
            return None  # a peer that meets its groups never acts on (stale) heartbeat rounds
        left = self._rejoin()
        if left is None:
            return None
        self.alone = 0
        return RejoinRecord(
            from_round=left, to_round=self.peer.state.round, catch_up_steps=self.peer.skip_steps
        )

    def _rejoin(self) -> int | None:
        peer, now = self.peer, records.now()
        others = {
            h.peer_id: estimated_round(h, now, self.tokens_per_round)
            for h in self.view.heartbeats()
            if h.peer_id != self.transport.peer_id
        }
        target = rejoin_target(peer.state.round, list(others.values()), self.lag_rounds)
        if target is None:
            return None
        left = peer.state.round
        for donor in sorted(others, key=lambda p: (abs(others[p] - target), -others[p]))[:3]:
            got = download_state(self.transport, donor, self.run_id, peer.state.anchor, timeout_s=30)
            if isinstance(got, Failed):
                logger.warning("rejoin download: %s", got.reason.splitlines()[0])
                continue
            if (got.round - left) * (target - left) <= 0:
                # heartbeats over-estimated the donor: its state is not in the direction we meant to go
                logger.info(
                    "rejoin: donor %s is at round %d, not towards %d; kept own state",
                    donor[-8:],
                    got.round,
                    target,
                )
                continue
            skip = catch_up_steps(got, peer.cfg.outer.num_inner_steps, peer.timing.t_step_s)
            adopt_state(peer, got, skip)
            logger.info(
                "rejoined the swarm: round %d -> %d from %s, %d steps in", left, got.round, donor[-8:], skip
            )
            return left
        return None


class RegainSight:
    """A peer that lost sight of the swarm waits (once per loss, at most the heartbeat TTL) for its
    view to come back before training on alone.

    After a stall or a cut link the DHT routing is gone and the view empties; training alone then
    produces rounds that are discarded when the peer rejoins the majority (`Rejoin`), and short
    rounds can run the whole remaining schedule before the view refreshes. A last survivor pays
    one TTL once.
    """

    def __init__(self, view: SwarmView) -> None:
        self.view, self.waited = view, False

    def before_round(self) -> None:
        if not self.view.lost_sight():
            self.waited = False
            return
        if self.waited:
            return
        self.waited = True
        t0 = time.monotonic()
        live = self.view.wait_for(2, self.view.ttl_s)
        logger.info("lost sight of the swarm; waited %.1f s for it: %d live", time.monotonic() - t0, live)


def _training_peers(view: SwarmView, health: PeerHealth, period_s: float) -> Callable[[], list[str]]:
    """Live peers that do work (§6), for sizing this peer's share of a constant-work round.

    Left out: peers a failed send marked suspect (dead until their heartbeat expires), and peers
    still joining: reporting round 0 while this one has trained for longer than a few heartbeat
    periods (before that, round 0 is just the heartbeats' lag at the start of a swarm).
    """
    started = time.monotonic()

    def live() -> list[str]:
        settled = view.status.round > 0 and time.monotonic() - started > 3 * period_s
        suspects = health.suspects()
        return [
            h.peer_id for h in view.heartbeats() if h.peer_id not in suspects and (h.round > 0 or not settled)
        ]

    return live


def _skipped_s(peer: Peer) -> float:
    """How far into its round a peer that skipped steps to catch up already is, in seconds."""
    return peer.skip_steps * (peer.timing.t_step_s or 0.0)


def _trained_before(metrics_path: Path) -> bool:
    """This run directory holds rounds of an earlier life of this peer: it is rejoining its swarm."""
    return bool(read_log(metrics_path).rounds)


def run_peer(opts: JoinOptions, stop: threading.Event) -> int:
    cfg, run_id = opts.run, opts.run.run_id()
    # The swarm name scopes the DHT records; the run definition is then checked against the swarm's,
    # so a peer with a different model/method/data/seed is refused instead of forming its own swarm.
    node = join_swarm(opts.dht, run_name=opts.swarm, run_definition=cfg.run_definition(), stop=stop)
    transport = view = None
    rejoining = _trained_before(opts.run_dir / "metrics.jsonl")
    metrics = MetricsWriter(opts.run_dir / "metrics.jsonl")
    try:
        CONTEXT.peer = node.peer_id
        corpus = load_corpus(cfg.data, cfg.model.seq_len)
        n_floats = build_model(cfg.model, cfg.seed).num_params()
        transport = Transport(node.dht, max_payload_bytes=8 * n_floats + 1024)
        view = SwarmView(node, opts.swarm)
        tokens_per_round = max(
            cfg.outer.num_inner_steps * cfg.inner.grad_accum * cfg.data.batch_size * cfg.model.seq_len,
            cfg.outer.target_tokens_per_round,  # §6: a lone survivor may do the whole swarm's share
        )
        # §5: a weight is the tokens a peer processed since its last merge, at most one round's
        # worth here; 4x leaves room for survivors topping up their share when peers vanish
        # (constant work per round, §6). Anything above is more than a peer could have processed.
        view.hear_from(transport.heard_within)  # exchanges are evidence of life too (swarm_view.py)
        exchange = NetworkExchange(
            transport, view.live_peers, run_id, cfg.seed, max_weight=4.0 * tokens_per_round
        )
        peer = Peer(
            cfg,
            exchange,
            corpus,
            peer_key=opts.data_key or node.peer_id,
            device=opts.device,
            live_peers=_training_peers(view, exchange.health, view.period_s),
            self_id=node.peer_id,
        )
        if opts.kill_self_at is not None:
            exchange.fault_hook = SelfKill(*opts.kill_self_at)
            peer.on_phase.append(exchange.fault_hook)
        server = StateServer(transport, run_id, on_serve=exchange.fault_hook)
        ckpt = opts.run_dir / "checkpoint.safetensors"
        started = time.monotonic()
        metrics.write(StartRecord(node.peer_id, time.time(), run_id, cfg.outer.method))
        if opts.resume and ckpt.exists():
            state_hash = load_checkpoint(peer, ckpt)
            logger.info("resumed round %d (state %s)", peer.state.round, state_hash[:12])
            metrics.write(ResumeRecord(peer.state.round, state_hash))
            # a swarm restarted from checkpoints starts its next round together (blocking methods)
            view.wait_for(opts.wait_for_peers, opts.wait_timeout_s)
        elif not _late_join(
            peer,
            view,
            transport,
            run_id,
            tokens_per_round,
            donor_wait_s=opts.rejoin_wait_s if rejoining else 0,
            on_download=exchange.fault_hook,
        ):
            if rejoining and ckpt.exists():  # the whole swarm is gone: carry on from our own state
                load_checkpoint(peer, ckpt)
                logger.info("no live donor; resumed own round %d from the checkpoint", peer.state.round)
            else:
                live = view.wait_for(opts.wait_for_peers, opts.wait_timeout_s)
                logger.info("starting from the seed's weights with %d live peers", live)
        server.publish(peer.state, peer.timing.t_step_s, _skipped_s(peer))
        view.status.round = peer.state.round  # a resumed or late-joined peer can serve joiners at once
        deadline = started + 60 * opts.max_minutes if opts.max_minutes else float("inf")
        rejoin = Rejoin(peer, view, transport, run_id, opts.rejoin_lag_rounds, tokens_per_round)
        regain = RegainSight(view)
        aligned = cfg.outer.align_rounds and not cfg.outer.target_tokens_per_round  # §6 fixes round tokens
        aligner = RoundAligner(node.peer_id, cfg.outer.num_inner_steps) if aligned else None
        while peer.state.round < cfg.rounds and not stop.is_set() and time.monotonic() < deadline:
            regain.before_round()
            view.status.round, view.status.round_started = peer.state.round, records.now()
            if aligner is not None:
                late = aligner.steps_to_skip(
                    peer.state.round, view.status.round_started, view.heartbeats(), peer.timing.t_step_s
                )
                peer.skip_steps = max(peer.skip_steps, late)
            CONTEXT.round, CONTEXT.step = peer.state.round, peer.step
            m = peer.run_round()
            if aligner is not None:
                aligner.observe(m.wall_s)
            server.publish(peer.state, peer.timing.t_step_s)
            # the next round starts about now (the loop's top says exactly when)
            view.status.round, view.status.round_started = peer.state.round, records.now()
            view.status.tokens_processed = peer.tokens
            view.status.loss = m.train_loss
            view.status.throughput_tokens_per_s = tokens_per_round / max(1e-9, m.wall_s)
            metrics.write(round_record(node.peer_id, m, started))
            rejoined = rejoin.after_round(m)
            if rejoined is not None:
                metrics.write(rejoined)
                server.publish(peer.state, peer.timing.t_step_s, _skipped_s(peer))
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
            FinalRecord(
                peer=node.peer_id,
                round=peer.state.round,
                tokens=peer.tokens,
                val_loss=peer.evaluate(peer.state.anchor),
                time_s=time.monotonic() - started,
                stopped=stop.is_set(),
                state_hash=final_hash,
                step=peer.step,
            )
        )
        return 0
    finally:
        metrics.close()
        if view is not None:
            view.close()
        if transport is not None:
            transport.close()
        node.shutdown()
