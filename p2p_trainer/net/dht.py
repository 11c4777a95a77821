"""Start and stop a hivemind DHT node with our identity, checked addresses, retries and clean shutdown.

`start_node(config)` returns a `NetNode`: the running `hivemind.DHT` (its own process, which runs
p2pd), our Ed25519 identity, and the bookkeeping to shut it all down without leaving a p2pd process
or a socket file. A node's identity is refused if it is live elsewhere: on this machine by a flock
on `<key>.lock`, across machines by a liveness record in the DHT that the node refreshes while it
runs and replaces with a `stopped` record when it shuts down cleanly.

Every node (bootstrap nodes too) installs `SignedRecordValidator` unless `verify_records` is off,
so it neither stores nor returns a record that its owner did not sign (`record_validator.py`).
The node signs its own records with its identity key (`NetNode.signer`) either way.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import hivemind
from hivemind.p2p import PeerID

from p2p_trainer import processes
from p2p_trainer.net import reaper, records, revocation
from p2p_trainer.net.addresses import (
    announce_maddr,
    check_announce_host,
    free_port,
    host_maddr,
    unreachable_message,
    validate_initial_peers,
)
from p2p_trainer.net.envelope import DropCounter, Signer, dht_key_bytes
from p2p_trainer.net.identity import (
    IdentityError,
    IdentityInUseError,
    IdentityLock,
    NodeIdentity,
    load_or_create_identity,
    load_signing_key,
)
from p2p_trainer.net.record_validator import MAX_RECORDS_PER_SIGNER, SignedRecordValidator

logger = logging.getLogger(__name__)

BOOTSTRAP_FAILURES = ("failed to connect to bootstrap peers", "none of the initial_peers responded")
"""What hivemind's errors say when no initial peer answered (the status client tells them apart too)."""


class DHTCallTimeout(TimeoutError):
    """A DHT call did not finish in time (the DHT process or p2pd may have died)."""


def wait_call(dht: hivemind.DHT, future: Any, what: str, timeout_s: float) -> Any:
    """The result of `future`, a call to `dht`; raises `DHTCallTimeout` when `timeout_s` passes or
    as soon as the DHT process exits (its calls would never finish)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return future.result(timeout=max(0.0, min(0.1, deadline - time.monotonic())))
        except TimeoutError:
            if not dht.is_alive() or time.monotonic() >= deadline:
                future.cancel()
                state = "has exited" if not dht.is_alive() else "is still running"
                raise DHTCallTimeout(f"DHT {what} did not finish (the DHT process {state})") from None


class InitialPeersUnreachable(RuntimeError):
    """No initial peer answered after all attempts; the message says what was tried and what to check."""


@dataclass(frozen=True)
class DHTConfig:
    """How to start one DHT node (bootstrap node or training peer)."""

    identity_path: str
    """Ed25519 key file; created (mode 0600) on first run, reused afterwards."""
    host: str = "0.0.0.0"
    """IP address to listen on (0.0.0.0: all interfaces)."""
    port: int = 0
    """TCP port to listen on; 0 picks a free one (announced with --announce-host, if given)."""
    announce_host: str | None = None
    """Address other machines should dial, for nodes behind NAT or in containers."""
    initial_peers: tuple[str, ...] = ()
    """Multiaddrs of running nodes to join (what `p2p-trainer bootstrap` prints); empty starts a swarm."""
    connect_attempts: int = 4
    """How many times to try the initial peers before giving up."""
    backoff_initial_s: float = 1.0
    """Wait after the first failed attempt; doubles after each further one."""
    backoff_max_s: float = 16.0
    startup_timeout_s: float = 15.0
    """Upper bound on p2pd's own start."""
    liveness_period_s: float = 5.0
    """How often the node refreshes its identity's liveness record."""
    liveness_ttl_s: float = 15.0
    """Lifetime of a liveness record; after a crash, the identity is free again after this long."""
    shutdown_timeout_s: float = 5.0
    call_timeout_s: float = 30.0
    """Upper bound on one DHT call (store, get); past it the call raises `DHTCallTimeout`."""
    verify_records: bool = True
    """Install the validator that refuses unsigned or forged records (off only with the security
    defences off, so attack tests can show what forged records do)."""
    swarm: str = ""
    """The swarm this node trains in (none for a bootstrap node): its shared records are read from
    other nodes and never refused for `records_per_signer` (`record_validator.py`)."""
    records_per_signer: int | None = MAX_RECORDS_PER_SIGNER
    """Most distinct records one signer may make this node hold at a time (`record_validator.py`);
    None: no bound (attack tests, to show what a flood of valid records under new keys does)."""


def shared_keys(swarm: str) -> frozenset[bytes]:
    """The DHT keys of `swarm`'s records with an entry per peer: heartbeats, run definitions,
    revocations (none without a swarm)."""
    if not swarm:
        return frozenset()
    keys = (
        records.heartbeat_key(swarm),
        records.run_definition_key(swarm),
        revocation.revocations_key(swarm),
    )
    return frozenset(dht_key_bytes(k) for k in keys)


def _wait_ready(dht: hivemind.DHT, seen: dict[int, processes.DaemonProcess], timeout_s: float) -> None:
    """Wait for the DHT to start, noting each p2pd it runs (even one that exits during the start)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for daemon in processes.find_daemons(dht.pid):
            seen.setdefault(daemon.pid, daemon)
        try:
            dht.wait_until_ready(timeout=0.02)
            return
        except TimeoutError:
            if not dht.is_alive():  # it failed: its exception is on the way
                dht.wait_until_ready(timeout=1.0)
                raise RuntimeError("the DHT process exited during its start") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"the DHT node did not start within {timeout_s:.0f} s") from None


def _try_start(
    config: DHTConfig, identity: NodeIdentity, initial_peers: list[str], drops: DropCounter
) -> tuple[hivemind.DHT, list[processes.DaemonProcess]]:
    # p2pd takes the announced address at start, so a node that announces one picks its port first
    port = free_port(config.host) if config.announce_host and config.port == 0 else config.port
    announce = [announce_maddr(config.announce_host, port)] if config.announce_host else None
    dht = hivemind.DHT(
        initial_peers=initial_peers or None,
        start=False,
        host_maddrs=[host_maddr(config.host, port)],
        announce_maddrs=announce,
        identity_path=str(identity.path),
        check_if_identity_free=False,  # hivemind's check assumes RSA keys; we check in NetNode
        startup_timeout=config.startup_timeout_s,
        record_validators=(
            [SignedRecordValidator(drops, config.records_per_signer, shared_keys(config.swarm))]
            if config.verify_records
            else []
        ),
    )
    dht.run_in_background(await_ready=False)
    seen: dict[int, processes.DaemonProcess] = {}
    try:
        # p2pd's own start, then hivemind's pings of the initial peers (bounded by its wait_timeout)
        _wait_ready(dht, seen, timeout_s=config.startup_timeout_s + 30.0)
    except BaseException:
        dht.shutdown()
        processes.cleanup_daemons(list(seen.values()), grace_s=config.shutdown_timeout_s)
        raise
    for daemon in processes.find_daemons(dht.pid):
        seen.setdefault(daemon.pid, daemon)
    return dht, list(seen.values())


def _start_with_retries(
    config: DHTConfig, identity: NodeIdentity, stop: threading.Event | None, drops: DropCounter
) -> tuple[hivemind.DHT, list[processes.DaemonProcess]]:
    initial_peers = validate_initial_peers(config.initial_peers)
    for attempt in range(config.connect_attempts):
        try:
            return _try_start(config, identity, initial_peers, drops)
        except Exception as e:
            if not initial_peers or not any(text in str(e) for text in BOOTSTRAP_FAILURES):
                raise
            last_error = str(e).strip().splitlines()[-1]
            if attempt + 1 == config.connect_attempts:
                raise InitialPeersUnreachable(
                    unreachable_message(config.initial_peers, config.connect_attempts, last_error)
                ) from None
            delay_s = float(min(config.backoff_max_s, config.backoff_initial_s * 2**attempt))
            logger.warning(
                "no initial peer answered (attempt %d/%d: %s); retrying in %.1f s",
                attempt + 1,
                config.connect_attempts,
                last_error,
                delay_s,
            )
            if stop is not None and stop.wait(delay_s):
                raise InterruptedError("stopped while waiting to retry the initial peers") from None
            if stop is None:
                time.sleep(delay_s)
    raise AssertionError("unreachable")


def start_node(config: DHTConfig, stop: threading.Event | None = None) -> NetNode:
    """Start a DHT node; raises `AddressError`, `IdentityError`, `InitialPeersUnreachable`.

    `stop`, when set by a signal handler, interrupts the retry waits.
    """
    if config.connect_attempts < 1:
        raise ValueError(f"connect_attempts must be at least 1, got {config.connect_attempts}")
    validate_initial_peers(config.initial_peers)
    host_maddr(config.host, config.port)
    if config.announce_host:
        check_announce_host(config.announce_host)
    identity = load_or_create_identity(config.identity_path)
    for maddr in config.initial_peers:
        if maddr.rstrip("/").endswith(f"/p2p/{identity.peer_id}"):
            raise IdentityInUseError(
                f"identity {identity.path} (peer id {identity.peer_id}) is the identity of initial peer "
                f"{maddr}; every node needs its own key: use a different --identity path"
            )
    signer = Signer(load_signing_key(identity))
    drops = DropCounter(f"DHT node {identity.peer_id[-8:]}")
    lock = IdentityLock(identity)
    lock.acquire()
    try:
        dht, daemons = _start_with_retries(config, identity, stop, drops)
    except BaseException:
        lock.release()
        raise
    try:
        node = NetNode(dht, daemons, identity, lock, config, signer, drops)
    except BaseException:
        dht.shutdown()
        processes.cleanup_daemons(daemons, grace_s=config.shutdown_timeout_s)
        lock.release()
        raise
    try:
        node.claim_identity()
    except BaseException:
        node.shutdown()
        raise
    return node


def left_by_dead_process(record: records.Liveness) -> bool:
    """A `live` record written on this host by a process that no longer exists (killed, not stopped)."""
    return record.hostname == socket.gethostname() and not processes.is_alive(record.pid)


async def _visible_maddrs(_dht: hivemind.DHT, node: Any) -> list[Any]:
    return list(await node.get_visible_maddrs())


async def _connected_peers(_dht: hivemind.DHT, node: Any) -> int:
    return len(await node.p2p.list_peers())


async def _ping_peers(peer_ids: list[str], _dht: hivemind.DHT, node: Any) -> int:
    """Ping peers by id (p2pd finds their addresses); responders re-enter the routing table."""
    found = await asyncio.gather(
        *(node.protocol.call_ping(PeerID.from_base58(p), validate=False, strict=False) for p in peer_ids),
        return_exceptions=True,
    )
    return sum(1 for r in found if r is not None and not isinstance(r, BaseException))


class NetNode:
    """A running DHT node with our identity. Implements `records.DHTLike` (calls are serialised)."""

    def __init__(
        self,
        dht: hivemind.DHT,
        daemons: list[processes.DaemonProcess],
        identity: NodeIdentity,
        lock: IdentityLock,
        config: DHTConfig,
        signer: Signer,
        drops: DropCounter,
    ) -> None:
        self.dht = dht
        self.identity = identity
        self.signer = signer
        """Signs this node's records with its identity key."""
        self.drops = drops
        self.config = config
        self.started_at = time.monotonic()
        self._lock = lock
        self._calls = threading.Lock()
        self._daemons = daemons
        self._instance = secrets.token_hex(8)
        self._stop_keepalive = threading.Event()
        self._keepalive: threading.Thread | None = None
        self._closed = False
        sockets = [path for daemon in self._daemons for path in daemon.socket_paths]
        self._reaper = reaper.spawn(os.getpid(), [dht.pid, *self.daemon_pids], sockets)
        logger.info("DHT node %s started (p2pd pids %s)", identity.peer_id, [d.pid for d in self._daemons])

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    def record_drops(self) -> dict[str, int]:
        """Records the validator refused so far (stored by others, or returned to us), by reason."""
        return self.drops.counts()

    @property
    def daemon_pids(self) -> list[int]:
        return [d.pid for d in self._daemons]

    def is_healthy(self) -> bool:
        """True while the DHT process and its p2pd both run."""
        return bool(self.dht.is_alive()) and all(processes.is_alive(pid) for pid in self.daemon_pids)

    def _wait(self, future: Any, what: str, timeout_s: float | None = None) -> Any:
        return wait_call(
            self.dht, future, what, self.config.call_timeout_s if timeout_s is None else timeout_s
        )

    def store(self, key: Any, value: Any, expiration_time: float, subkey: Any = None) -> Any:
        with self._calls:
            future = self.dht.store(key, value, expiration_time, subkey=subkey, return_future=True)
            return self._wait(future, f"store of {key!r}")

    def get(self, key: Any, latest: bool = False) -> Any:
        with self._calls:
            return self._wait(self.dht.get(key, latest=latest, return_future=True), f"get of {key!r}")

    def visible_maddrs(self) -> list[str]:
        """Multiaddrs (with /p2p/<peer id>) that other nodes can pass as initial peers."""
        with self._calls:
            future = self.dht.run_coroutine(_visible_maddrs, return_future=True)
            return [str(addr) for addr in self._wait(future, "address query")]

    def ping_peers(self, peer_ids: list[str], timeout_s: float = 10.0) -> int:
        """Ping peers by id and return how many answered.

        After a partition heals, a node whose routing table emptied (every call timed out) has
        no one to ask: pinging the peers it knew (and its bootstrap nodes) reconnects it.
        """
        with self._calls:
            future = self.dht.run_coroutine(
                functools.partial(_ping_peers, list(peer_ids)), return_future=True
            )
            return int(self._wait(future, "ping", timeout_s))

    def bootstrap_ids(self) -> list[str]:
        """Peer ids of the initial peers this node was started with."""
        return [m.rsplit("/p2p/", 1)[1] for m in self.config.initial_peers if "/p2p/" in m]

    def connected_peers(self) -> int:
        """How many peers p2pd is connected to now."""
        with self._calls:
            return int(self._wait(self.dht.run_coroutine(_connected_peers, return_future=True), "peer count"))

    def _liveness(self, state: str) -> records.Liveness:
        return records.Liveness(self.peer_id, self._instance, state, socket.gethostname(), os.getpid())

    def claim_identity(self) -> None:
        """Refuse (`IdentityInUseError`) if another live node holds our key; else announce ours."""
        reported = self.dht.peer_id.to_base58()
        if reported != self.peer_id:
            raise IdentityError(
                f"p2pd reports peer id {reported}, but {self.identity.path} gives {self.peer_id}"
            )
        other = records.find_liveness(self, self.peer_id, self.config.verify_records)
        if other is not None and other.state == "live" and other.instance != self._instance:
            if left_by_dead_process(other):
                # A node of ours that was killed on this machine: we hold its key's flock, and its
                # pid is gone, so the record is stale. Take over instead of waiting for its TTL.
                logger.info("identity was live in pid %d on this host, which is gone; rejoining", other.pid)
            else:
                raise IdentityInUseError(
                    f"identity {self.identity.path} (peer id {self.peer_id}) is already live in the swarm "
                    f"(host {other.hostname}, pid {other.pid}); stop that node, or give this node its own "
                    f"--identity path. If that node was killed abruptly, its record expires within "
                    f"{self.config.liveness_ttl_s:.0f} s"
                )
        records.publish_liveness(self, self._liveness("live"), self.config.liveness_ttl_s, self.signer)
        self._keepalive = threading.Thread(target=self._keep_alive, name="liveness", daemon=True)
        self._keepalive.start()

    def _keep_alive(self) -> None:
        while not self._stop_keepalive.wait(self.config.liveness_period_s):
            try:
                records.publish_liveness(
                    self, self._liveness("live"), self.config.liveness_ttl_s, self.signer
                )
            except Exception as e:  # a failed refresh is retried next period; the node keeps running
                logger.warning("could not refresh the liveness record: %s", e)

    def shutdown(self) -> None:
        """Release the identity, stop the DHT process and p2pd (by PID) and remove their socket files."""
        if self._closed:
            return
        self._closed = True
        self._stop_keepalive.set()
        if self._keepalive is not None:
            self._keepalive.join(timeout=self.config.shutdown_timeout_s)
            self._publish_stopped()
        self.dht.shutdown()
        for daemon in self._daemons:
            processes.stop_daemon(daemon, grace_s=self.config.shutdown_timeout_s)
            processes.remove_files(daemon.socket_paths)
        self._lock.release()
        self._stop_reaper()
        logger.info("DHT node %s stopped", self.peer_id)

    def _stop_reaper(self) -> None:
        """Close the watchdog's pipe: it finds nothing left to stop and exits."""
        if self._reaper.stdin is not None:
            self._reaper.stdin.close()
        try:
            self._reaper.wait(timeout=self.config.shutdown_timeout_s)
        except subprocess.TimeoutExpired:
            processes.stop_pid(self._reaper.pid, grace_s=1.0)
            self._reaper.wait()

    def _publish_stopped(self) -> None:
        """Mark the identity free, if the DHT and p2pd still run (a group signal may have stopped them)."""
        if not self.is_healthy():
            logger.info("DHT process or p2pd already gone; the liveness record expires on its own")
            return
        key, expiration = records.liveness_key(self.peer_id), records.now() + self.config.liveness_ttl_s
        sealed = self.signer.seal(key, None, expiration, self._liveness("stopped").encode())
        with self._calls:
            future = self.dht.store(key, sealed, expiration, return_future=True)
            try:
                self._wait(future, "store of the stopped record", timeout_s=self.config.shutdown_timeout_s)
            except Exception as e:  # the live record then expires on its own after liveness_ttl_s
                logger.warning("could not publish the stopped record: %s", e)

    def __enter__(self) -> NetNode:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()
