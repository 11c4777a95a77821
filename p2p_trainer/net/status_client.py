"""A look at a swarm from outside it (`p2p-trainer status`): a DHT client, never a peer.

The node runs hivemind's DHT in client mode: it asks other nodes and answers none, so it enters
no routing table. It has a throwaway identity and publishes nothing of its own (no heartbeat,
liveness record or run definition), and it does not re-store what it reads (`cache_nearest=0`), so
no swarm counts it. Only when asked (`writable`) does it store a record someone else sealed: an
owner's revocation (`p2p-trainer revoke --initial-peers`). Heartbeats are read with
`records.read_heartbeats` and its checks (signed by their own peer, well-formed, not stamped in the
future); its DHT node installs the same record validator as every node. As a `NetNode` does, it leaves no DHT process, p2pd or socket file
behind, also when its own process is killed (`reaper.py`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from dataclasses import dataclass
from types import TracebackType

import hivemind

from p2p_trainer import processes
from p2p_trainer.net import reaper, records
from p2p_trainer.net.addresses import unreachable_message, validate_initial_peers
from p2p_trainer.net.dht import BOOTSTRAP_FAILURES, InitialPeersUnreachable, wait_call
from p2p_trainer.net.envelope import READ_DROPS, DropCounter
from p2p_trainer.net.record_validator import SignedRecordValidator

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeerLine:
    """One peer as the swarm's heartbeat records show it."""

    heartbeat: records.Heartbeat
    age_s: float
    """Seconds since the peer made this heartbeat (DHT time)."""
    round_s: float | None
    """Seconds the peer has been in its current round (None where it did not say when it began)."""


@dataclass(frozen=True)
class SwarmStatus:
    """What one read of the swarm's records found."""

    swarm: str
    peers: tuple[PeerLine, ...]
    """Live peers, by peer id: their heartbeats have not expired and are no tombstones."""
    left: tuple[str, ...]
    """Peers whose latest record is a tombstone (they left cleanly) or expired."""
    rejected: dict[str, int]
    """Records this client dropped so far (unsigned, forged, malformed), by reason."""


def read_status(dht: records.DHTLike, swarm: str, stored_drops: dict[str, int]) -> SwarmStatus:
    """The swarm's heartbeats as `records.read_heartbeats` checks them; `stored_drops`: what the
    DHT node's validator refused, counted in with the drops of this read."""
    now = records.now()
    live, left = [], []
    for beat, expiration in records.read_heartbeats(dht, swarm, verify=True):
        if beat.leaving or expiration < now:
            left.append(beat.peer_id)
            continue
        began = now - beat.round_started if beat.round_started > 0 else None
        live.append(PeerLine(beat, max(0.0, now - beat.timestamp), began))
    rejected = dict(READ_DROPS.counts())
    for reason, n in stored_drops.items():
        rejected[reason] = rejected.get(reason, 0) + n
    return SwarmStatus(swarm, tuple(live), tuple(left), rejected)


def _start(initial_peers: list[str], drops: DropCounter, startup_timeout_s: float) -> hivemind.DHT:
    dht = hivemind.DHT(
        initial_peers=initial_peers,
        start=False,
        client_mode=True,
        cache_nearest=0,
        startup_timeout=startup_timeout_s,
        # a client-mode node stores nothing for others: no per-signer bound to keep, and none to
        # blank a swarm's records with
        record_validators=[SignedRecordValidator(drops, max_per_signer=None)],
    )
    dht.run_in_background(await_ready=False)
    return dht


class StatusClient:
    """A client-mode DHT node joined through `initial_peers`; `read(swarm)` the swarm's heartbeats.

    Raises `AddressError` (a malformed value, named) or `InitialPeersUnreachable`; on either,
    nothing it started is left running. With `writable` it also stores records (an owner
    publishing a revocation, `p2p-trainer revoke --initial-peers`); they are signed by whoever
    sealed them, never by this client, which has no identity of its own.
    """

    def __init__(
        self,
        initial_peers: tuple[str, ...],
        startup_timeout_s: float = 15.0,
        call_timeout_s: float = 20.0,
        writable: bool = False,
    ) -> None:
        peers = validate_initial_peers(initial_peers)
        self.call_timeout_s, self.writable = call_timeout_s, writable
        self.drops = DropCounter("status client")
        self.dht = _start(peers, self.drops, startup_timeout_s)
        self._daemons: dict[int, processes.DaemonProcess] = {}
        try:
            self._wait_ready(startup_timeout_s + 30.0)
        except Exception as exc:
            self._stop(grace_s=5.0)
            text = str(exc)
            if any(failure in text for failure in BOOTSTRAP_FAILURES):
                last = text.strip().splitlines()[-1] if text.strip() else type(exc).__name__
                raise InitialPeersUnreachable(unreachable_message(initial_peers, 1, last)) from None
            raise
        sockets = [path for d in self._daemons.values() for path in d.socket_paths]
        self._reaper: subprocess.Popen[bytes] | None = reaper.spawn(
            os.getpid(), [self.dht.pid, *self._daemons], sockets
        )

    def _note_daemons(self) -> None:
        for daemon in processes.find_daemons(self.dht.pid):
            self._daemons.setdefault(daemon.pid, daemon)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self._note_daemons()
            try:
                self.dht.wait_until_ready(timeout=0.05)
                self._note_daemons()
                return
            except TimeoutError:
                if not self.dht.is_alive():  # it failed: its exception is on the way
                    self.dht.wait_until_ready(timeout=1.0)
                    raise RuntimeError("the DHT client exited during its start") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the DHT client did not start within {timeout_s:.0f} s") from None

    def get(self, key: object, latest: bool = False) -> object:
        """`records.DHTLike.get`, bounded by `call_timeout_s` (a dead DHT process ends it at once)."""
        future = self.dht.get(key, latest=latest, return_future=True)
        return wait_call(self.dht, future, f"get of {key!r}", self.call_timeout_s)

    def store(self, key: object, value: object, expiration_time: float, subkey: object = None) -> bool:
        """`records.DHTLike.store` if `writable`, bounded like `get`."""
        if not self.writable:
            raise PermissionError("the status client is read-only: it stores nothing")
        future = self.dht.store(key, value, expiration_time, subkey=subkey, return_future=True)
        return bool(wait_call(self.dht, future, f"store of {key!r}", self.call_timeout_s))

    def read(self, swarm: str) -> SwarmStatus:
        return read_status(self, swarm, self.drops.counts())

    def _stop(self, grace_s: float) -> None:
        self._note_daemons()
        self.dht.shutdown()
        for daemon in self._daemons.values():
            processes.stop_daemon(daemon, grace_s=grace_s)
            processes.remove_files(daemon.socket_paths)

    def close(self) -> None:
        self._stop(grace_s=5.0)
        if self._reaper is not None:
            if self._reaper.stdin is not None:
                self._reaper.stdin.close()  # the watchdog finds nothing left to stop and exits
            try:
                self._reaper.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                processes.stop_pid(self._reaper.pid, grace_s=1.0)
                self._reaper.wait()
            self._reaper = None

    def __enter__(self) -> StatusClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
