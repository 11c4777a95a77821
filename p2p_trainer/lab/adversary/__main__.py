"""`python -m p2p_trainer.lab.adversary KIND --attack NAME[:ARG] ...`: start one hostile node.

- `peer --attack A join ARGS...`: `p2p-trainer join ARGS...` with `HostileTransport` in place of
  the transport `run/join.py` builds (nothing else of the peer changes);
- `records|donor|streams --attack A --initial-peers ADDR ... [--victim ID ...] [--config PATH]`:
  a separate attacker node that runs until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from p2p_trainer.lab.adversary.attacks import ATTACKS, Attack, parse_attack
from p2p_trainer.logs import setup_logging
from p2p_trainer.net.signals import install_stop_handlers

logger = logging.getLogger(__name__)


def _parse(text: str) -> Attack:
    try:
        return parse_attack(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _attack(kind: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m p2p_trainer.lab.adversary {kind}", add_help=False)
    names = [n for n, (k, _, _) in ATTACKS.items() if k == kind]
    parser.add_argument(
        "--attack", required=True, type=_parse, help="NAME[:ARG], NAME in " + ", ".join(names)
    )
    return parser


def run_hostile_peer(attack: Attack, join_args: Sequence[str]) -> None:
    """`p2p-trainer join` with its transport tampering; exits like join does."""
    from p2p_trainer import cli
    from p2p_trainer.lab.adversary.tamper import HostileTransport
    from p2p_trainer.run import join

    # join builds its transport by this name; the hostile peer is otherwise the honest code
    assert isinstance(join.Transport, type), "run/join.py no longer builds a Transport by name"
    setattr(join, "Transport", functools.partial(HostileTransport, attack=attack))  # noqa: B010
    cli.main(args=list(join_args), prog_name="p2p-trainer")


def run_attacker(kind: str, argv: Sequence[str]) -> int:
    parser = _attack(kind)
    parser.add_argument("--initial-peers", action="append", required=True)
    parser.add_argument("--victim", action="append", default=[], help="An honest peer's id (repeatable).")
    parser.add_argument("--swarm", default="default")
    parser.add_argument("--config", default=None, help="The run config (donor: what it serves).")
    parser.add_argument("--advertise-s", type=float, default=float("inf"), help="donor: heartbeat this long.")
    parser.add_argument(
        "--identity", type=Path, default=None, help="donor: its node key (created if missing)."
    )
    opts = parser.parse_args(argv)
    if opts.attack.kind != kind:
        parser.error(f"attack {opts.attack.name} is made by `{opts.attack.kind}`, not `{kind}`")
    from p2p_trainer.config import load_config
    from p2p_trainer.lab.adversary.node import attacker_dht, identity_signer
    from p2p_trainer.net.transport import Transport

    stop = threading.Event()
    install_stop_handlers(stop)
    if kind == "donor" and opts.identity is None:
        parser.error("donor needs --identity: its heartbeat is sealed with its node's key")
    with attacker_dht(opts.initial_peers, opts.identity) as dht:
        if kind == "records":
            from p2p_trainer.lab.adversary.forger import forge_records

            forge_records(dht, opts.swarm, opts.attack, opts.victim, stop)
            return 0
        cfg = load_config(opts.config)
        transport = Transport(dht, max_payload_bytes=1 << 20)
        try:
            if kind == "donor":
                from p2p_trainer.lab.adversary.donor import serve_poison

                signer = identity_signer(opts.identity)
                serve_poison(dht, transport, signer, cfg, opts.swarm, opts.attack, opts.advertise_s, stop)
            else:
                from p2p_trainer.lab.adversary.streams import hold_streams

                hold_streams(dht, transport, opts.victim, opts.attack, stop)
        finally:
            transport.close()
    return 0


def main(argv: Sequence[str]) -> int:
    setup_logging("INFO")
    if not argv or argv[0] not in ("peer", "records", "donor", "streams"):
        print(__doc__, file=sys.stderr)
        return 2
    kind, rest = argv[0], list(argv[1:])
    if kind == "peer":
        opts, join_args = _attack("peer").parse_known_args(rest)
        if opts.attack.kind != "peer":
            raise SystemExit(f"attack {opts.attack.name} is not made by a training peer")
        run_hostile_peer(opts.attack, join_args)
        return 0
    return run_attacker(kind, rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
