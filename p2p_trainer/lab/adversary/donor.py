"""A poisoned donor: our own `StateServer` serving a modified state under a far-ahead round.

It advertises that round in a heartbeat of its own id, so a joiner (or a peer starting next to
it) ranks it first among the donors (`net/state_sync.py: donor_order`) and, trusting it, adopts
weights that are the seed's multiplied by -10, at a round that may be past the run's end
(`donor`); or the seed's own weights, which any check of the weights passes, with an outer
momentum a thousand times their size, which the first outer step turns into the same ruin
(`donor-momentum`).
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
    poison = poisoned_momentum if attack.name == "donor-momentum" else poisoned_state
    server.publish(poison(cfg, int(attack.arg)), step_s=0.01)
    me, ttl = transport.peer_id, cfg.network.heartbeat_ttl_s
    until = time.monotonic() + advertise_s
    for tick in every(cfg.network.view_period_s / 2, stop):
        if time.monotonic() < until:
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
