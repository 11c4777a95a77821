"""A rate limit on the state server (SECURITY.md, "Quotas"): what one sender, or all of them,
can make this peer upload.

A full state is the whole model and its momentum, so a joiner that asks again and again (or many
identities that each ask once) could keep this peer's uplink busy for as long as they like. Each
sender may take `per_minute` full states in any minute (a token bucket: a burst of that many,
refilled at that rate), and at most `concurrent` full transfers run at once whoever asks. A
header-only request (a joiner confirming another donor's hash, or asking which round it serves)
costs a tenth of a full one. A
refused request is answered with the time to wait, so an honest joiner tries another donor.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

MAX_SENDERS = 1024
"""Buckets kept; the least recently seen sender's is forgotten first (it starts full again)."""
HEADER_COST = 0.1


class ServeLimits:
    def __init__(
        self, per_minute: float, concurrent: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_minute, self.concurrent, self.clock = per_minute, concurrent, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        """Sender -> (tokens, time of the last update)."""
        self._running = 0
        self._lock = threading.Lock()

    def _tokens(self, sender: str, now: float) -> float:
        tokens, at = self._buckets.get(sender, (self.per_minute, now))
        return min(self.per_minute, tokens + (now - at) * self.per_minute / 60.0)

    def refusal(self, sender: str, header_only: bool) -> str | None:
        """Why `sender`'s request is refused now, or None (then `done` must follow a full one)."""
        cost = HEADER_COST if header_only else 1.0
        with self._lock:
            now = self.clock()
            tokens = self._tokens(sender, now)
            if tokens < cost:
                wait_s = (cost - tokens) * 60.0 / self.per_minute
                return (
                    f"rate limited: {self.per_minute:g} states per minute per peer; retry in {wait_s:.0f} s"
                )
            if not header_only and self._running >= self.concurrent:
                return f"busy: {self.concurrent} state transfers already running; retry shortly"
            self._buckets[sender] = (tokens - cost, now)
            self._buckets.move_to_end(sender)
            while len(self._buckets) > MAX_SENDERS:
                self._buckets.popitem(last=False)
            self._running += 0 if header_only else 1
        return None

    def done(self) -> None:
        """A full transfer that `refusal` let through has ended (however it ended)."""
        with self._lock:
            self._running = max(0, self._running - 1)
