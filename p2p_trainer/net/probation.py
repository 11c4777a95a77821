"""Peers on probation: in an open swarm, a heartbeat alone does not put a peer in this one's groups.

A signature proves only that the writer holds a key, and keys cost nothing: one node can sign
heartbeats for a hundred peers that do not exist, and the groups drawn from a view holding them
wait on phantoms in almost every round (docs/security-results.md, `flood:100`). What a phantom
cannot do is answer a stream opened to its peer id: libp2p authenticates the remote end with the
key behind that id, so every answering phantom is a running host of the attacker's.

So with the defences on, an open swarm's view shows only the peers this one has seen alive: those
whose messages reached it (or that took one from it), and those that answered a probe, a stream
to the no-op HELLO protocol, directly or, for a peer behind NAT, through a relay
(`message_relay.py`). A peer that has not answered is probed again after a backoff that doubles
up to `MAX_RETRY_S`; one this peer suspects (a send to it failed) is back on probation. Every
honest view probes the same peers and gets the same answers within about a period, so the views
stay alike and the groups drawn from them too. A closed swarm needs none of this: its views hold
admitted peers only (`admission.py`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 8.0
"""How long one probe may take: a direct dial (which may search the p2p DHT for an id nobody
runs), then the relays."""
FIRST_RETRY_S = 1.0
MAX_RETRY_S = 60.0
FIRST_ROUND_S = 5.0
"""How long `start` waits for the peers in view at that time to answer (honest ones take ms)."""
MAX_IN_FLIGHT = 16
"""Probes at once: each holds a connection to p2pd, and the phantoms' number is the attacker's."""


class Probation:
    """Which peers this one has seen alive, and when to probe the others again (no I/O)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.vouched: set[str] = set()
        self._retry_at: dict[str, float] = {}
        self._backoff: dict[str, float] = {}
        self._in_flight: set[str] = set()
        self.failed = 0
        """Probes that found nobody (over the run)."""

    def due(self, candidates: set[str], exempt: set[str]) -> list[str]:
        """The candidates to probe now, at most `MAX_IN_FLIGHT` in flight (each until `answered`):
        peers never probed first, so a newcomer does not queue behind phantoms tried before."""
        now = self.clock()
        ready = [
            p
            for p in candidates - self.vouched - exempt - self._in_flight
            if self._retry_at.get(p, 0.0) <= now
        ]
        ready.sort(key=lambda p: (self._backoff.get(p, 0.0), p))
        todo = ready[: max(0, MAX_IN_FLIGHT - len(self._in_flight))]
        self._in_flight.update(todo)
        return todo

    def answered(self, peer: str, alive: bool) -> None:
        self._in_flight.discard(peer)
        if alive:
            self.vouched.add(peer)
            self._retry_at.pop(peer, None)
            self._backoff.pop(peer, None)
            return
        self.failed += 1
        wait_s = min(MAX_RETRY_S, 2 * self._backoff.get(peer, FIRST_RETRY_S / 2))
        self._backoff[peer] = wait_s
        self._retry_at[peer] = self.clock() + wait_s

    def suspect(self, peers: set[str]) -> None:
        """`peers` failed a send: they must answer a probe again before they count."""
        self.vouched -= peers

    def forget(self, keep: set[str]) -> None:
        """Drop what is known of peers no longer in view (a long run meets many)."""
        for table in (self._retry_at, self._backoff):
            for peer in set(table) - keep:
                del table[peer]
        self.vouched &= keep

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)


class Prober:
    """A thread that probes the view's candidates (`candidates()`) with `probe(peer)` on an
    asyncio loop (`submit`), as `Probation` says; `seen()` is what the view may show."""

    def __init__(
        self,
        candidates: Callable[[], set[str]],
        exempt: Callable[[], set[str]],
        suspects: Callable[[], set[str]],
        probe: Callable[[str], Coroutine[Any, Any, bool]],
        submit: Callable[[Coroutine[Any, Any, bool]], concurrent.futures.Future[bool]],
        period_s: float = 0.5,
    ) -> None:
        self.candidates, self.exempt, self.suspects = candidates, exempt, suspects
        self.probe, self.submit, self.period_s = probe, submit, period_s
        self.probation = Probation()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, first_round_s: float = FIRST_ROUND_S) -> None:
        """Probe the peers in view now, wait up to `first_round_s` for them, then keep probing."""
        deadline = time.monotonic() + first_round_s
        while pending := self._launch():
            concurrent.futures.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
            if time.monotonic() >= deadline:
                break
        self._thread = threading.Thread(target=self._run, name="probation", daemon=True)
        self._thread.start()

    def seen(self) -> set[str]:
        with self._lock:
            return set(self.probation.vouched)

    def _launch(self) -> list[concurrent.futures.Future[bool]]:
        candidates = self.candidates()
        with self._lock:
            self.probation.suspect(self.suspects())
            self.probation.forget(candidates)
            todo = self.probation.due(candidates, self.exempt())
        return [self._probe(peer) for peer in todo]

    def _probe(self, peer: str) -> concurrent.futures.Future[bool]:
        future = self.submit(self._timed(peer))
        future.add_done_callback(lambda done: self._answered(peer, done))
        return future

    async def _timed(self, peer: str) -> bool:
        try:
            return await asyncio.wait_for(self.probe(peer), PROBE_TIMEOUT_S)
        except (asyncio.TimeoutError, ConnectionError, OSError):
            return False

    def _answered(self, peer: str, done: concurrent.futures.Future[bool]) -> None:
        alive = not done.cancelled() and done.exception() is None and bool(done.result())
        with self._lock:
            self.probation.answered(peer, alive)
        if alive:
            logger.debug("%s answered a probe: in view", peer[-8:])

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self._launch()
            except Exception:  # a prober that stops would keep every new peer out of view
                logger.exception("probing peers failed; retrying next period")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.period_s + 5)
        with self._lock:
            failed = self.probation.failed
        if failed:
            logger.info("probation: %d probes found nobody (peers that never answered stay out)", failed)
