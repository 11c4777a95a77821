"""The butterfly's messages (`allreduce.py`): number formats, the checks on what arrives, delivery.

Each value message carries its weight ("w"), value count ("n") and codec ("dt", with its block
"b" and top-k "k" where it has them) in its header; a receiver checks them all, the payload
against them (`exchange/codecs.py`) and the values' finiteness before anything is merged.
A contribution may also carry its sender's state digest ("sd"), only ever compared with the
receiver's own (`allreduce.py`), and its ask for a re-agreement ("ra", taken only where it is
`true`).
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np

from p2p_trainer.exchange.codecs import decode
from p2p_trainer.exchange.interface import valid_weight
from p2p_trainer.net.health import PeerHealth
from p2p_trainer.net.transport import Message, Transport

logger = logging.getLogger(__name__)


def check_message(
    msg: Message | None, expected_floats: int, max_weight: float
) -> tuple[np.ndarray, float] | str:
    """A message's values and weight, or why it is unusable (its codec checks the payload)."""
    if msg is None:
        return "did not arrive before the deadline"
    weight = msg.header.get("w")
    if not isinstance(weight, int | float) or not valid_weight(float(weight), max_weight):
        return f"weight {weight!r} is not finite, positive and <= {max_weight}"
    count = msg.header.get("n", expected_floats)
    if count != expected_floats:
        return f"says it carries {count!r} values, expected {expected_floats}"
    values = decode(msg.header, msg.payload, expected_floats)
    if isinstance(values, str):
        return values
    return values, float(weight)


async def send_with_retries(
    transport: Transport,
    peer: str,
    header: dict[str, object],
    payload: bytes,
    deadline: float,
    health: PeerHealth | None = None,
) -> bool:
    """Deliver one message before `deadline`, retrying with backoff.

    A peer that just joined may not be routable for a few seconds (libp2p routing warms up); a
    member that stays unreachable is a missing contribution, not a crash.
    """
    delay_s = 0.25
    while True:
        try:
            await asyncio.wait_for(
                transport.send(peer, header, payload), max(0.01, deadline - time.monotonic())
            )
            if health is not None:
                health.delivered(peer)
            return True
        except Exception as exc:  # p2pd reports unreachable peers with several error types
            if health is not None:
                health.send_failed(peer)
            if time.monotonic() + delay_s >= deadline:
                logger.info(
                    "send to %s failed for good: %s", peer[-8:], (str(exc) or repr(exc)).splitlines()[0]
                )
                if health is not None:
                    health.gave_up(peer)
                return False
            await asyncio.sleep(delay_s)
            delay_s = min(2.0, 2 * delay_s)
