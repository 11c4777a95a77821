"""`p2p-trainer bootstrap`: the click command (cli.py registers it on the `p2p-trainer` group).

hivemind is imported inside the command, so `p2p-trainer --help` does not load it (nor torch).
"""

from __future__ import annotations

import logging
import sys
import threading

import click

from p2p_trainer.cli_options import log_format_option, metrics_options, node_options
from p2p_trainer.logs import use_log_format
from p2p_trainer.net.node_defaults import DEFAULT_BOOTSTRAP_IDENTITY, DEFAULT_BOOTSTRAP_PORT
from p2p_trainer.net.signals import install_stop_handlers


@click.command("bootstrap")
@node_options(DEFAULT_BOOTSTRAP_PORT, DEFAULT_BOOTSTRAP_IDENTITY, initial_peers_required=False)
@click.option(
    "--status-interval-s", default=60.0, show_default=True, type=float, help="Seconds between status lines."
)
@click.option(
    "--connect-attempts", default=4, show_default=True, type=int, help="Tries of the initial peers."
)
@click.option(
    "--address-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the node's multiaddrs to this file (atomically) once it accepts connections, "
    "for `join --initial-peers-file`; removed when the node stops.",
)
@click.option(
    "--relay",
    type=click.Choice(["on", "off"]),
    default="on",
    show_default=True,
    help="Forward messages to peers behind NAT that others cannot dial (README, Peers behind NAT).",
)
@click.option(
    "--verify-records",
    type=click.Choice(["on", "off"]),
    default="on",
    show_default=True,
    help="Refuse unsigned or forged DHT records (SECURITY.md). Turn off only for a swarm whose peers "
    "run with [security] defences = false, as the attack benchmarks' undefended arms do.",
)
@metrics_options("this node")
@log_format_option
def bootstrap(
    host: str,
    port: int,
    announce_host: str | None,
    identity_path: str,
    initial_peers: tuple[str, ...],
    status_interval_s: float,
    connect_attempts: int,
    address_file: str | None,
    relay: str,
    verify_records: str,
    metrics_port: int | None,
    metrics_host: str,
    log_format: str,
) -> None:
    """Run a long-lived DHT node that peers join; prints the --initial-peers text to use elsewhere."""
    from p2p_trainer.net.address_file import remove_address_file, write_address_file
    from p2p_trainer.net.addresses import AddressError
    from p2p_trainer.net.bootstrap import BootstrapConfig, NodeDiedError, initial_peers_args, run_bootstrap
    from p2p_trainer.net.dht import DHTConfig, InitialPeersUnreachable
    from p2p_trainer.net.identity import IdentityError
    from p2p_trainer.net.node_metrics import BootstrapMetrics, MetricsPortError

    use_log_format(log_format)
    stop_event = threading.Event()
    stopped_by = install_stop_handlers(stop_event)
    dht = DHTConfig(
        identity_path=identity_path,
        host=host,
        port=port,
        announce_host=announce_host,
        initial_peers=initial_peers,
        connect_attempts=connect_attempts,
        verify_records=verify_records == "on",
    )

    def on_ready(maddrs: list[str]) -> None:
        if address_file is not None:
            try:
                write_address_file(address_file, maddrs)
            except OSError as exc:  # raised through run_bootstrap, which stops the node
                raise click.ClickException(f"cannot write --address-file {address_file}: {exc}") from None
        click.echo(initial_peers_args(maddrs))
        sys.stdout.flush()

    if address_file is not None:  # one left by a node that was killed names an address nobody answers
        remove_address_file(address_file)

    metrics = None
    try:
        config = BootstrapConfig(dht=dht, status_interval_s=status_interval_s, relay=relay == "on")
        # bound before the node starts: an occupied port fails with nothing to clean up
        metrics = BootstrapMetrics(metrics_host, metrics_port) if metrics_port is not None else None
        run_bootstrap(config, stop_event, on_ready=on_ready, on_start=metrics.watch if metrics else None)
    except (
        AddressError,
        IdentityError,
        InitialPeersUnreachable,
        NodeDiedError,
        MetricsPortError,
        ValueError,
    ) as e:
        raise click.ClickException(str(e)) from None
    except InterruptedError:
        pass
    finally:
        if address_file is not None:
            remove_address_file(address_file)
        if metrics is not None:
            metrics.close()
    signum = stopped_by()
    if signum is not None:
        sys.exit(128 + signum)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("hivemind").setLevel(logging.WARNING)
    bootstrap()
