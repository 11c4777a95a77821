"""What the dashboard has seen of a swarm, and the JSON object `/api/swarm` serves (`snapshot`).

Reads come in as `status_dict` objects (what `p2p-trainer status --json` prints). Each peer's
heartbeat becomes one point of its curves, once: reads between two heartbeats of a peer add
nothing. The swarm's totals (live peers, tokens/s) get one point per read. A series keeps at most
`max_points`; past that every other point goes, so a curve still spans the whole run (at half
the resolution) instead of losing its beginning. Thread-safe: the poller adds, HTTP threads read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from p2p_trainer.dashboard.exchanges import ExchangeView

PEER_FIELDS = ("round", "loss", "tokens_per_s", "tokens")
SWARM_FIELDS = ("live_peers", "tokens_per_s", "tokens")
MIN_GAP_S = 0.5
"""Two reads of one heartbeat differ by the time between them in their age arithmetic, never by
this much; heartbeats come seconds apart (`network.view_period_s`)."""


class Series:
    """Points over time: `t` (seconds since the dashboard started) and one list per field."""

    def __init__(self, fields: tuple[str, ...], max_points: int) -> None:
        self.t: list[float] = []
        self.values: dict[str, list[Any]] = {f: [] for f in fields}
        self.max_points = max_points

    def add(self, t: float, values: dict[str, Any]) -> None:
        self.t.append(round(t, 2))
        for name, column in self.values.items():
            column.append(values.get(name))
        if len(self.t) > self.max_points:
            # keep the newest point: the curve must end where the swarm is now
            keep = sorted(set(range(len(self.t) - 1, -1, -2)))
            self.t = [self.t[i] for i in keep]
            self.values = {k: [v[i] for i in keep] for k, v in self.values.items()}

    def last_t(self) -> float | None:
        return self.t[-1] if self.t else None

    def to_dict(self) -> dict[str, list[Any]]:
        return {"t": list(self.t), **{k: list(v) for k, v in self.values.items()}}


class SwarmHistory:
    def __init__(self, swarm: str, max_points: int = 600, clock: Callable[[], float] = time.time) -> None:
        self.swarm = swarm
        self.max_points = max_points
        self._clock = clock
        self.started_unix = clock()
        self._lock = threading.Lock()
        self._peers: dict[str, Series] = {}
        """Every peer seen, in the order first seen (its colour on the page)."""
        self._swarm = Series(SWARM_FIELDS, max_points)
        self._current: list[dict[str, Any]] = []
        self._beats: dict[str, float] = {}
        """Unix time each current peer made its latest heartbeat."""
        self._left: list[str] = []
        self._rejected: dict[str, int] = {}
        self._exchanges: ExchangeView | None = None
        self._reads = 0
        self._updated: float | None = None
        self._error: str | None = None

    def add_read(self, status: dict[str, Any]) -> None:
        """One read of the swarm (a `status_dict` object)."""
        now = float(status["unix_time"])
        t = now - self.started_unix
        with self._lock:
            self._current, self._beats = [], {}
            for peer in status["peers"]:
                pid = peer["peer_id"]
                beat = now - float(peer["heartbeat_age_s"])
                self._current.append(dict(peer))
                self._beats[pid] = beat
                series = self._peers.setdefault(pid, Series(PEER_FIELDS, self.max_points))
                last = series.last_t()
                if last is None or beat - self.started_unix > last + MIN_GAP_S:
                    series.add(
                        beat - self.started_unix,
                        {
                            "round": peer["round"],
                            "loss": peer["loss"],
                            "tokens_per_s": peer["throughput_tokens_per_s"],
                            "tokens": peer["tokens_processed"],
                        },
                    )
            peers = status["peers"]
            self._swarm.add(
                t,
                {
                    "live_peers": len(peers),
                    "tokens_per_s": sum(p["throughput_tokens_per_s"] for p in peers),
                    "tokens": sum(p["tokens_processed"] for p in peers),
                },
            )
            self._left = list(status["left"])
            self._rejected = dict(status["records_rejected"])
            self._reads += 1
            self._updated = now
            self._error = None

    def set_exchanges(self, view: ExchangeView) -> None:
        with self._lock:
            self._exchanges = view

    def note_error(self, text: str) -> None:
        """The latest read failed: the page says why and keeps what it had."""
        with self._lock:
            self._error = text

    def snapshot(self) -> dict[str, Any]:
        """The `/api/swarm` object (its fields: README, "Watching a swarm")."""
        now = self._clock()
        with self._lock:
            index = {pid: i for i, pid in enumerate(self._peers)}
            exchanges = self._exchanges
            peers = []
            for peer in self._current:
                pid = peer["peer_id"]
                row = {
                    **peer,
                    "index": index[pid],
                    "heartbeat_age_s": round(max(0.0, now - self._beats[pid]), 1),
                }
                row["exchanges"] = exchanges.per_peer.get(pid) if exchanges else None
                peers.append(row)
            history = {pid: s.to_dict() for pid, s in self._peers.items()}
            return {
                "swarm": self.swarm,
                "state": "error" if self._error else "live" if self._reads else "connecting",
                "error": self._error,
                "unix_time": now,
                "started_unix": self.started_unix,
                "updated_unix": self._updated,
                "reads": self._reads,
                "peers": peers,
                "left": list(self._left),
                "records_rejected": dict(self._rejected),
                "points": sum(len(s.t) for s in self._peers.values()),
                "history": {
                    "peers": history,
                    "index": index,
                    "swarm": self._swarm.to_dict(),
                },
                "exchanges": None
                if exchanges is None
                else {
                    "source": exchanges.source,
                    "recent": [
                        {**e, "t": round(e["unix_time"] - self.started_unix, 2)} for e in exchanges.recent
                    ],
                },
            }
