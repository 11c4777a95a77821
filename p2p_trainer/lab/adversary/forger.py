"""Forged heartbeat records, written with our own record encoders straight into the swarm's DHT.

Each attack is a function from what the attacker sees (the swarm's records) to the records it
stores, once per period, with expirations later than the honest peers' own so that its version
of a subkey wins (hivemind keeps the entry with the latest expiration). Records are sealed the
way honest ones are (`net/envelope.py`), with the keys the attacker holds: its own for records
of its own id, a fresh key per phantom in a flood, and its own again for records under an honest
peer's id (it cannot have theirs). A replay stores an honest peer's sealed record as read: its
first heartbeat (`replay`), or the tombstone it left behind when it stopped (`replay-leave`),
which evicts it from the views that believe it once it has come back.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import nacl.signing

from p2p_trainer import __version__
from p2p_trainer.lab.adversary.attacks import Attack
from p2p_trainer.lab.adversary.node import every
from p2p_trainer.net import records
from p2p_trainer.net.envelope import EnvelopeError, Signer, open_envelope
from p2p_trainer.net.records import DHTLike, Heartbeat

logger = logging.getLogger(__name__)

OUTLIVE_S = 60.0
"""How much later than now a forged record expires: longer than any honest heartbeat's TTL."""
PERIOD_S = 0.5


@dataclass
class Seen:
    """What the attacker has read from the swarm's peers record."""

    rounds: dict[str, int] = field(default_factory=dict)
    """Latest round of each peer id whose heartbeat decodes."""
    first: dict[str, bytes] = field(default_factory=dict)
    """The first raw record seen under each subkey (what a replay stores again)."""
    tombstones: dict[str, bytes] = field(default_factory=dict)
    """The latest raw tombstone (a heartbeat saying `leaving`) seen under each subkey."""

    def read(self, dht: DHTLike, run_name: str) -> None:
        found = dht.get(records.heartbeat_key(run_name), latest=True)
        entries = getattr(found, "value", None)
        if not isinstance(entries, dict):
            return
        for subkey, entry in entries.items():
            raw = getattr(entry, "value", None)
            if isinstance(subkey, str) and isinstance(raw, bytes):
                self.first.setdefault(subkey, raw)
                try:
                    heartbeat = Heartbeat.decode(open_envelope(raw).body)
                except (records.RecordError, EnvelopeError):
                    continue
                self.rounds[subkey] = heartbeat.round
                if heartbeat.leaving:
                    self.tombstones[subkey] = raw

    def swarm_round(self, victims: list[str]) -> int:
        return max((self.rounds.get(v, 0) for v in victims), default=0)


def beat(peer_id: str, round: int = 0, *, leaving: bool = False, round_started: float = 0.0) -> bytes:
    """A heartbeat body (what honest peers seal) with these fields and plausible others."""
    return Heartbeat(
        peer_id=peer_id,
        round=round,
        tokens_processed=0,
        loss=None,
        throughput_tokens_per_s=1e4,
        software_version=__version__,
        timestamp=records.now(),
        leaving=leaving,
        round_started=round_started,
    ).encode()


def new_signer() -> Signer:
    return Signer(nacl.signing.SigningKey.generate())


@dataclass(frozen=True)
class Forged:
    """One record to store under `subkey`: a body sealed by `signer` now, or a sealed record as is."""

    subkey: str
    body: bytes = b""
    signer: Signer | None = None
    sealed: bytes = b""

    def value(self, key: str, expiration_time: float) -> bytes:
        if self.signer is None:
            return self.sealed
        return self.signer.seal(key, self.subkey, expiration_time, self.body)


@dataclass
class Forger:
    """The attacker's keys and what it forges each period."""

    attack: Attack
    victims: list[str]
    own: Signer = field(default_factory=new_signer)
    phantoms: list[Signer] = field(default_factory=list)

    def forge(self, seen: Seen) -> list[Forged]:
        name, arg, me, victims = self.attack.name, self.attack.arg, self.own, self.victims
        rnd = seen.swarm_round(victims)
        if name == "impersonate":  # round 0: still joining, so left out of every group
            return [Forged(v, beat(v, 0), me) for v in victims]
        if name == "huge-round":
            return [Forged(me.peer_id, beat(me.peer_id, int(arg)), me)]
        if name == "far-round-start":
            started = max(1.0, records.now() - arg)
            return [Forged(me.peer_id, beat(me.peer_id, rnd, round_started=started), me)]
        if name == "replay":
            return [Forged(v, sealed=seen.first[v]) for v in victims if v in seen.first]
        if name == "replay-leave":
            return [Forged(v, sealed=seen.tombstones[v]) for v in victims if v in seen.tombstones]
        if name == "tombstone":
            return [Forged(v, beat(v, seen.rounds.get(v, 0), leaving=True), me) for v in victims]
        if name == "flood":  # peers that do not exist, each with a key of its own
            while len(self.phantoms) < int(arg):
                self.phantoms.append(new_signer())
            return [Forged(p.peer_id, beat(p.peer_id, rnd), p) for p in self.phantoms]
        raise ValueError(f"{self.attack} is not a record attack")


def forge_records(
    dht: DHTLike, run_name: str, attack: Attack, victims: list[str], stop: threading.Event
) -> int:
    """Store `attack`'s records every period until `stop`; returns how many stores the DHT took."""
    forger, seen, stored, tried = Forger(attack, victims), Seen(), 0, 0
    key = records.heartbeat_key(run_name)
    for tick in every(PERIOD_S, stop):
        try:
            seen.read(dht, run_name)
            expiration = records.now() + OUTLIVE_S
            for rec in forger.forge(seen):
                tried += 1
                stored += bool(dht.store(key, rec.value(key, expiration), expiration, subkey=rec.subkey))
        except Exception as exc:  # the swarm's DHT may refuse or time out: keep attacking
            logger.info("adversary: forging failed this period: %s", exc)
        if tick % 10 == 0:
            # a defended swarm's DHT refuses them: what was tried shows the attack was made
            logger.warning("adversary: %s stored %d of %d forged records so far", attack, stored, tried)
    return stored
