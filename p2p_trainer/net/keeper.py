"""Connections a peer behind NAT keeps open, so that others reach it without a relay.

Nobody can dial such a peer, but it can dial every reachable one, and a libp2p connection
carries streams both ways: once it has dialled a peer, that peer's messages to it take the same
connection. Every period the keeper dials the live peers it has no connection to (a stream to
the no-op HELLO protocol); a peer it cannot dial either (behind a NAT too) is tried again only
after `retry_s`, and is reached through a relay meanwhile (`message_relay.py`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from p2p_trainer.net.transport import Transport

logger = logging.getLogger(__name__)


class ConnectionKeeper:
    """A thread that keeps this peer connected to the live peers it can dial."""

    def __init__(
        self,
        transport: Transport,
        live_peers: Callable[[], list[str]],
        period_s: float = 2.0,
        retry_s: float = 30.0,
        dial_timeout_s: float = 10.0,
    ) -> None:
        self.transport = transport
        self.live_peers = live_peers
        self.period_s, self.retry_s, self.dial_timeout_s = period_s, retry_s, dial_timeout_s
        self.dialled: set[str] = set()
        """Peers this keeper connected to at least once."""
        self.connected: set[str] = set()
        """Live peers this peer had a connection to at the end of the last round (whoever opened it)."""
        self._failed: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nat-keeper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.transport.run(self._round(), timeout_s=self.dial_timeout_s + 5)
            except Exception as exc:  # a failed round is retried next period
                logger.debug("connection keeper: %s", exc)

    async def _round(self) -> None:
        now = time.monotonic()
        connected = await self.transport.connected_peers()
        live = [p for p in self.live_peers() if p != self.transport.peer_id]
        wanted = [p for p in live if p not in connected and self._failed.get(p, 0.0) <= now]
        results = await asyncio.gather(
            *(asyncio.wait_for(self.transport.connect(p), self.dial_timeout_s) for p in wanted),
            return_exceptions=True,
        )
        for peer, result in zip(wanted, results, strict=True):
            if isinstance(result, BaseException):
                self._failed[peer] = now + self.retry_s
            else:
                self._failed.pop(peer, None)
                if peer not in self.dialled:
                    logger.info("opened a connection to %s, which it can use to reach this peer", peer[-8:])
                self.dialled.add(peer)
                connected.add(peer)
        self.connected = {p for p in live if p in connected}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.dial_timeout_s + 10)
