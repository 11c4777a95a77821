"""What a training peer does to enter a swarm: start its DHT node, then agree on the run definition."""

from __future__ import annotations

import logging
import threading

from p2p_trainer.net import records
from p2p_trainer.net.dht import DHTConfig, NetNode, start_node

logger = logging.getLogger(__name__)

HEARTBEAT_PERIOD_S = 10.0
"""How often a peer publishes its heartbeat."""
HEARTBEAT_TTL_S = 3 * HEARTBEAT_PERIOD_S
"""A peer missing three heartbeats in a row drops out of `list_live_peers`."""
RUN_DEFINITION_TTL_S = 600.0
"""Every peer re-publishes the run definition (via `check_run_definition`) well within this."""


def join_swarm(
    config: DHTConfig,
    run_name: str,
    run_definition: dict[str, object],
    stop: threading.Event | None = None,
) -> NetNode:
    """Start this peer's DHT node and refuse to join if the swarm's run definition differs.

    Raises `AddressError`, `IdentityError`, `InitialPeersUnreachable` or `RunDefinitionMismatch`;
    on any of them nothing is left running. The caller owns the returned node and must `shutdown()` it.
    """
    node = start_node(config, stop=stop)
    try:
        records.check_run_definition(
            node, run_name, records.RunDefinition(run_definition), RUN_DEFINITION_TTL_S
        )
    except BaseException:
        node.shutdown()
        raise
    logger.info("peer %s joined run %r", node.peer_id, run_name)
    return node
