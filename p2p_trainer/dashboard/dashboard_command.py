"""`p2p-trainer dashboard`: serve a live page of a swarm (peers, loss, throughput, exchanges).

The port is bound before anything else starts, so an occupied port fails at once with nothing to
clean up; hivemind is imported after that (with the status client), so `--help` stays fast.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import click

from p2p_trainer.cli_options import swarm_reader_options
from p2p_trainer.net.signals import install_stop_handlers

if TYPE_CHECKING:
    from p2p_trainer.dashboard.history import SwarmHistory


dashboard_port_option = click.option(
    "--dashboard-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve the live dashboard of the swarm on this loopback port (0: any free one; off without it).",
)
"""`local --dashboard-port`: the same page as `p2p-trainer dashboard`, for the swarm of the run."""


@click.command("dashboard")
@swarm_reader_options
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="IP address the page is served on (0.0.0.0: every interface; the page has no login).",
)
@click.option(
    "--port",
    default=8080,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="TCP port of the page (0: any free port).",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Also show each peer's exchange outcomes from the metrics files here (a `local` run's "
    "directory, or a peer's `join --run-dir`).",
)
@click.option(
    "--interval-s",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0.5),
    help="Seconds between reads of the swarm's heartbeats.",
)
def dashboard(
    initial_peers: tuple[str, ...], swarm: str, host: str, port: int, run_dir: str | None, interval_s: float
) -> None:
    """Serve a live web page of a swarm: its peers, loss curves, throughput and exchanges."""
    from p2p_trainer.dashboard.history import SwarmHistory
    from p2p_trainer.dashboard.server import DashboardPortError, DashboardServer

    stop = threading.Event()
    stopped_by = install_stop_handlers(stop)
    history = SwarmHistory(swarm)
    try:
        server = DashboardServer(host, port, history.snapshot)
    except DashboardPortError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        server.start()
        # the first line on stdout: `local` reads the address from it
        click.echo(f"dashboard at {server.url} (swarm {swarm!r})")
        _serve(initial_peers, history, interval_s, Path(run_dir) if run_dir else None, stop)
    finally:
        server.close()
    signum = stopped_by()
    if signum is not None:
        sys.exit(128 + signum)


def _serve(
    initial_peers: tuple[str, ...],
    history: SwarmHistory,
    interval_s: float,
    run_dir: Path | None,
    stop: threading.Event,
) -> None:
    from p2p_trainer.dashboard.exchanges import RunDirExchanges
    from p2p_trainer.dashboard.poller import Poller
    from p2p_trainer.net.addresses import AddressError
    from p2p_trainer.net.dht import InitialPeersUnreachable
    from p2p_trainer.net.status_client import StatusClient
    from p2p_trainer.net.status_command import status_dict

    try:
        client = StatusClient(initial_peers)
    except (AddressError, InitialPeersUnreachable) as exc:
        raise click.ClickException(str(exc)) from None
    with client:
        exchanges = RunDirExchanges(run_dir) if run_dir is not None else None
        poller = Poller(lambda: status_dict(client.read(history.swarm)), history, interval_s, exchanges)
        poller.start()
        try:
            while not stop.wait(1.0):
                pass
        finally:
            poller.stop_event.set()  # a read in progress ends when the client shuts its DHT down
    poller.stop()
