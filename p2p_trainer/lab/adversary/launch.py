"""Command lines of hostile nodes, built on the honest ones (`run/launcher.py`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from p2p_trainer.lab.adversary.attacks import Attack
from p2p_trainer.run.launcher import JoinArgs, join_argv, python_argv

ENTRY = "p2p_trainer.lab.adversary"


def hostile_peer_argv(args: JoinArgs, initial_peers: str, attack: Attack) -> list[str]:
    """The `join` command line of an honest peer with these options, run as a hostile peer."""
    join = join_argv(args, initial_peers)[len(python_argv()) :]
    return [sys.executable, "-m", ENTRY, "peer", "--attack", str(attack), *join]


def attacker_argv(
    attack: Attack,
    initial_peers: str,
    victims: Sequence[str] = (),
    config: Path | None = None,
    swarm: str = "default",
    advertise_s: float | None = None,
    identity: Path | None = None,
) -> list[str]:
    """A separate attacker node (`records`, `donor` or `streams`, from the attack's kind)."""
    argv = [sys.executable, "-m", ENTRY, attack.kind, "--attack", str(attack), *initial_peers.split()]
    argv += ["--swarm", swarm]
    for victim in victims:
        argv += ["--victim", victim]
    if config is not None:
        argv += ["--config", str(config)]
    if identity is not None:
        argv += ["--identity", str(identity)]
    if advertise_s is not None:
        argv += ["--advertise-s", f"{advertise_s:g}"]
    return argv
