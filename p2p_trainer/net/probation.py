"""Peers on probation: in an open swarm, a heartbeat alone does not put a peer in this one's groups.

A signature proves only that the writer holds a key, and keys cost nothing: one node can sign
heartbeats for a hundred peers that do not exist, and the groups drawn from a view holding them
wait on phantoms in almost every round (docs/security-results.md, `flood:100`). What a phantom
cannot do is answer a stream opened to its peer id: libp2p authenticates the remote end with the
key behind that id, so every answering phantom is a running host of the attacker's.

So with the defences on, an open swarm's view shows only the peers this one has seen alive: those
whose messages reached it, and those that answered a probe, a stream
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
import random
import threading
import time
from collections.abc import Callable, Coroutine, Set
from typing import Any

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 8.0
"""How long one probe may take: a direct dial (which may search the p2p DHT for an id nobody
runs), then the relays."""
FIRST_RETRY_S = 1.0
MAX_RETRY_S = 60.0
RETURNING_MAX_S = 4.0
"""Longest wait between probes of a peer that answered before (`Probation.answered`)."""
FIRST_ROUND_S = 5.0
"""How long `start` waits for the peers in view at that time to answer (honest ones take ms)."""
MAX_IN_FLIGHT = 16
"""Probes at once: each holds a connection to p2pd, and the phantoms' number is the attacker's."""
FORGET_AFTER_S = 300.0


class Probation:
    """Which peers this one has seen alive, and when to probe the others again (no I/O)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.vouched: set[str] = set()
        self._retry_at: dict[str, float] = {}
        self._backoff: dict[str, float] = {}
        self._in_flight: set[str] = set()
        self._suspected: set[str] = set()
        self._known_alive: set[str] = set()
        """Peers vouched for at some time (forgotten with the rest, `forget`)."""
        self._last_candidate: dict[str, float] = {}
        self.failed = 0
        """Probes that found nobody (over the run)."""

    def due(self, candidates: set[str], hurry: Set[str] = frozenset()) -> list[str]:
        """The candidates to probe now, at most `MAX_IN_FLIGHT` in flight (each until `answered`).
        `hurry`: peers with fresh evidence of a running host (they probed this one), probed first
        and at once; then peers never probed, in random order (an attacker cannot choose ids that
        sort ahead of a newcomer); then those due for a retry."""
        now = self.clock()
        for peer in candidates:
            self._last_candidate[peer] = now
        open_ = candidates - self.vouched - self._in_flight
        for peer in hurry & open_:
            self._retry_at.pop(peer, None)
        ready = [p for p in open_ if self._retry_at.get(p, 0.0) <= now]
        ready.sort(key=lambda p: (p not in hurry, self._backoff.get(p, 0.0), random.random()))
        todo = ready[: max(0, MAX_IN_FLIGHT - len(self._in_flight))]
        self._in_flight.update(todo)
        return todo

    def answered(self, peer: str, alive: bool) -> None:
        self._in_flight.discard(peer)
        if alive:
            self.vouched.add(peer)
            self._known_alive.add(peer)
            self._retry_at.pop(peer, None)
            self._backoff.pop(peer, None)
            return
        self.failed += 1
        # a peer that answered before (cut off, restarted) is back soon after it is reachable
        # again; only ids never seen alive, the phantoms among them, wait up to MAX_RETRY_S
        cap_s = RETURNING_MAX_S if peer in self._known_alive else MAX_RETRY_S
        wait_s = min(cap_s, 2 * self._backoff.get(peer, FIRST_RETRY_S / 2))
        self._backoff[peer] = wait_s
        self._retry_at[peer] = self.clock() + wait_s

    def vouch(self, peers: set[str]) -> None:
        """`peers` sent this one messages: they run."""
        for peer in peers - self._suspected:
            self.vouched.add(peer)
            self._known_alive.add(peer)
            self._retry_at.pop(peer, None)
            self._backoff.pop(peer, None)

    def suspect(self, peers: set[str]) -> None:
        """This peer's current suspects (a send failed): those newly among them must answer a
        probe again before they count; one that answers stays vouched while still suspected."""
        self.vouched -= peers - self._suspected
        self._suspected = set(peers)

    def forget(self, keep: set[str]) -> None:
        """Drop what is known of peers out of view for `FORGET_AFTER_S` (a long run meets many;
        a heartbeat missing from one read, or let lapse and republished, is not news)."""
        gone_before = self.clock() - FORGET_AFTER_S
        stale = {p for p, t in self._last_candidate.items() if t < gone_before and p not in keep}
        for table in (self._retry_at, self._backoff, self._last_candidate):
            for peer in stale & set(table):
                del table[peer]
        self.vouched -= stale
        self._known_alive -= stale

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)


class Prober:
    """A thread that probes the view's candidates (`candidates()`) with `probe(peer)` on an
    asyncio loop (`submit`), as `Probation` says; `seen()` is what the view may show.

    Evidence besides a probe: `heard()`, peers that sent this one messages (vouched),
    and `probed_by()`, peers whose probe reached this one (probed back at once: a probe's opener
    proves only that it can dial out, not that it answers)."""

    def __init__(
        self,
        candidates: Callable[[], set[str]],
        heard: Callable[[], set[str]],
        probed_by: Callable[[], set[str]],
        suspects: Callable[[], set[str]],
        probe: Callable[[str], Coroutine[Any, Any, bool]],
        submit: Callable[[Coroutine[Any, Any, bool]], concurrent.futures.Future[bool]],
        period_s: float = 0.5,
    ) -> None:
        self.candidates, self.heard, self.probed_by, self.suspects = candidates, heard, probed_by, suspects
        self.probe, self.submit, self.period_s = probe, submit, period_s
        self.probation = Probation()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, first_round_s: float = FIRST_ROUND_S) -> None:
        """Probe the peers in view now, wait up to `first_round_s` for them (more are launched as
        each answers, so one slow probe holds up no other), then keep probing."""
        deadline = time.monotonic() + first_round_s
        pending = set(self._launch())
        while pending and time.monotonic() < deadline:
            left_s = max(0.0, deadline - time.monotonic())
            _, pending = concurrent.futures.wait(pending, left_s, concurrent.futures.FIRST_COMPLETED)
            pending |= set(self._launch())
        self._thread = threading.Thread(target=self._run, name="probation", daemon=True)
        self._thread.start()

    def seen(self) -> set[str]:
        with self._lock:
            return set(self.probation.vouched)

    def _launch(self) -> list[concurrent.futures.Future[bool]]:
        candidates = self.candidates()
        heard, hellos, suspects = self.heard(), self.probed_by(), self.suspects()
        with self._lock:
            self.probation.suspect(suspects)
            self.probation.vouch(heard & candidates)
            self.probation.forget(candidates)
            todo = self.probation.due(candidates, hurry=hellos)
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
