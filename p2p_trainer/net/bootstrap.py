"""A long-lived DHT node that other nodes join: the swarm's entry point. No training, no coordinator.

Several bootstrap nodes can serve one swarm: start the first with no initial peers, then each
further one with the first's address, and give peers all of them. Signal handling belongs to the
caller (the CLI), which sets `stop_event`; `run_bootstrap` then shuts the node down and returns.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from p2p_trainer.net.dht import DHTCallTimeout, DHTConfig, NetNode, start_node
from p2p_trainer.net.node_defaults import DEFAULT_BOOTSTRAP_IDENTITY, DEFAULT_BOOTSTRAP_PORT
from p2p_trainer.net.node_services import NodeServices

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BootstrapConfig:
    """A bootstrap node: its DHT node settings and how often it reports its status."""

    dht: DHTConfig = field(
        default_factory=lambda: DHTConfig(
            identity_path=DEFAULT_BOOTSTRAP_IDENTITY, port=DEFAULT_BOOTSTRAP_PORT
        )
    )
    """Listen/announce addresses, identity and the other bootstrap nodes to join (initial peers)."""
    status_interval_s: float = 60.0
    """Seconds between status lines (peers connected, uptime)."""
    relay: bool = True
    """Forward messages to peers that others cannot dial (behind NAT: `message_relay.py`); the dial-back
    check (`reach.py`) is served either way."""

    def __post_init__(self) -> None:
        if not self.status_interval_s > 0:
            raise ValueError(f"status_interval_s must be positive, got {self.status_interval_s}")


def initial_peers_args(maddrs: list[str]) -> str:
    """The exact command-line text to paste on other machines: `--initial-peers A [--initial-peers B]`."""
    return " ".join(f"--initial-peers {maddr}" for maddr in maddrs)


def _format_uptime(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


class NodeDiedError(RuntimeError):
    """The node's DHT process or p2pd exited while the node was meant to run."""


def _log_status(node: NetNode, services: NodeServices) -> None:
    try:
        peers = str(node.connected_peers())
    except DHTCallTimeout as e:
        peers = f"unknown ({e})"
    uptime = _format_uptime(time.monotonic() - node.started_at)
    relayed = "" if services.relay is None else f", {services.relay.forwarded} messages relayed"
    logger.info("bootstrap %s: %s peers connected, up %s%s", node.peer_id[-8:], peers, uptime, relayed)


def run_bootstrap(
    config: BootstrapConfig,
    stop_event: threading.Event,
    on_ready: Callable[[list[str]], None] | None = None,
    on_start: Callable[[NetNode], None] | None = None,
) -> list[str]:
    """Serve the DHT until `stop_event` is set; return the node's multiaddrs.

    `on_start(node)` is called as soon as the node runs (the metrics endpoint watches it from
    then on); `on_ready(maddrs)` once the node accepts connections; the same addresses are logged
    as the `--initial-peers` text to paste elsewhere. Raises what `start_node` raises.
    """
    node = start_node(config.dht, stop=stop_event)
    services: NodeServices | None = None
    try:
        services = NodeServices(node.dht, relay=config.relay)
        if on_start is not None:
            on_start(node)
        maddrs = node.visible_maddrs()
        logger.info(
            "bootstrap node %s ready; on other machines pass: %s", node.peer_id, initial_peers_args(maddrs)
        )
        if on_ready is not None:
            on_ready(maddrs)
        while not stop_event.wait(config.status_interval_s):
            if not node.is_healthy():
                raise NodeDiedError(
                    f"bootstrap node {node.peer_id}: its DHT process or p2pd exited unexpectedly"
                )
            _log_status(node, services)
        logger.info("stopping bootstrap node %s", node.peer_id)
    finally:
        if services is not None:
            services.close()
        node.shutdown()
    return maddrs
