"""The hostile training peer: `p2p-trainer join` whose outgoing exchange messages are tampered with.

Every value a peer sends in an exchange leaves through `Transport.send` (`net/allreduce.py`):
phase-1 contributions under keys `...|c|<part>`, phase-2 results under `...|r|<part>`, each with
its weight (`w`) and number format (`dt`) in the header. `HostileTransport` rewrites those on the
way out, so the rest of the peer (training, groups, heartbeats, state server) is the honest code
and the attack looks to the others exactly like a peer that lies about its values.

`spam` sends its exchange messages unchanged and, with each, more complete messages of the
largest size a receiver takes, under keys no exchange reads: they wait in the receiver's mailbox
until its bounds evict them, which only a per-sender quota keeps small.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import numpy as np

from p2p_trainer.exchange.codecs import decode
from p2p_trainer.lab.adversary.attacks import Attack
from p2p_trainer.net.transport import Transport

logger = logging.getLogger(__name__)

REPORT_EVERY = 20
"""Log the tampering count after this many tampered messages (the tests look for the line)."""


def phase_of(header: dict[str, Any]) -> str:
    """'c' (contribution), 'r' (part owner's result) or '' for an exchange message's key."""
    parts = str(header.get("key", "")).rsplit("|", 2)
    return parts[1] if len(parts) == 3 and parts[1] in ("c", "r") else ""


def tamper(attack: Attack, header: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes] | None:
    """The message the hostile peer sends instead, or None to send it unchanged."""
    phase = phase_of(header)
    wanted = "r" if attack.name == "owner" else "c"
    count = header.get("n")
    if phase != wanted or not isinstance(count, int):
        return None
    decoded = decode(header, payload, count)
    if isinstance(decoded, str):
        return None
    values = decoded.astype(np.float64)
    out = {k: v for k, v in header.items() if k not in ("b", "k")}
    if attack.name == "scale":
        values = values * attack.arg
    elif attack.name in ("flip", "owner"):
        values = values * -attack.arg
    elif attack.name == "drift":
        # one direction, the same every round (seeded by the part's size), unrelated to training:
        # at a norm the bounds allow where the reference is zero (a Δ: DiLoCo's outer exchange,
        # Mix2), and nearly orthogonal to every honest update, so it passes the cosine floor too
        direction = np.random.default_rng(values.size).standard_normal(values.size)
        values = direction * (attack.arg * np.linalg.norm(values) / np.linalg.norm(direction))
    elif attack.name == "nan":
        values = np.full_like(values, np.nan)
    elif attack.name == "weight":
        values = -values
        weight = header.get("w")
        if isinstance(weight, int | float):
            out["w"] = float(weight) * attack.arg
    else:
        return None
    # float32 always: a scaled part would overflow float16 and arrive as inf, and a sparse
    # codec would keep only some of what the attack changed
    out["dt"] = "f4"
    return out, values.astype(np.float32).tobytes()


class HostileTransport(Transport):
    """A `Transport` that applies `attack` to the exchange messages it sends."""

    def __init__(self, *args: Any, attack: Attack, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.attack = attack
        self.tampered = 0
        self._spamming: set[asyncio.Task[None]] = set()
        logger.warning("adversary: peer %s attacks with %s", self.peer_id, attack)

    async def send(self, peer_id: str, header: dict[str, Any], payload: bytes = b"") -> None:
        if self.attack.name == "spam" and phase_of(header):
            # in the background, so the attacker's own exchange is not held up by it
            task = asyncio.get_running_loop().create_task(self._spam(peer_id, str(header["key"])))
            self._spamming.add(task)
            task.add_done_callback(self._spamming.discard)
        changed = tamper(self.attack, header, payload)
        if changed is not None:
            header, payload = changed
            self.tampered += 1
            if self.tampered % REPORT_EVERY == 1:
                logger.warning("adversary: tampered %d messages (%s)", self.tampered, self.attack)
        await super().send(peer_id, header, payload)

    async def _spam(self, peer_id: str, key: str) -> None:
        junk = bytes(self.max_payload_bytes)
        for _ in range(int(self.attack.arg)):
            try:
                await super().send(peer_id, {"key": f"{key}~{os.urandom(8).hex()}"}, junk)
            except Exception as exc:  # the receiver closed the stream or left: next message
                logger.info("adversary: spam to %s: %s", peer_id[-8:], exc)
                return
            self.tampered += 1
            if self.tampered % (REPORT_EVERY * 10) == 1:
                logger.warning("adversary: tampered %d messages (%s)", self.tampered, self.attack)
