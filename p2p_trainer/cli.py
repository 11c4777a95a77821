"""The `p2p-trainer` command line. click lives only here (and in the commands it registers).

Commands import torch and hivemind inside their functions, so `p2p-trainer --help` (and every
command's `--help`) answers without loading them. A run stopped by SIGINT or SIGTERM exits with
128 + the signal's number (130 for Ctrl-C), after saving what it measured.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import click

from p2p_trainer.cli_options import (
    initial_peers_file_option,
    log_format_option,
    metrics_options,
    metrics_port_base_option,
    minutes_option,
    node_options,
    run_config_options,
    run_dir_option,
    tensorboard_dir_option,
)
from p2p_trainer.config import ConfigError, RunConfig, to_toml
from p2p_trainer.config_command import config_group, resolve_config
from p2p_trainer.dashboard.dashboard_command import dashboard, dashboard_port_option
from p2p_trainer.lab.sim.command import simulate
from p2p_trainer.logs import setup_logging, use_log_format
from p2p_trainer.net.admission_commands import identity, invite, revoke
from p2p_trainer.net.bootstrap_command import bootstrap
from p2p_trainer.net.node_defaults import DEFAULT_PEER_IDENTITY
from p2p_trainer.net.signals import install_stop_handlers
from p2p_trainer.net.status_command import status
from p2p_trainer.run.model_commands import evaluate, sample, tokenizer

if TYPE_CHECKING:
    from collections.abc import Callable

    from p2p_trainer.fault_points import FaultPoint


@click.group()
@click.option(
    "--log-level", default="INFO", show_default=True, type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"])
)
def main(log_level: str) -> None:
    """Decentralized peer-to-peer training over slow, unreliable links."""
    setup_logging(log_level)


main.add_command(bootstrap)
main.add_command(invite)
main.add_command(revoke)
main.add_command(identity)
main.add_command(simulate)
main.add_command(status)
main.add_command(dashboard)
main.add_command(config_group)
main.add_command(tokenizer)
main.add_command(sample)
main.add_command(evaluate)


def _read_invitation(path: str | None) -> str:
    """The invitation text in `path` ("" without one); a bad file is a usage error."""
    if path is None:
        return ""
    try:
        text = Path(path).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read the invitation: {exc}", param_hint="--invitation") from None
    from p2p_trainer.net.admission import Invitation, InvitationError

    try:
        Invitation.decode(text)
    except InvitationError as exc:
        raise click.BadParameter(f"{path}: {exc}", param_hint="--invitation") from None
    return text


def _require_tensorboard(cfg: RunConfig) -> None:
    """A TensorBoard directory without the tensorboard package is a usage error, before anything starts."""
    if not cfg.log.tensorboard_dir:
        return
    from p2p_trainer.run.tensorboard_scalars import TensorBoardMissing, require_tensorboard

    try:
        require_tensorboard(cfg.log.tensorboard_dir)
    except TensorBoardMissing as exc:
        raise click.ClickException(str(exc)) from None
    directory = Path(cfg.log.tensorboard_dir)
    try:  # a peer would otherwise fail only after joining, on its first event file
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.ClickException(
            f"--tensorboard-dir / [log] tensorboard_dir = {str(directory)!r} cannot be created ({exc}): "
            "name a directory this user can write"
        ) from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise click.ClickException(
            f"--tensorboard-dir / [log] tensorboard_dir = {str(directory)!r} is not writable by this user: "
            "name a directory this user can write"
        )


def _kill_point(text: str | None) -> tuple[FaultPoint, int] | None:
    from p2p_trainer.fault_points import parse_fault_point

    try:
        return None if text is None else parse_fault_point(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--kill-self-at") from None


def _wait_for_initial_peers(
    path: str, timeout_s: float, stop: threading.Event, stopped_by: Callable[[], int | None]
) -> tuple[str, ...]:
    """The multiaddrs in --initial-peers-file, once the bootstrap node has written it."""
    from p2p_trainer.net.address_file import wait_for_address_file
    from p2p_trainer.net.addresses import AddressError

    try:
        return tuple(wait_for_address_file(path, timeout_s, stop))
    except AddressError as exc:
        raise click.ClickException(str(exc)) from None
    except InterruptedError:
        sys.exit(128 + (stopped_by() or signal.SIGINT))


@main.command()
@run_config_options
@node_options(0, DEFAULT_PEER_IDENTITY, initial_peers_required=False)
@initial_peers_file_option
@run_dir_option("runs/peer", "Where metrics.jsonl and checkpoints go.")
@click.option(
    "--wait-for-peers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Peers (self included) to wait for before the first round of a new swarm; a peer that "
    "left within the last heartbeat TTL (it finished a short run) counts as arrived.",
)
@click.option(
    "--wait-timeout-s",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Longest wait for --wait-for-peers before training anyway.",
)
@minutes_option
@click.option("--resume", is_flag=True, help="Continue from RUN_DIR/checkpoint.safetensors.")
@click.option(
    "--checkpoint-every",
    default=10,
    show_default=True,
    type=click.IntRange(min=1),
    help="Checkpoint every this many rounds (and on exit).",
)
@click.option("--torch-threads", type=click.IntRange(min=1), default=None, help="Intra-op threads for torch.")
@click.option("--device", default=None, help="torch device (default: cuda if available, else cpu).")
@click.option("--data-key", default=None, help="Seeds this peer's data stream (default: its peer id).")
@click.option(
    "--swarm",
    default="default",
    show_default=True,
    help="Name of the swarm to join on these bootstrap nodes.",
)
@click.option(
    "--relay",
    type=click.Choice(["auto", "off"]),
    default="auto",
    show_default=True,
    help="auto: reach peers behind NAT through the bootstrap nodes' relay, and behind NAT keep "
    "connections to the peers this one can dial; off: neither (README, Peers behind NAT).",
)
@click.option(
    "--kill-self-at", default=None, hidden=True, help="Test tool: PHASE:ROUND to SIGKILL this node at."
)
@click.option(
    "--snapshot-every",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Save φ to RUN_DIR/snapshots every this many rounds, for loss curves evaluated after the run.",
)
@click.option(
    "--record-exchanges",
    default=None,
    hidden=True,
    type=click.Path(file_okay=False),
    help="Test tool: write each exchange's contribution and result to DIR.",
)
@click.option(
    "--invitation",
    default=None,
    type=click.Path(dir_okay=False),
    help='Invitation file from `p2p-trainer invite` (swarms with security.admission = "invitations").',
)
@click.option(
    "--ignore-env",
    is_flag=True,
    hidden=True,
    help="Launcher tool: --config is resolved already, environment included; do not apply P2PT_ again.",
)
@metrics_options("this peer")
@log_format_option
@tensorboard_dir_option
def join(
    config: str | None,
    method: str | None,
    rounds: int | None,
    seed: int | None,
    host: str,
    port: int,
    announce_host: str | None,
    identity_path: str,
    initial_peers: tuple[str, ...],
    initial_peers_file: str | None,
    initial_peers_timeout_s: float,
    run_dir: str,
    wait_for_peers: int,
    wait_timeout_s: float,
    minutes: float | None,
    resume: bool,
    checkpoint_every: int,
    torch_threads: int | None,
    device: str | None,
    data_key: str | None,
    swarm: str,
    relay: str,
    kill_self_at: str | None,
    snapshot_every: int,
    record_exchanges: str | None,
    invitation: str | None,
    ignore_env: bool,
    metrics_port: int | None,
    metrics_host: str,
    log_format: str,
    tensorboard_dir: str | None,
) -> None:
    """Join a swarm as a training peer."""
    if not initial_peers and initial_peers_file is None:
        raise click.UsageError("Missing option '--initial-peers' (or '--initial-peers-file').")
    import torch

    if device is not None and device.startswith("cuda") and not torch.cuda.is_available():
        raise click.UsageError(
            f"--device {device}: no CUDA device is visible to torch {torch.__version__} "
            "(torch.cuda.is_available() is False); use --device cpu, or a machine and torch build with CUDA"
        )

    from p2p_trainer.net.addresses import AddressError
    from p2p_trainer.net.admission import InvitationError
    from p2p_trainer.net.dht import DHTConfig, InitialPeersUnreachable
    from p2p_trainer.net.identity import IdentityError
    from p2p_trainer.net.node_metrics import MetricsPortError
    from p2p_trainer.net.records import RunDefinitionMismatch
    from p2p_trainer.run.join import JoinOptions, run_peer
    from p2p_trainer.run.peer_metrics import PeerMetrics
    from p2p_trainer.train.data import DataError

    use_log_format(log_format)  # after the imports above: hivemind's import sets its own handler
    cfg = resolve_config(
        config, method, rounds, seed, use_env=not ignore_env, tensorboard_dir=tensorboard_dir
    )
    _require_tensorboard(cfg)
    invitation_text, kill_point = _read_invitation(invitation), _kill_point(kill_self_at)
    stop = threading.Event()
    stopped_by = install_stop_handlers(stop)
    if initial_peers_file is not None:
        initial_peers += _wait_for_initial_peers(
            initial_peers_file, initial_peers_timeout_s, stop, stopped_by
        )
    try:  # bound before anything starts: an occupied port fails with nothing to clean up
        monitor = PeerMetrics(metrics_host, metrics_port) if metrics_port is not None else None
    except MetricsPortError as exc:
        raise click.ClickException(str(exc)) from None
    if torch_threads:
        torch.set_num_threads(torch_threads)
    dht = DHTConfig(
        identity_path=str(Path(identity_path).expanduser()),
        host=host,
        port=port,
        announce_host=announce_host,
        initial_peers=tuple(initial_peers),
        verify_records=cfg.security.defences,
        swarm=swarm,
    )
    opts = JoinOptions(
        run=cfg,
        dht=dht,
        run_dir=Path(run_dir),
        wait_for_peers=wait_for_peers,
        wait_timeout_s=wait_timeout_s,
        max_minutes=minutes,
        resume=resume,
        checkpoint_every=checkpoint_every,
        device=device or ("cuda" if torch.cuda.is_available() else "cpu"),
        data_key=data_key,
        swarm=swarm,
        relay=relay,
        kill_self_at=kill_point,
        snapshot_every=snapshot_every,
        record_exchanges=Path(record_exchanges) if record_exchanges else None,
        invitation=invitation_text,
        monitor=monitor,
    )
    try:
        code = run_peer(opts, stop)
    except InterruptedError:  # stopped while still entering the swarm: nothing to save yet
        sys.exit(128 + (stopped_by() or signal.SIGINT))
    except (
        AddressError,
        IdentityError,
        InitialPeersUnreachable,
        RunDefinitionMismatch,
        DataError,
        ConfigError,
        InvitationError,
    ) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        if monitor is not None:
            monitor.close()
    signum = stopped_by()
    sys.exit(128 + signum if code == 0 and signum is not None else code)


@main.command()
@run_config_options
@click.option(
    "--peers", default=4, show_default=True, type=click.IntRange(min=1), help="Peer processes to start."
)
@minutes_option
@run_dir_option(None, "Output directory (default: runs/local-<time>).")
@click.option("--no-live", is_flag=True, help="No live table (for logs and CI).")
@click.option(
    "--compare-independent",
    is_flag=True,
    help="Then run as many peers training alone (method independent, same rounds or --minutes, "
    "same data streams) and report the swarm's gain over them.",
)
@metrics_port_base_option
@dashboard_port_option
@tensorboard_dir_option
def local(
    config: str | None,
    method: str | None,
    rounds: int | None,
    seed: int | None,
    peers: int,
    minutes: float | None,
    run_dir: str | None,
    no_live: bool,
    compare_independent: bool,
    metrics_port_base: int | None,
    dashboard_port: int | None,
    tensorboard_dir: str | None,
) -> None:
    """Run a real swarm on this machine: one bootstrap node and N peer processes on loopback."""
    import os
    import time

    from p2p_trainer.run.launcher import LocalOptions
    from p2p_trainer.run.local_swarm import run_local
    from p2p_trainer.run.summary_text import local_summary_lines
    from p2p_trainer.train.checkpoint import atomic_write_text
    from p2p_trainer.train.data import DataError

    cfg = resolve_config(config, method, rounds, seed, tensorboard_dir=tensorboard_dir)
    _require_tensorboard(cfg)  # before any peer starts, not in each peer's log
    out = Path(run_dir or f"runs/local-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "config.toml"
    atomic_write_text(config_path, to_toml(cfg))
    threads = max(1, (os.cpu_count() or 1) // peers)  # peers share this machine's cores
    opts = LocalOptions(
        config_path=config_path,
        run=cfg,
        peers=peers,
        run_dir=out,
        max_minutes=minutes,
        torch_threads=threads,
        compare_independent=compare_independent,
        metrics_port_base=metrics_port_base,
        dashboard_port=dashboard_port,
    )
    stop = threading.Event()
    stopped_by = install_stop_handlers(stop)
    try:
        summary = run_local(opts, show=not no_live, stop=stop)
    except (RuntimeError, DataError) as exc:
        raise click.ClickException(str(exc)) from None
    for line in local_summary_lines(summary, peers, out):
        click.echo(line)
    signum = stopped_by()
    if signum is not None:
        sys.exit(128 + signum)


@main.command()
@click.argument("scenario_path", type=click.Path(exists=True, dir_okay=False))
@run_dir_option(None, "Output directory (default: runs/chaos-<name>-<time>).")
def chaos(scenario_path: str, run_dir: str | None) -> None:
    """Run a fault scenario (timed kills, stalls, restarts, link faults) on a local swarm; report it."""
    import time

    from rich.console import Console

    from p2p_trainer.lab.chaos.report import render_table
    from p2p_trainer.lab.chaos.runner import run_scenario
    from p2p_trainer.lab.chaos.timeline import ChaosScenarioError, load_chaos_scenario

    try:
        scenario = load_chaos_scenario(scenario_path)
    except ChaosScenarioError as exc:
        raise click.ClickException(str(exc)) from None
    out_dir = Path(run_dir or f"runs/chaos-{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    stop = threading.Event()
    stopped_by = install_stop_handlers(stop)
    try:
        report = run_scenario(scenario, out_dir, stop)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    console = Console()
    for ev in report["events"]:
        phase = "" if ev["phase_seen"] else " (phase not seen)"
        console.print(f"  {ev['at_s']:7.1f} s  {ev['event']}{phase}  {ev['detail']}")
    for ev in report["skipped_events"]:
        console.print(f"  skipped: {ev}")
    console.print(render_table(report))
    tpr = report["tokens_per_round"]
    if tpr.get("counted_rounds"):
        console.print(
            f"tokens per round vs target {tpr['target']}: mean |dev| {100 * tpr['mean_abs_deviation']:.1f}%, "
            f"max {100 * tpr['max_abs_deviation']:.1f}%, {tpr['within_5pct']}/{tpr['counted_rounds']} within 5%"
        )
    console.print(f"report: {out_dir / 'report.json'}")
    signum = stopped_by()
    if signum is not None:
        sys.exit(128 + signum)


@main.command()
@run_config_options
@click.option("--peers", default=4, show_default=True, type=click.IntRange(min=1), help="Peers to train.")
def inprocess(
    config: str | None, method: str | None, rounds: int | None, seed: int | None, peers: int
) -> None:
    """Train N peers in one process over the exact in-process backend (the reference for the swarm)."""
    from p2p_trainer.run.threads import run_inprocess
    from p2p_trainer.train.data import DataError

    cfg = resolve_config(config, method, rounds, seed)
    stop = threading.Event()
    stopped_by = install_stop_handlers(stop)
    try:
        result = run_inprocess(cfg, peers, stop=stop)
    except DataError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"method {cfg.outer.method}: validation loss per peer "
        f"{', '.join(f'{v:.3f}' for v in result.val_loss)}; averaged model {result.mean_model_val_loss:.3f}; "
        f"consensus distance {result.consensus_distance:.4f}; failed exchanges {result.failed_exchanges}"
    )
    signum = stopped_by()
    if signum is not None:
        sys.exit(128 + signum)


logging.getLogger(__name__).addHandler(logging.NullHandler())
