"""The attacks a hostile node can make, by name: `NAME[:ARG]` on its command line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["peer", "records", "donor", "streams"]

ATTACKS: dict[str, tuple[Kind, float, str]] = {
    "scale": ("peer", 1e3, "every contribution multiplied by ARG"),
    "flip": ("peer", 10.0, "every contribution multiplied by -ARG"),
    "drift": ("peer", 5.0, "every contribution replaced by one fixed direction, at ARG times its norm"),
    "nan": ("peer", 0.0, "every contribution's values replaced by NaN"),
    "weight": ("peer", 3.996, "claims ARG times its weight (just under the 4x bound), update sign-flipped"),
    "owner": ("peer", 10.0, "as a part owner, returns its averaged part multiplied by -ARG"),
    "spam": (
        "peer",
        32.0,
        "with each exchange message, ARG more of the largest size, under keys nobody reads",
    ),
    "impersonate": ("records", 0.0, "heartbeats under the honest peers' ids, saying they are still joining"),
    "huge-round": ("records", 1e9, "a heartbeat claiming round ARG"),
    "far-round-start": ("records", 3600.0, "a heartbeat at the swarm's round, started ARG seconds ago"),
    "replay": ("records", 0.0, "the honest peers' first heartbeats, stored again and again"),
    "replay-leave": ("records", 0.0, "a peer's tombstone from when it left, stored again after it came back"),
    "tombstone": ("records", 0.0, "tombstones (leaving) under the honest peers' ids"),
    "flood": ("records", 100.0, "ARG heartbeats of peers that do not exist, at the swarm's round"),
    "donor": ("donor", 1e9, "serves poisoned state to joiners, advertised at round ARG"),
    "donor-late": (
        "donor",
        60.0,
        "serves the seed's weights ARG rounds ahead of the swarm's latest round, advertised only once"
        " the swarm trains: what a peer joining it later sees first",
    ),
    "donor-momentum": (
        "donor",
        1.0,
        "serves the seed's weights (every peer's own at the start) at round ARG, with an outer"
        " momentum of 1000x those weights",
    ),
    "streams": ("streams", 200.0, "ARG streams per honest peer that send a header and never finish"),
}
"""name -> (kind of attacker, default ARG, what it does)."""


@dataclass(frozen=True)
class Attack:
    name: str
    """One of `ATTACKS`."""
    arg: float
    """The attack's parameter (its default unless given after a colon)."""

    @property
    def kind(self) -> Kind:
        return ATTACKS[self.name][0]

    def __str__(self) -> str:
        return f"{self.name}:{self.arg:g}"


def parse_attack(text: str) -> Attack:
    """'NAME[:ARG]' -> Attack; ValueError with a message that lists the names."""
    name, _, arg = text.partition(":")
    if name not in ATTACKS:
        raise ValueError(f"unknown attack {name!r}: use one of {', '.join(ATTACKS)}")
    try:
        value = float(arg) if arg else ATTACKS[name][1]
    except ValueError:
        raise ValueError(f"attack {text!r}: ARG must be a number") from None
    return Attack(name, value)
