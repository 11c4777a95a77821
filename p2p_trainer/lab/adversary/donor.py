"""A poisoned donor: our own `StateServer` serving a modified state under a far-ahead round.

It advertises that round in a heartbeat of its own id, so a joiner (or a peer starting next to
it) ranks it first among the donors (`net/state_sync.py: donor_order`) and, trusting it, adopts
weights that are the seed's multiplied by -10, at a round that may be past the run's end
(`donor`); or the seed's own weights, which any check of the weights passes, with an outer
momentum a thousand times their size, which the first outer step turns into the same ruin
(`donor-momentum`); or the seed's own weights a fixed lead of rounds ahead of a running swarm,
advertised only once the swarm trains, for a peer that joins it later (`donor-late`): a joiner
starts from the seed too, so only a second donor's state shows that the swarm's is not the seed.
"""

from __future__ import annotations

import logging
import threading
import time

import torch

from p2p_trainer.algo.methods import OuterState
from p2p_trainer.config import RunConfig
from p2p_trainer.lab.adversary.attacks import Attack
from p2p_trainer.lab.adversary.forger import beat
from p2p_trainer.lab.adversary.node import every
from p2p_trainer.net import records
from p2p_trainer.net.envelope import Signer
from p2p_trainer.net.records import DHTLike
from p2p_trainer.net.state_sync import StateServer
from p2p_trainer.net.transport import Transport
from p2p_trainer.train.model import build_model

logger = logging.getLogger(__name__)

POISON = -10.0
"""The served weights are the seed's times this."""


def poisoned_state(cfg: RunConfig, round: int) -> OuterState:
    params = [p.detach().float() for p in build_model(cfg.model, cfg.seed).parameters()]
    state = OuterState.from_params(params)
    state.anchor = [POISON * a for a in state.anchor]
    state.momentum = [torch.zeros_like(a) for a in state.anchor]
    state.round = round
    return state


MOMENTUM_POISON = 1000.0
"""`donor-momentum`'s momentum is the seed's weights times this."""


def poisoned_momentum(cfg: RunConfig, round: int) -> OuterState:
    params = [p.detach().float() for p in build_model(cfg.model, cfg.seed).parameters()]
    state = OuterState.from_params(params)
    state.momentum = [MOMENTUM_POISON * a for a in state.anchor]
    state.round = round
    return state


def seed_state(cfg: RunConfig, round: int) -> OuterState:
    """The seed's own weights: any check of a joiner that starts from them passes them."""
    state = OuterState.from_params(
        [p.detach().float() for p in build_model(cfg.model, cfg.seed).parameters()]
    )
    state.round = round
    return state


POISONS = {"donor-momentum": poisoned_momentum, "donor-late": seed_state}


def _swarm_rounds(dht: DHTLike, run_name: str, me: str) -> list[int]:
    """The rounds that the peers other than `me` publish (those still training)."""
    beats = records.read_heartbeats(dht, run_name, verify=False)
    return [b.round for b, _ in beats if b.peer_id != me and not b.leaving]


def _swarm_trains(rounds: list[int]) -> bool:
    """Two or more peers publish a round of at least 2."""
    return sum(1 for r in rounds if r >= 2) >= 2


def _ahead(current: int | None, latest: int, lead: int) -> int:
    """`donor-late`'s round: `lead` rounds past the swarm's `latest`, moved on only once the swarm
    has closed a quarter of the lead, so that a joiner's header and download of one state (which
    names its round) seldom straddle a change."""
    if current is None or current - latest < lead - lead // 4:
        return latest + lead
    return current


def serve_poison(
    dht: DHTLike,
    transport: Transport,
    signer: Signer,
    cfg: RunConfig,
    run_name: str,
    attack: Attack,
    advertise_s: float,
    stop: threading.Event,
) -> int:
    """Serve the poisoned state until `stop`; advertise it for `advertise_s` in a heartbeat sealed by
    `signer` (the key of the node `transport` runs on). Returns the states served."""
    server = StateServer(transport, cfg.run_id())
    poison = POISONS.get(attack.name, poisoned_state)
    late = attack.name == "donor-late"
    # `donor-late`'s ARG is a lead over the swarm's round, which it serves once the swarm trains
    served = None if late else int(attack.arg)
    if served is not None:
        server.publish(poison(cfg, served), step_s=0.01)
    me, ttl = transport.peer_id, cfg.network.heartbeat_ttl_s
    # `donor-late` stays out of sight while the swarm starts (its peers would take it for the
    # lone donor of a running swarm): it advertises once the swarm trains, a lead ahead of it
    until = None if late else time.monotonic() + advertise_s
    for tick in every(cfg.network.view_period_s / 2, stop):
        if late:
            try:
                rounds = _swarm_rounds(dht, run_name, me)
                if until is None and _swarm_trains(rounds):
                    until = time.monotonic() + advertise_s
                    logger.warning(
                        "adversary: the swarm trains; advertising %d rounds ahead", int(attack.arg)
                    )
                if until is not None and rounds:
                    moved = _ahead(served, max(rounds), int(attack.arg))
                    if moved != served:
                        served = moved
                        server.publish(poison(cfg, served), step_s=0.01)
            except Exception as exc:
                logger.info("adversary: reading the swarm failed: %s", exc)
        if until is not None and served is not None and time.monotonic() < until:
            try:
                body = beat(me, served)
                records.seal_and_store(
                    dht, signer, records.heartbeat_key(run_name), me, body, records.now() + ttl
                )
            except Exception as exc:  # keep serving whatever the DHT says
                logger.info("adversary: advertising failed: %s", exc)
        if tick == 0:
            ahead = (
                f"{int(attack.arg)} rounds ahead of the swarm once it trains" if late else f"round {served}"
            )
            logger.warning("adversary: donor %s ready, advertising %s", me, ahead)
        if tick % 20 == 0:
            logger.warning("adversary: poisoned state served %d times (round %s)", server.served, served)
    return server.served
