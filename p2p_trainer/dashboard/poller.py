"""The dashboard's reader thread: the swarm's heartbeats (and a run directory's exchanges) into
the history, every `interval_s`. A failed read is shown on the page; the next one tries again."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from p2p_trainer.dashboard.exchanges import RunDirExchanges
    from p2p_trainer.dashboard.history import SwarmHistory

logger = logging.getLogger(__name__)


class Poller:
    def __init__(
        self,
        read: Callable[[], dict[str, Any]],
        history: SwarmHistory,
        interval_s: float,
        exchanges: RunDirExchanges | None = None,
    ) -> None:
        """`read`: one read of the swarm as a `status_dict` object."""
        self.read, self.history, self.interval_s, self.exchanges = read, history, interval_s, exchanges
        self.stop_event = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dashboard-poller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.history.add_read(self.read())
            except Exception as exc:  # the page shows it; the swarm may answer the next read
                if self.stop_event.is_set():
                    return
                logger.warning("reading swarm %r failed: %s", self.history.swarm, exc)
                self.history.note_error(f"reading swarm {self.history.swarm!r} failed: {exc}")
            if self.exchanges is not None:
                try:
                    self.history.set_exchanges(self.exchanges.read())
                except Exception as exc:
                    logger.warning("reading the exchanges in %s failed: %s", self.exchanges.run_dir, exc)
            self.stop_event.wait(self.interval_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the thread to stop and wait for it (a read in progress ends within its call timeout)."""
        self.stop_event.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
