"""A training peer in a real swarm (`p2p-trainer join`), in four stages.

`start`: the DHT node is in the swarm (run definition checked); wire transport, view, exchange,
peer and state server. `enter`: resume from a checkpoint, or download the current state from a
live peer (late join, rejoin), or start from the seed's weights. `train_rounds`: round after
round until the rounds are done, the time bound passes or a stop is requested (both also between
inner steps). `finish`: final checkpoint, evaluation and record; then the peer leaves cleanly.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import torch

from p2p_trainer.config import RunConfig
from p2p_trainer.fault_points import FaultInjector, FaultPoint
from p2p_trainer.logs import CONTEXT
from p2p_trainer.net import behind_nat, records
from p2p_trainer.net.admission import Admission, InvitationError, check_entry
from p2p_trainer.net.align import RoundAligner
from p2p_trainer.net.data_plane import start_data_plane
from p2p_trainer.net.dht import DHTConfig, NetNode
from p2p_trainer.net.entry import ENTRY_PERIODS, TimeBound
from p2p_trainer.net.envelope import READ_DROPS, DropTally
from p2p_trainer.net.exchange_tap import TransportCounters, open_tap
from p2p_trainer.net.health import PeerHealth
from p2p_trainer.net.network_exchange import NetworkExchange
from p2p_trainer.net.serve_limits import ServeLimits
from p2p_trainer.net.state_sync import StateServer
from p2p_trainer.net.swarm_entry import join_swarm
from p2p_trainer.net.swarm_view import PeerStatus, SwarmView, at_round_zero
from p2p_trainer.net.transport import Transport
from p2p_trainer.round_log import DropCount, FinalRecord, ResumeRecord, StartRecord
from p2p_trainer.run.entry_paths import RegainSight, Rejoin, late_join, skipped_s, trained_before
from p2p_trainer.run.final_agreement import (
    BEFORE_FINAL_DIR,
    agree,
    final_request,
    keep_the_better,
    stopped_early_weight,
    wants_final_agreement,
)
from p2p_trainer.run.progress_file import PROGRESS_FILE, Progress, ProgressFile
from p2p_trainer.run.round_lines import ObservedWriter, RecordObserver, log_record, round_outcome
from p2p_trainer.run.tensorboard_scalars import TensorBoardScalars
from p2p_trainer.train.checkpoint import load_checkpoint, save_checkpoint
from p2p_trainer.train.data import check_corpus, load_corpus
from p2p_trainer.train.metrics import MetricsWriter, round_record
from p2p_trainer.train.snapshots import save_snapshot
from p2p_trainer.train.trainer import Peer, RoundMetrics
from p2p_trainer.train.workload import Workload, language_model

if TYPE_CHECKING:
    from p2p_trainer.run.peer_metrics import PeerMetrics

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JoinOptions:
    """What `p2p-trainer join` asked for."""

    run: RunConfig
    """The run definition; the swarm refuses a peer whose definition differs from its own."""
    dht: DHTConfig
    """How to start this peer's DHT node (identity, addresses, initial peers)."""
    run_dir: Path
    """Where this peer writes metrics.jsonl and its checkpoints."""
    wait_for_peers: int = 1
    """Wait (at most `wait_timeout_s`) until this many peers are live before the first round."""
    wait_timeout_s: float = 60.0
    """Longest wait for `wait_for_peers`; then training starts anyway."""
    max_minutes: float | None = None
    """Stop after this much wall time even if rounds remain (checked between inner steps)."""
    checkpoint_every: int = 10
    """Checkpoint every this many rounds (and always at the end and on SIGINT/SIGTERM); 0: never
    (a workload of one's own, whose model a checkpoint's description cannot name)."""
    resume: bool = False
    """Continue from run_dir/checkpoint.safetensors if it exists."""
    rejoin_wait_s: float = 30.0
    """A peer restarted in a run directory it trained in before looks this long for a live donor of
    the swarm's state before it falls back to its own checkpoint (or, without one, the seed)."""
    device: str = "cpu"
    """Torch device to train on."""
    data_key: str | None = None
    """Seeds this peer's data stream; None uses the peer id (distinct per identity)."""
    swarm: str = "default"
    """Name of the swarm to join (several runs can share bootstrap nodes under different names)."""
    kill_self_at: tuple[FaultPoint, int] | None = None
    """Test tool: (fault point, round) at which this node SIGKILLs itself (`fault_points.py`)."""
    rejoin_lag_rounds: int = 3
    """A peer that merged with no one for this many rounds and is this many rounds off the swarm's
    (median) round, behind after a stall or ahead after training alone behind a cut link,
    downloads the swarm's state; 0 never does."""
    snapshot_every: int = 0
    """Save φ to run_dir/snapshots every this many rounds (0: never), for evaluation after the run."""
    record_exchanges: Path | None = None
    """Test tool: write every exchange's contribution and result here (`net/exchange_tap.py`)."""
    invitation: str = ""
    """This peer's invitation (`p2p-trainer invite`) to a swarm with `admission = "invitations"`."""
    monitor: PeerMetrics | None = None
    """The Prometheus endpoint (`--metrics-port`), already listening; told every record."""
    relay: str = "auto"
    """`--relay`: "auto" reaches peers behind NAT through the bootstrap nodes' relay and, behind
    NAT itself, keeps connections to the peers it can dial (`net/behind_nat.py`); "off": neither."""


def payload_limit(n_floats: int) -> int:
    """The largest exchange payload a peer training a model of `n_floats` values takes
    (`Transport.max_payload_bytes`): what its mailbox quota is counted in."""
    return 8 * n_floats + 1024


def _training_peers(view: SwarmView, health: PeerHealth, period_s: float) -> Callable[[], list[str]]:
    """Live peers that do work (§6), for sizing this peer's share of a constant-work round.

    Left out: peers a failed send (here or at a peer whose heartbeat says so) marked suspect, peers
    still joining: reporting round 0 (`at_round_zero`) while this one has trained for longer than a
    few heartbeat periods (before that, round 0 is just the heartbeats' lag at the start of a
    swarm), and newcomers before their entry round (`entry.py`): no group takes their work. The
    clock starts at the first call, i.e. when training starts: the wait for the other peers and a
    late join's download come before it and say nothing about the heartbeats' lag.
    """
    started: list[float] = []

    def live() -> list[str]:
        if not started:
            started.append(time.monotonic())
        settled = view.status.round > 0 and time.monotonic() - started[0] > 3 * period_s
        beats = view.heartbeats()
        left_out = health.suspects() | view.reported_dead(beats)
        if settled:
            left_out |= at_round_zero(beats, records.now(), period_s)
        left_out |= view.outside_groups(view.status.round, beats) - {view.node.peer_id}
        return [h.peer_id for h in beats if h.peer_id not in left_out]

    return live


def run_peer(opts: JoinOptions, stop: threading.Event) -> int:
    """Run one peer until its rounds are done, `opts.max_minutes` pass or `stop` is set; returns 0."""
    check_corpus(opts.run)  # bad data fails here, before the DHT node starts
    progress = ProgressFile(opts.run_dir / PROGRESS_FILE)  # `local`'s table reads the phases
    progress.phase("starting")
    # The swarm name scopes the DHT records; the run definition is then checked against the swarm's,
    # so a peer with a different model/method/data/seed is refused instead of forming its own swarm.
    node = join_swarm(
        opts.dht,
        run_name=opts.swarm,
        run_definition=opts.run.run_definition(),
        stop=stop,
        definition_ttl_s=opts.run.network.run_definition_ttl_s,
        check_self=lambda node: check_entry(Admission(opts.run.security, opts.swarm), node, opts.invitation),
    )
    with contextlib.ExitStack() as leave:  # closes what the stages opened, in reverse, however they end
        leave.callback(node.shutdown)
        leave.callback(progress.close)
        rejoining = trained_before(opts.run_dir / "metrics.jsonl")
        observers: list[RecordObserver] = [log_record]
        if opts.monitor is not None:
            observers.append(opts.monitor.observe)
        if opts.run.log.tensorboard_dir:
            scalars = TensorBoardScalars(Path(opts.run.log.tensorboard_dir))
            leave.callback(scalars.close)  # after the metrics writer's close: the last record is in
            observers.append(scalars.observe)
        metrics = ObservedWriter(opts.run_dir / "metrics.jsonl", observers)
        leave.callback(metrics.close)
        joined = start(opts, node, metrics, leave)
        progress.phase("waiting-for-peers")
        enter(joined, rejoining)
        progress.follow(lambda: _progress(joined.peer))
        progress.phase("training")
        deadline = joined.started + 60 * opts.max_minutes if opts.max_minutes else float("inf")
        bound = TimeBound(deadline, ENTRY_PERIODS * joined.view.period_s)
        train_rounds(joined, lambda: stop.is_set() or time_is_up(joined, bound))
        if joined.view.refused_self is not None:  # learnt in the last round: no final agreement
            leave_refused(joined)
        progress.phase("stopping")
        finish(joined, stopped=stop.is_set(), stop_requested=stop.is_set)
        progress.phase("done")
    return 0


def time_is_up(j: Joined, bound: TimeBound) -> bool:
    """Whether the peer stops for its time bound now; names the round it leaves the groups at,
    ahead, once the bound is near (`entry.py`). Asked between inner steps."""
    peer, now = j.peer, time.monotonic()
    h = peer.cfg.outer.num_inner_steps
    remaining_s = (h - peer.round_step) * (peer.timing.t_step_s or 0.0)  # to this round's exchange
    leaves = bound.leave_round(now, peer.state.round, remaining_s, j.view.round_s())
    if leaves is not None:
        # a leave at round 0 reads as none: the others then wait for this peer in round 0 only
        j.view.leave_groups_at(leaves)
        left_s = bound.deadline - now
        when = f"in {left_s:.1f} s" if left_s >= 0 else f"passed {-left_s:.1f} s ago (rounds ran slow)"
        logger.info(
            "time bound %s: leaving the swarm's groups at round %d (now in round %d), so the "
            "others' views learn of it first",
            when,
            leaves,
            peer.state.round,
        )
    return bound.over(peer.state.round)


def _progress(peer: Peer) -> Progress:
    return Progress(peer.state.round, peer.round_step, peer.cfg.outer.num_inner_steps, peer.step)


@dataclass
class Joined:
    """A peer wired into its swarm: what `start` built and the later stages use."""

    opts: JoinOptions
    node: NetNode
    transport: Transport
    view: SwarmView
    peer: Peer
    server: StateServer
    """Serves this peer's state to joiners."""
    faults: FaultInjector
    metrics: MetricsWriter
    tokens_per_round: int
    """One round's tokens: one peer's, or the swarm's when a lone survivor does its share (§6)."""
    started: float
    """time.monotonic() once wired: the origin of the time bound and of the records' times."""

    @property
    def ckpt(self) -> Path:
        return self.opts.run_dir / "checkpoint.safetensors"


def start(
    opts: JoinOptions,
    node: NetNode,
    metrics: MetricsWriter,
    leave: contextlib.ExitStack,
    workload: Workload | None = None,
) -> Joined:
    """Wire transport, swarm view, exchange, peer and state server onto the DHT node. The peer
    trains `workload`, by default the config's model on the config's corpus."""
    cfg, run_id = opts.run, opts.run.run_id()
    CONTEXT.peer = node.peer_id
    if workload is None:
        corpus = load_corpus(cfg.data, cfg.model.seq_len)
        workload = language_model(cfg, corpus, opts.data_key or node.peer_id)
    n_floats = sum(p.numel() for p in workload.model.parameters())
    transport = Transport(
        node.dht, max_payload_bytes=payload_limit(n_floats), security=cfg.security, signer=node.signer
    )
    leave.callback(transport.close)
    net = opts.run.network
    data_address = ""
    if net.data_plane == "direct":
        # listening before the first heartbeat, which then carries the address; until the view
        # exists, no direct connection is taken (a stream would be held for the view the same way)
        if cfg.security.defences:
            transport.accept_from = lambda _peer: False
        data_address = start_data_plane(node, transport, net.data_port)
    view = SwarmView(
        node,
        opts.swarm,
        net.view_period_s,
        net.heartbeat_ttl_s,
        cfg.security,
        opts.invitation,
        data_address,
        last_round=cfg.rounds,
    )
    leave.callback(view.close)
    nat = behind_nat.set_up(opts.relay, node, transport, view.live_peers)
    leave.callback(nat.close)
    view.status.reachability = nat.reachability.verdict  # `status` shows what the check found
    view.status.round_steps = cfg.outer.num_inner_steps
    tokens_per_round = max(
        cfg.outer.num_inner_steps * cfg.inner.grad_accum * workload.tokens_per_batch,
        cfg.outer.target_tokens_per_round,  # §6: a lone survivor may do the whole swarm's share
    )
    # §5: a weight is the tokens behind a contribution, one round's
    # worth here; 4x leaves room for survivors topping up their share when peers vanish
    # (constant work per round, §6). Anything above is more than a peer could have processed.
    view.hear_from(transport.heard_within)  # exchanges are evidence of life too (swarm_view.py)
    view.probe_with(transport.probe, transport.submit, transport.hellos_within)  # phantoms stay out
    transport.accept_from = lambda peer: peer in view.live_peers()  # nobody enters the view by a message
    if net.data_plane == "direct":
        transport.direct_address = view.data_address
    faults = FaultInjector(opts.kill_self_at)
    tap = open_tap(opts.record_exchanges, node.peer_id)
    leave.callback(lambda: tap.close(TransportCounters.of(transport)))  # before the transport closes
    exchange = NetworkExchange(
        transport,
        view.live_peers,
        run_id,
        cfg.seed,
        max_weight=4.0 * tokens_per_round,
        faults=faults,
        tap=tap,
        security=cfg.security,
        out_of_step=view.out_of_step,
        outside_groups=view.outside_groups,
    )
    view.share_suspects(exchange.health.suspects)  # a death reaches every view in one period
    if cfg.security.defences:  # a repeat offender is voted out of every view's groups (exclusion.py)
        exchange.penalties.listen(view.vote_out)
    if opts.monitor is not None:
        opts.monitor.watch(node, view, transport)
    peer = Peer(
        cfg,
        exchange,
        device=opts.device,
        live_peers=_training_peers(view, exchange.health, view.period_s),
        self_id=node.peer_id,
        faults=faults,
        workload=workload,
    )
    limits = None
    if cfg.security.defences:
        limits = ServeLimits(cfg.security.state_serves_per_minute, cfg.security.state_serves_concurrent)
    view.sample_progress(lambda status: _sample_progress(status, peer, transport))
    server = StateServer(transport, run_id, faults, limits)
    if not view.admission.open:  # the view holds only admitted peers' heartbeats (a joiner's too)
        server.admits = lambda sender: any(h.peer_id == sender for h in view.heartbeats())
    joined = Joined(
        opts, node, transport, view, peer, server, faults, metrics, tokens_per_round, time.monotonic()
    )
    metrics.write(StartRecord(node.peer_id, time.time(), run_id, cfg.outer.method))
    return joined


def _sample_progress(status: PeerStatus, peer: Peer, transport: Transport) -> None:
    """The heartbeat's live figures (read by the view's thread: plain ints, no lock needed)."""
    status.step, status.round_step = peer.step, peer.round_step
    status.bytes_sent, status.bytes_received = transport.bytes_sent, transport.bytes_received


def enter(j: Joined, rejoining: bool) -> None:
    """Resume from the checkpoint (`--resume`), or download the swarm's state (late join; a peer
    `rejoining` its swarm looks longer for a donor), or, with no donor in sight, carry on from its
    own checkpoint (rejoining) or start from the seed's weights. Then serve the state to joiners."""
    opts, peer, view = j.opts, j.peer, j.view
    if opts.resume and j.ckpt.exists():
        state_hash = load_checkpoint(peer, j.ckpt)
        logger.info("resumed round %d (state %s)", peer.state.round, state_hash[:12])
        j.metrics.write(ResumeRecord(peer.state.round, state_hash))
        # a swarm restarted from checkpoints starts its next round together (blocking methods)
        view.wait_for(opts.wait_for_peers, opts.wait_timeout_s)
    elif not late_join(
        peer,
        view,
        j.transport,
        opts.run.run_id(),
        j.tokens_per_round,
        donor_wait_s=opts.rejoin_wait_s if rejoining else 0,
        faults=j.faults,
    ):
        if rejoining and j.ckpt.exists():  # the whole swarm is gone: carry on from our own state
            load_checkpoint(peer, j.ckpt)
            logger.info("no live donor; resumed own round %d from the checkpoint", peer.state.round)
        else:
            live = view.wait_for(opts.wait_for_peers, opts.wait_timeout_s, count_left=True)
            logger.info("starting from the seed's weights with %d live peers", live)
    j.server.publish(peer.state, peer.timing.t_step_s, skipped_s(peer))
    view.status.round = peer.state.round  # a resumed or late-joined peer can serve joiners at once


def train_rounds(j: Joined, should_stop: Callable[[], bool]) -> None:
    """Rounds until the run's rounds are done or `should_stop` (a stop request, the time bound).

    `should_stop` is also asked between inner steps: a round it cuts short ends before its
    exchange, as if the peer left there, and `finish` checkpoints the peer where it stopped.
    """
    for _ in each_round(j, should_stop):
        pass


def each_round(j: Joined, should_stop: Callable[[], bool]) -> Iterator[RoundMetrics]:
    """`train_rounds` one round at a time: each round's metrics once it is recorded and saved.
    The next round starts when the caller asks for it."""
    cfg, peer = j.opts.run, j.peer
    penalties = peer.exchange.penalties if isinstance(peer.exchange, NetworkExchange) else None
    if not cfg.security.defences:
        penalties = None
    rejoin = Rejoin(
        peer, j.view, j.transport, cfg.run_id(), j.opts.rejoin_lag_rounds, j.tokens_per_round, penalties
    )
    regain = RegainSight(j.view)
    aligned = cfg.outer.align_rounds and not cfg.outer.target_tokens_per_round  # §6 fixes round tokens
    robust = cfg.security.defences  # one peer's claimed round start is not enough (align.py)
    aligner = RoundAligner(j.node.peer_id, cfg.outer.num_inner_steps, robust=robust) if aligned else None
    drops = DropTally({"read": READ_DROPS.counts, "stored": j.node.record_drops})
    while peer.state.round < cfg.rounds and not should_stop():
        if j.view.refused_self is not None:  # no peer takes its messages any more: training alone is moot
            leave_refused(j)
        regain.before_round()
        _begin_round(j, aligner)
        m = peer.run_round_until(should_stop)
        if m is None:
            return
        if aligner is not None:
            aligner.observe(m.wall_s)
        _end_round(j, m, tuple(DropCount(*d) for d in drops.take()))
        rejoined = rejoin.after_round(m)
        if rejoined is not None:
            j.metrics.write(rejoined)
            j.server.publish(peer.state, peer.timing.t_step_s, skipped_s(peer))
        _save_progress(j)
        yield m


def leave_refused(j: Joined) -> NoReturn:
    """Stop a peer the swarm now refuses (an owner revoked it): checkpoint the work it did, then
    raise InvitationError saying why."""
    where = ""
    if j.opts.checkpoint_every:
        save_checkpoint(j.peer, j.ckpt)
        where = f"; its state at round {j.peer.state.round} is saved in {j.ckpt}"
    raise InvitationError(f"this swarm now refuses peer {j.node.peer_id}: {j.view.refused_self}{where}")


def _begin_round(j: Joined, aligner: RoundAligner | None) -> None:
    """Announce the round in the heartbeat; an aligned peer that started late skips steps to catch up."""
    peer, status = j.peer, j.view.status
    j.view.enter_round(peer.state.round)
    if aligner is not None:
        late = aligner.steps_to_skip(
            peer.state.round, status.round_started, j.view.heartbeats(), peer.timing.t_step_s
        )
        peer.skip_steps = max(peer.skip_steps, late)
    CONTEXT.round, CONTEXT.step = peer.state.round, peer.step


def _end_round(j: Joined, m: RoundMetrics, dropped: tuple[DropCount, ...] = ()) -> None:
    """Serve the new state, report the round in the heartbeat and the metrics (with the records
    refused during the round, `dropped`)."""
    peer, status = j.peer, j.view.status
    j.server.publish(peer.state, peer.timing.t_step_s)
    j.view.enter_round(peer.state.round)  # the next round starts about now (the loop's top: exactly)
    status.tokens_processed = peer.tokens
    status.loss = m.train_loss
    status.throughput_tokens_per_s = j.tokens_per_round / max(1e-9, m.wall_s)
    record = round_record(j.node.peer_id, m, j.started, dropped)
    status.last_exchange = round_outcome(record.exchanges)
    j.metrics.write(record)


def _save_progress(j: Joined) -> None:
    """φ snapshot and checkpoint on their schedules."""
    opts, peer = j.opts, j.peer
    if opts.snapshot_every and peer.state.round % opts.snapshot_every == 0:
        save_snapshot(
            opts.run_dir / "snapshots",
            peer.state.anchor,
            peer.state.round,
            peer.step,
            peer.tokens,
            time.monotonic() - j.started,
        )
    if opts.checkpoint_every and peer.state.round % opts.checkpoint_every == 0:
        save_checkpoint(peer, j.ckpt)


def _checkpoint(j: Joined) -> str:
    """The checkpoint's state hash; "" where checkpoints are off (`checkpoint_every` 0)."""
    return save_checkpoint(j.peer, j.ckpt) if j.opts.checkpoint_every else ""


def _evaluate(peer: Peer, params: list[torch.Tensor]) -> float | None:
    """The validation loss of `params`; None for a workload without validation batches."""
    return peer.evaluate(params) if peer.val else None


def finish(j: Joined, stopped: bool, stop_requested: Callable[[], bool] = lambda: False) -> FinalRecord:
    """Final checkpoint (mid-round if a bound cut the last round short); unless a stop signal ended
    the run, the final agreement (`final_agreement.py`: a stop request during its wait ends it)
    and a checkpoint of the agreed model; then evaluation of φ and the final record, returned."""
    peer, cfg = j.peer, j.opts.run
    final_hash = _checkpoint(j)  # kept if the final agreement fails or is killed
    own_anchor, own_loss, agreement, kept_own = peer.state.anchor, None, None, False
    mean_loss: float | None = None
    if not stopped and wants_final_agreement(cfg):
        reference = peer.workload.initial_weights()
        weight, waited_s = stopped_early_weight(
            cfg, peer.state.round, j.view.heartbeats, j.node.peer_id, stop_requested
        )
        request = final_request(cfg, reference, weight, waited_s)
        agreement = agree(peer, request, stop_requested, cfg.network.view_period_s)
        if agreement.merged:
            own_loss, mean_loss, kept_own = keep_the_better(
                peer, own_anchor, cfg.exchange.final_max_loss_increase
            )
        else:
            own_loss = _evaluate(peer, own_anchor)
        if agreement.merged and not kept_own:
            final_hash = _checkpoint(j)
            j.server.publish(peer.state, peer.timing.t_step_s, skipped_s(peer))
            # the summary compares the consensus with each peer's own model
            save_snapshot(
                j.opts.run_dir / BEFORE_FINAL_DIR,
                own_anchor,
                peer.state.round,
                peer.step,
                peer.tokens,
                time.monotonic() - j.started,
            )
    if agreement is None:
        val_loss = _evaluate(peer, peer.state.anchor)
    elif agreement.merged and not kept_own:
        val_loss = mean_loss  # None only without validation batches, as `_evaluate` would say
    else:
        val_loss = own_loss
    record = FinalRecord(
        peer=j.node.peer_id,
        round=peer.state.round,
        tokens=peer.tokens,
        val_loss=val_loss,
        time_s=time.monotonic() - j.started,
        stopped=stopped,
        state_hash=final_hash,
        step=peer.step,
        own_val_loss=own_loss,
        agreement=agreement,
        kept_own=kept_own,
    )
    j.metrics.write(record)
    return record
