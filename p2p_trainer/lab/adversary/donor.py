"""A poisoned donor: our own `StateServer` serving a modified state under a far-ahead round.

It advertises that round in a heartbeat of its own id, so a joiner (or a peer starting next to
it) ranks it first among the donors (`net/state_sync.py: donor_order`) and, trusting it, adopts
weights that are the seed's multiplied by -10, at a round that may be past the run's end
(`donor`); or the seed's own weights, which any check of the weights passes, with an outer
momentum a thousand times their size, which the first outer step turns into the same ruin
(`donor-momentum`); or the seed's own weights at a round far ahead of a running swarm, advertised
only once the swarm trains, for a peer that joins it later (`donor-late`): a joiner starts from
the seed too, so only a second donor's state shows that the swarm's is not the seed.
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


def _swarm_trains(dht: DHTLike, run_name: str, me: str) -> bool:
    """Two or more peers other than `me` publish a round of at least 2."""
    beats = records.read_heartbeats(dht, run_name, verify=False)
    return sum(1 for b, _ in beats if b.peer_id != me and b.round >= 2) >= 2


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
    server.publish(poison(cfg, int(attack.arg)), step_s=0.01)
    me, ttl = transport.peer_id, cfg.network.heartbeat_ttl_s
    # `donor-late` stays out of sight while the swarm starts (its peers would take it for the
    # lone donor of a running swarm): it advertises once the swarm trains
    until = None if attack.name == "donor-late" else time.monotonic() + advertise_s
    for tick in every(cfg.network.view_period_s / 2, stop):
        if until is None:
            try:
                if _swarm_trains(dht, run_name, me):
                    until = time.monotonic() + advertise_s
                    logger.warning("adversary: the swarm trains; advertising round %d", int(attack.arg))
            except Exception as exc:
                logger.info("adversary: reading the swarm failed: %s", exc)
        if until is not None and time.monotonic() < until:
            try:
                body = beat(me, int(attack.arg))
                records.seal_and_store(
                    dht, signer, records.heartbeat_key(run_name), me, body, records.now() + ttl
                )
            except Exception as exc:  # keep serving whatever the DHT says
                logger.info("adversary: advertising failed: %s", exc)
        if tick == 0:
            logger.warning("adversary: donor %s ready, advertising round %d", me, int(attack.arg))
        if tick % 20 == 0:
            logger.warning("adversary: poisoned state served %d times", server.served)
    return server.served
