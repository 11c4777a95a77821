"""`p2p-trainer status`: print a swarm's peers from their heartbeats, once, as JSON, or live.

hivemind is imported inside the command (`status_client.py`), so `p2p-trainer --help` stays fast.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import click

from p2p_trainer.cli_options import swarm_reader_options
from p2p_trainer.net.signals import install_stop_handlers

if TYPE_CHECKING:
    from rich.table import Table

    from p2p_trainer.net.status_client import StatusClient, SwarmStatus


def status_dict(status: SwarmStatus) -> dict[str, Any]:
    """The `--json` object: every field the heartbeats carry, per live peer."""
    return {
        "swarm": status.swarm,
        "unix_time": time.time(),
        "peers": [
            {
                "peer_id": p.heartbeat.peer_id,
                "round": p.heartbeat.round,
                "tokens_processed": p.heartbeat.tokens_processed,
                "loss": p.heartbeat.loss,
                "throughput_tokens_per_s": p.heartbeat.throughput_tokens_per_s,
                "software_version": p.heartbeat.software_version,
                "heartbeat_age_s": round(p.age_s, 3),
                "in_round_s": None if p.round_s is None else round(p.round_s, 3),
                "suspects": list(p.heartbeat.suspects),
                "step": p.heartbeat.step,
                "round_step": p.heartbeat.round_step,
                "round_steps": p.heartbeat.round_steps,
                "bytes_sent": p.heartbeat.bytes_sent,
                "bytes_received": p.heartbeat.bytes_received,
                "reachability": p.heartbeat.reachability or None,
                "last_exchange": p.heartbeat.last_exchange or None,
            }
            for p in status.peers
        ],
        "left": list(status.left),
        "records_rejected": status.rejected,
    }


def status_table(status: SwarmStatus) -> Table:
    from rich.table import Table

    table = Table(title=f"swarm {status.swarm!r}: {len(status.peers)} live peer(s) (full ids: --json)")
    columns = ("peer", "round", "step", "in round", "loss", "tokens", "tok/s", "sent/received")
    for col in (*columns, "reach", "exchange", "version", "beat", "suspects"):
        table.add_column(col)
    for p in status.peers:
        h = p.heartbeat
        table.add_row(
            h.peer_id[-8:],
            str(h.round),
            step_text(h.round_step, h.round_steps, h.step),
            "-" if p.round_s is None else f"{p.round_s:.0f} s",
            "-" if h.loss is None else f"{h.loss:.3f}",
            str(h.tokens_processed),
            f"{h.throughput_tokens_per_s:.0f}",
            f"{byte_text(h.bytes_sent)} / {byte_text(h.bytes_received)}",
            h.reachability or "-",  # "": a peer of an older version, which does not say
            h.last_exchange or "-",
            h.software_version,
            f"{p.age_s:.0f} s ago",  # the heartbeat's age
            ", ".join(s[-8:] for s in h.suspects) or "-",
        )
    notes = []
    if status.left:
        notes.append(f"left: {', '.join(p[-8:] for p in status.left)}")
    if status.rejected:
        notes.append("records rejected: " + ", ".join(f"{k} {v}" for k, v in sorted(status.rejected.items())))
    if notes:
        table.caption = "; ".join(notes)
    return table


def step_text(round_step: int, round_steps: int, step: int) -> str:
    """ "7/20 (147)": inner step 7 of the round's 20, 147 over the run; a peer of an older version
    reports neither ("-")."""
    if not round_steps:
        return str(step) if step else "-"
    return f"{round_step}/{round_steps} ({step})"


def byte_text(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


@click.command("status")
@swarm_reader_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON (with --watch: one object per line).")
@click.option("--watch", is_flag=True, help="Keep printing until Ctrl-C.")
@click.option(
    "--interval-s",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0.5),
    help="Seconds between reads with --watch.",
)
def status(initial_peers: tuple[str, ...], swarm: str, as_json: bool, watch: bool, interval_s: float) -> None:
    """Show a swarm's peers (round, step, loss, throughput, bytes, reachability, last exchange,
    version) from outside it: read-only, never a peer."""
    from p2p_trainer.net.addresses import AddressError
    from p2p_trainer.net.dht import DHTCallTimeout, InitialPeersUnreachable
    from p2p_trainer.net.status_client import StatusClient

    stop = threading.Event()
    stopped_by = install_stop_handlers(stop)
    try:
        client = StatusClient(initial_peers)
    except (AddressError, InitialPeersUnreachable) as exc:
        raise click.ClickException(str(exc)) from None
    with client:
        try:
            if watch and not as_json:
                _watch_table(client, swarm, interval_s, stop)
            else:
                while True:
                    found = client.read(swarm)
                    if as_json:
                        click.echo(json.dumps(status_dict(found), indent=None if watch else 2))
                    else:
                        from rich.console import Console

                        Console().print(status_table(found))
                    if not watch or stop.wait(interval_s):
                        break
        except DHTCallTimeout as exc:
            raise click.ClickException(f"reading swarm {swarm!r} failed: {exc}") from None
    signum = stopped_by()
    if signum is not None:
        sys.exit(128 + signum)


def _watch_table(client: StatusClient, swarm: str, interval_s: float, stop: threading.Event) -> None:
    from rich.live import Live

    with Live(status_table(client.read(swarm)), refresh_per_second=1) as live:
        while not stop.wait(interval_s):
            live.update(status_table(client.read(swarm)))
