"""Local suspicion of dead peers, faster than the heartbeat TTL.

A peer that took a message before and now refuses one is most likely dead: it is *suspect* for
`suspect_s` seconds, exchanges stop waiting for it, and it leaves this peer's view and, through
this peer's heartbeat, the others' (`swarm_view.py`). A peer
never reached yet is not suspected on a failed send (a new node's routing warms up for a few
seconds); it becomes suspect only when a send gives up for good. Any delivery clears suspicion.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class PeerHealth:
    def __init__(self, suspect_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.suspect_s, self._clock = suspect_s, clock
        self._reached: set[str] = set()
        self._suspect_until: dict[str, float] = {}
        self._lock = threading.Lock()

    def delivered(self, peer: str) -> None:
        with self._lock:
            self._reached.add(peer)
            self._suspect_until.pop(peer, None)

    def send_failed(self, peer: str) -> None:
        """One failed attempt: suspect only if this peer answered before."""
        with self._lock:
            if peer in self._reached:
                self._suspect_until[peer] = self._clock() + self.suspect_s

    def gave_up(self, peer: str) -> None:
        """Every attempt failed until the deadline."""
        with self._lock:
            self._suspect_until[peer] = self._clock() + self.suspect_s

    def suspect(self, peer: str) -> bool:
        with self._lock:
            until = self._suspect_until.get(peer)
            if until is not None and until <= self._clock():
                del self._suspect_until[peer]
                return False
            return until is not None

    def suspects(self) -> set[str]:
        return {p for p in list(self._suspect_until) if self.suspect(p)}
