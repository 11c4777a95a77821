"""What a bootstrap node serves besides the DHT: the dial-back check and the relay.

Both run on a replica of the node's p2pd in an asyncio loop of their own (a daemon thread), so a
node without training (`p2p-trainer bootstrap`) serves peers behind NAT (`reach.py`, `message_relay.py`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading

from hivemind import DHT
from hivemind.p2p import P2P

from p2p_trainer.net import reach
from p2p_trainer.net.message_relay import RelayLimits, RelayService
from p2p_trainer.net.stream_gate import StreamGate, open_gate, remove_all
from p2p_trainer.processes import own_unix_socket_paths, remove_files

logger = logging.getLogger(__name__)


class NodeServices:
    """Dial-back always; the relay unless `relay` is False. `close()` stops both."""

    def __init__(self, dht: DHT, relay: bool = True, limits: RelayLimits = RelayLimits()) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="node-services", daemon=True)
        self._thread.start()
        self.relay: RelayService | None = None
        self.gate: StreamGate
        """Takes the dial-back and relay streams, a bounded number per sender (`stream_gate.py`)."""
        try:
            self.p2p: P2P = self._run(self._start(dht, relay, limits), 60.0)
        except BaseException:
            self._stop_loop()
            raise

    def _run(self, coro: object, timeout_s: float) -> P2P:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)  # type: ignore[arg-type]

    async def _start(self, dht: DHT, relay: bool, limits: RelayLimits) -> P2P:
        p2p = await dht.replicate_p2p()

        async def register(gate: StreamGate) -> None:
            await reach.add_dialback(gate)
            if relay:
                self.relay = RelayService(p2p, limits)
                await self.relay.start(gate)

        self.gate = await open_gate(p2p, register)
        return p2p

    def close(self) -> None:
        if self.relay is not None:
            logger.info("relayed %d messages (%d refused)", self.relay.forwarded, self.relay.refused)
        # hivemind's client socket files are ours to remove: p2pd does not unlink them on shutdown
        own_sockets = own_unix_socket_paths()

        async def stop() -> None:
            await remove_all(self.gate)
            with contextlib.suppress(Exception):  # the daemon may already be gone at shutdown
                await self.p2p.shutdown()

        if self._loop.is_running():
            with contextlib.suppress(concurrent.futures.TimeoutError):
                asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5.0)
        self._stop_loop()
        remove_files(own_sockets)

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
