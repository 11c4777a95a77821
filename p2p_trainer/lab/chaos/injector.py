"""The fault injector: applies scenario events to a running swarm and records what it did.

Usable from tests on its own (`Injector(swarm, nodes).apply(Event(...))`) and driven on a
schedule by the runner. Every applied event is an `Applied` record with its time, the PIDs it hit
and, for phase-aware kills, whether the phase was actually observed before the kill.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from p2p_trainer.lab.chaos.nodes import ChaosSwarm, Node
from p2p_trainer.lab.chaos.timeline import Event
from p2p_trainer.round_log import LogTail, RoundRecord, RunLog

logger = logging.getLogger(__name__)

DOWNLOAD_MARK = "swarm on arrival"
"""The line a (re)starting peer logs right before it downloads the swarm's state (run/entry_paths.py)."""
SERVE_MARK = "serving round-"
"""The line a donor logs right before it sends its state (net/state_sync.py)."""


@dataclass
class Applied:
    at_s: float
    """When it was applied, seconds after the swarm's first round."""
    event: str
    pids: list[int]
    phase_seen: bool = True
    """False if a phase-aware kill gave up waiting for its phase and killed anyway."""
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_TAILS: dict[Path, LogTail] = {}
"""One follower per metrics file: phase waits poll a peer's file every 20 ms."""


def follow_log(run_dir: Path, i: int) -> RunLog:
    """Peer i's records so far, parsing only what was appended since the last call."""
    path = run_dir / f"peer{i}" / "metrics.jsonl"
    tail = _TAILS.get(path)
    if tail is None:
        tail = _TAILS[path] = LogTail(path)
    return tail.read()


def _round_records(run_dir: Path, i: int) -> list[RoundRecord]:
    return follow_log(run_dir, i).rounds


class Injector:
    def __init__(
        self,
        swarm: ChaosSwarm,
        peers: dict[int, Node],
        boot: Node | None,
        t0: float,
        phase_timeout_s: float = 60.0,
    ) -> None:
        self.swarm, self.peers, self.boot = swarm, peers, boot
        self.t0, self.phase_timeout_s = t0, phase_timeout_s
        self.run_dir = swarm.opts.run_dir
        self.applied: list[Applied] = []
        self.removed_sockets: set[Path] = set()
        """The killed nodes' socket files that the kills removed (nobody else would)."""
        self.restart_offsets: dict[int, int] = {}
        """Log size of each restarted peer at its restart, to find its download mark."""

    def now_s(self) -> float:
        return time.monotonic() - self.t0

    def apply(self, event: Event) -> Applied:
        handler = getattr(self, f"_{event.action}")
        pids, phase_seen, detail = handler(event)
        rec = Applied(round(self.now_s(), 3), event.describe(), pids, phase_seen, detail)
        logger.info("chaos: %s (pids %s)%s", rec.event, pids, "" if phase_seen else " [phase not seen]")
        self.applied.append(rec)
        return rec

    # ------------------------------------------------------------------ process faults
    def _peer(self, event: Event) -> Node:
        assert event.peer is not None
        return self.peers[event.peer]

    def _kill(self, event: Event) -> tuple[list[int], bool, str]:
        node = self._peer(event)
        seen, detail = self.wait_for_phase(event)
        pid = node.pid
        node.kill()
        removed = node.removed_sockets
        self.removed_sockets |= removed
        return [pid], seen, f"{detail}; removed {len(removed)} socket files".lstrip("; ")

    def _stall(self, event: Event) -> tuple[list[int], bool, str]:
        node = self._peer(event)
        node.stall()
        return [node.pid], True, ""

    def _resume(self, event: Event) -> tuple[list[int], bool, str]:
        node = self._peer(event)
        node.resume()
        return [node.pid], True, ""

    def _restart(self, event: Event) -> tuple[list[int], bool, str]:
        assert event.peer is not None
        old = self.peers[event.peer]
        if old.alive():
            old.kill()
        log = self.run_dir / f"peer{event.peer}" / "log.txt"
        self.restart_offsets[event.peer] = log.stat().st_size if log.exists() else 0
        extra = ["--wait-for-peers", "1"] + (["--resume"] if event.resume else [])
        node = self.swarm.start_peer(event.peer, extra)
        self.peers[event.peer] = node
        return [node.pid], True, "from checkpoint" if event.resume else "late join"

    def _kill_bootstrap(self, event: Event) -> tuple[list[int], bool, str]:
        assert self.boot is not None
        pid = self.boot.pid
        self.boot.kill()
        return [pid], True, ""

    # ------------------------------------------------------------------ link faults (testbed)
    def _throttle(self, event: Event) -> tuple[list[int], bool, str]:
        assert event.peer is not None and event.rate_mbit is not None
        self.swarm.throttle(event.peer, event.rate_mbit)
        return [], True, ""

    def _cut(self, event: Event) -> tuple[list[int], bool, str]:
        assert event.peer is not None
        self.swarm.cut(event.peer)
        return [], True, ""

    def _heal(self, event: Event) -> tuple[list[int], bool, str]:
        assert event.peer is not None
        self.swarm.heal(event.peer)
        return [], True, ""

    # ------------------------------------------------------------------ phases
    def wait_for_phase(self, event: Event) -> tuple[bool, str]:
        """Block until peer `event.peer` is (approximately) in `event.phase`; False if it never was.

        inner, mix1, blocking: wait for the peer's next round record (a round just started), then
        sleep into the phase using its last round's compute and blocked seconds. download, serve:
        wait for the peer's log line (after its last restart, or after now).
        """
        assert event.peer is not None
        if event.phase == "any":
            return True, ""
        if event.phase == "download":
            return self._wait_log(event.peer, DOWNLOAD_MARK, self.restart_offsets.get(event.peer, 0))
        if event.phase == "serve":
            log = self.run_dir / f"peer{event.peer}" / "log.txt"
            return self._wait_log(event.peer, SERVE_MARK, log.stat().st_size if log.exists() else 0)
        i = event.peer
        deadline = time.monotonic() + self.phase_timeout_s
        seen = len(_round_records(self.run_dir, i))
        while time.monotonic() < deadline and self.peers[i].alive():
            recs = _round_records(self.run_dir, i)
            if len(recs) > seen:
                last = recs[-1]
                offset = {
                    "mix1": 0.05,
                    "inner": 0.5 * last.compute_s,
                    "blocking": last.compute_s + 0.3 * max(0.05, last.blocked_s),
                }[event.phase]
                time.sleep(offset)
                return True, f"{offset:.2f} s into round {last.round + 1}"
            time.sleep(0.02)
        return False, "no new round within the phase timeout"

    def _wait_log(self, i: int, mark: str, start: int) -> tuple[bool, str]:
        """Wait for `mark` in peer i's log past byte `start`."""
        log = self.run_dir / f"peer{i}" / "log.txt"
        deadline = time.monotonic() + self.phase_timeout_s
        while time.monotonic() < deadline and self.peers[i].alive():
            if log.exists():
                with open(log, "rb") as f:
                    f.seek(start)
                    if mark.encode() in f.read():
                        return True, f"saw {mark!r}"
            time.sleep(0.01)
        return False, f"no {mark!r} in the log"
