"""The butterfly's messages (`allreduce.py`): number formats, the checks on what arrives, delivery.

Each value message carries its weight ("w") and number format ("dt") in its header; a receiver
checks both, the payload's size and the values' finiteness before anything is merged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np

from p2p_trainer.exchange.interface import valid_weight
from p2p_trainer.net.health import PeerHealth
from p2p_trainer.net.transport import Message, Transport

logger = logging.getLogger(__name__)


WIRE_FORMATS: dict[str, np.dtype[Any]] = {"f4": np.dtype(np.float32), "f2": np.dtype(np.float16)}
FLOAT16_MAX = float(np.finfo(np.float16).max)


def encode_values(values: np.ndarray, wire_dtype: str) -> tuple[bytes, str, np.ndarray]:
    """The bytes to send, their format tag, and the values as the receiver will decode them.

    float16 is used only where every value fits its range: a part that overflowed would arrive as
    inf and be rejected, so it goes as float32 instead (rare: parameters and their deltas are small).
    """
    if wire_dtype == "float16" and (values.size == 0 or float(np.abs(values).max()) <= FLOAT16_MAX):
        half = values.astype(np.float16)
        return half.tobytes(), "f2", half.astype(np.float32)
    return values.astype(np.float32).tobytes(), "f4", values


def check_message(
    msg: Message | None, expected_floats: int, max_weight: float
) -> tuple[np.ndarray, float] | str:
    if msg is None:
        return "did not arrive before the deadline"
    weight = msg.header.get("w")
    if not isinstance(weight, int | float) or not valid_weight(float(weight), max_weight):
        return f"weight {weight!r} is not finite, positive and <= {max_weight}"
    fmt = WIRE_FORMATS.get(str(msg.header.get("dt", "f4")))
    if fmt is None:
        return f"unknown number format {msg.header.get('dt')!r} (expected one of {', '.join(WIRE_FORMATS)})"
    if len(msg.payload) != fmt.itemsize * expected_floats:
        return f"{len(msg.payload)} bytes, expected {fmt.itemsize * expected_floats} ({fmt.name})"
    values = np.frombuffer(msg.payload, dtype=fmt).astype(np.float32, copy=False)
    if not np.isfinite(values).all():
        return "non-finite values"
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
