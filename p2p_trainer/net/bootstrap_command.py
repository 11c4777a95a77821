"""`p2p-trainer bootstrap`: the click command (the lead's CLI registers `bootstrap`)."""

from __future__ import annotations

import logging
import sys
import threading

import click

from p2p_trainer.net.addresses import AddressError
from p2p_trainer.net.bootstrap import (
    DEFAULT_IDENTITY_PATH,
    DEFAULT_PORT,
    BootstrapConfig,
    NodeDiedError,
    initial_peers_args,
    run_bootstrap,
)
from p2p_trainer.net.dht import DHTConfig, InitialPeersUnreachable
from p2p_trainer.net.identity import IdentityError
from p2p_trainer.net.signals import install_stop_handlers


@click.command("bootstrap")
@click.option("--host", default="0.0.0.0", show_default=True, help="IP address to listen on.")
@click.option(
    "--port", default=DEFAULT_PORT, show_default=True, type=int, help="TCP port (0: any free port)."
)
@click.option(
    "--announce-host", default=None, help="Address other machines dial (behind NAT / in containers)."
)
@click.option(
    "--identity",
    "identity_path",
    default=DEFAULT_IDENTITY_PATH,
    show_default=True,
    help="Ed25519 key file, created (0600) on first run; keeps the peer id stable across restarts.",
)
@click.option("--initial-peers", multiple=True, help="Another bootstrap node to join (repeatable).")
@click.option(
    "--status-interval-s", default=60.0, show_default=True, type=float, help="Seconds between status lines."
)
@click.option(
    "--connect-attempts", default=4, show_default=True, type=int, help="Tries of the initial peers."
)
def bootstrap(
    host: str,
    port: int,
    announce_host: str | None,
    identity_path: str,
    initial_peers: tuple[str, ...],
    status_interval_s: float,
    connect_attempts: int,
) -> None:
    """Run a long-lived DHT node that peers join; prints the --initial-peers text to use elsewhere."""
    stop_event = threading.Event()
    install_stop_handlers(stop_event)
    dht = DHTConfig(
        identity_path=identity_path,
        host=host,
        port=port,
        announce_host=announce_host,
        initial_peers=initial_peers,
        connect_attempts=connect_attempts,
    )

    def on_ready(maddrs: list[str]) -> None:
        click.echo(initial_peers_args(maddrs))
        sys.stdout.flush()

    try:
        config = BootstrapConfig(dht=dht, status_interval_s=status_interval_s)
        run_bootstrap(config, stop_event, on_ready=on_ready)
    except (AddressError, IdentityError, InitialPeersUnreachable, NodeDiedError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    except InterruptedError:
        return


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("hivemind").setLevel(logging.WARNING)
    bootstrap()
