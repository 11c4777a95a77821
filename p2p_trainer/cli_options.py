"""Command-line options shared by `local`, `join`, `bootstrap`, `inprocess` and `config`.

One option object per notion, so the same thing has the same name, type and help in every command.
This module imports only click and the config (never torch or hivemind), so `--help` stays fast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from p2p_trainer.config import METHODS
from p2p_trainer.logs import LOG_FORMATS

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]

config_option = click.option(
    "--config",
    type=click.Path(dir_okay=False),
    default=None,
    envvar="P2PT_CONFIG",
    show_envvar=True,
    help="Run config TOML (default: the packaged default run; `p2p-trainer config` prints it). "
    "P2PT_<TABLE>__<FIELD> variables override its values, flags override those.",
)
method_option = click.option(
    "--method",
    type=click.Choice(METHODS),
    default=None,
    help="Outer method; keeps the config's other [outer] values, the method's defaults fill the rest.",
)
rounds_option = click.option(
    "--rounds", type=click.IntRange(min=1), default=None, help="Outer rounds to train."
)
seed_option = click.option("--seed", type=int, default=None, help="Run seed.")
minutes_option = click.option(
    "--minutes",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Stop after this much wall time.",
)


def run_config_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--config, --method, --rounds and --seed: the run config and its command-line overrides."""
    for option in (seed_option, rounds_option, method_option, config_option):
        func = option(func)
    return func


def swarm_reader_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--initial-peers and --swarm of the commands that read a swarm from outside (status, dashboard)."""
    func = click.option("--swarm", default="default", show_default=True, help="Name of the swarm to show.")(
        func
    )
    return click.option(
        "--initial-peers",
        multiple=True,
        required=True,
        help="Multiaddr of a running node of the swarm, as `p2p-trainer bootstrap` prints it (repeatable).",
    )(func)


def run_dir_option(default: str | None, help_text: str) -> Decorator:
    return click.option(
        "--run-dir",
        type=click.Path(file_okay=False),
        default=default,
        show_default=default is not None,
        help=help_text,
    )


def node_options(port: int, identity: str, initial_peers_required: bool) -> Decorator:
    """--host, --port, --announce-host, --identity and --initial-peers of a DHT node."""
    options = [
        click.option("--host", default="0.0.0.0", show_default=True, help="IP address to listen on."),
        click.option(
            "--port",
            default=port,
            show_default=True,
            type=click.IntRange(0, 65535),
            help="TCP port (0: any free port).",
        ),
        click.option(
            "--announce-host",
            default=None,
            help="IP address other machines dial (behind NAT / in containers); works with any --port.",
        ),
        click.option(
            "--identity",
            "identity_path",
            default=identity,
            show_default=True,
            help="Ed25519 key file, created (0600) on first run; keeps the peer id stable across restarts.",
        ),
        click.option(
            "--initial-peers",
            multiple=True,
            required=initial_peers_required,
            help="Multiaddr of a running node, as `p2p-trainer bootstrap` prints it (repeatable).",
        ),
    ]

    def apply(func: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            func = option(func)
        return func

    return apply


initial_peers_file_options = [
    click.option(
        "--initial-peers-file",
        type=click.Path(dir_okay=False),
        default=None,
        help="File with the multiaddrs to join, as `bootstrap --address-file` writes it; waited for "
        "if it does not exist yet (with --initial-peers: both are used).",
    ),
    click.option(
        "--initial-peers-timeout-s",
        type=click.FloatRange(min=0),
        default=300.0,
        show_default=True,
        help="Longest wait for --initial-peers-file to appear.",
    ),
]


def initial_peers_file_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """--initial-peers-file and --initial-peers-timeout-s: the bootstrap's address from a file."""
    for option in reversed(initial_peers_file_options):
        func = option(func)
    return func


log_format_option = click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="text",
    show_default=True,
    help="Log lines as text, or as one JSON object per line (for log shippers).",
)


def metrics_options(what: str) -> Decorator:
    """--metrics-port and --metrics-host: the opt-in Prometheus endpoint of a node."""
    options = [
        click.option(
            "--metrics-port",
            type=click.IntRange(1, 65535),
            default=None,
            help=f"Serve Prometheus metrics of {what} on this TCP port (off without it).",
        ),
        click.option(
            "--metrics-host",
            default="0.0.0.0",
            show_default=True,
            help="IP address the metrics endpoint listens on.",
        ),
    ]

    def apply(func: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            func = option(func)
        return func

    return apply


metrics_port_base_option = click.option(
    "--metrics-port-base",
    type=click.IntRange(1, 65535),
    default=None,
    help="Prometheus metrics on loopback: peer i on this port + i, the bootstrap node on this port + "
    "--peers (off without it).",
)


tensorboard_dir_option = click.option(
    "--tensorboard-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write TensorBoard scalars (losses, tokens/s, bytes, exchange outcomes and times per round) "
    "here; `local` gives peer i the subdirectory peer{i}/ ([log] tensorboard_dir; needs the "
    "tensorboard package).",
)
