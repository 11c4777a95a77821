"""What a training peer does to enter a swarm: start its DHT node, then agree on the run definition."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from p2p_trainer.config import NetworkConfig
from p2p_trainer.net import records
from p2p_trainer.net.dht import DHTConfig, NetNode, start_node

logger = logging.getLogger(__name__)


def join_swarm(
    config: DHTConfig,
    run_name: str,
    run_definition: dict[str, object],
    stop: threading.Event | None = None,
    definition_ttl_s: float = NetworkConfig.run_definition_ttl_s,
    check_self: Callable[[NetNode], None] | None = None,
) -> NetNode:
    """Start this peer's DHT node and refuse to join if the swarm's run definition differs.

    Raises `AddressError`, `IdentityError`, `InitialPeersUnreachable`, `RunDefinitionMismatch` or
    what `check_self` raises; on any of them nothing is left running. The caller owns the returned node and must `shutdown()` it.
    Every joiner publishes its own, signed run definition, which lives `definition_ttl_s` in the DHT;
    the definitions are checked (signatures, live publishers) as the node's `verify_records` says.
    `check_self(node)` runs first and may raise (admission: a refused peer publishes nothing).
    """
    node = start_node(config, stop=stop)
    try:
        enter_run(node, run_name, run_definition, definition_ttl_s, check_self)
    except BaseException:
        node.shutdown()
        raise
    return node


def enter_run(
    node: NetNode,
    run_name: str,
    run_definition: dict[str, object],
    definition_ttl_s: float = NetworkConfig.run_definition_ttl_s,
    check_self: Callable[[NetNode], None] | None = None,
) -> None:
    """The second half of `join_swarm`, for a node that is already running: `check_self`, then
    refuse (`RunDefinitionMismatch`) a run whose definition differs, else publish ours. The node
    is the caller's either way."""
    if check_self is not None:
        check_self(node)
    ours = records.RunDefinition(run_definition)
    verify = node.config.verify_records
    records.check_run_definition(node, run_name, ours, definition_ttl_s, node.signer, verify)
    logger.info("peer %s joined run %r", node.peer_id, run_name)
