"""Processes by PID: tracked children, /proc reads, signals and waits, p2pd daemons and socket files.

Nothing here finds or signals a process by its name. Children are started by us (`Child`); other
processes are found through parent links in /proc, from PIDs we know. A PID that may have been
reused is checked against the start time recorded with it (`same_process`).

hivemind's DHT runs in a forked process that starts p2pd; p2pd listens on
`/tmp/hivemind-p2pd-<id>.sock` and its client on `/tmp/hivemind-p2pclient-<id>.sock`. A p2pd
that exits on its own (no bootstrap peer answered) or is SIGKILLed leaves those files behind, so
the helpers at the end find them (from command lines or open fds) and remove only those.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

SOCKET_DIR = Path("/tmp")
GATE_SOCKET_PREFIX = "p2pt-gate-"
"""Our stream gates' sockets in SOCKET_DIR (`net/stream_gate.py`): p2pd connects to them."""
_LISTEN_RE = re.compile(r"^-listen=/unix(/.*hivemind-p2pd-(.+)\.sock)$")
_P2PD_SOCKET_RE = re.compile(r"hivemind-p2pd-([A-Za-z0-9_-]+)\.sock")
TREE_GRACE_S = 10.0
"""How long a stopped child's descendants in other sessions get to exit on their own.

hivemind sets torch's sharing strategy to file_system and shares a tensor when a DHT starts
(MPFuture's state), which starts `torch_shm_manager` as a child of that process in a session
of its own. Its one task is to delete its clients' /dev/shm files once they are gone, which it
does only when it exits, 2 s after its last client; signalled earlier, it leaves them behind.
`reap_tree` does that task itself once the manager's clients are gone, so that each stop does
not wait out those 2 s. The watchdog (net/reaper.py) exits within ~4 s."""
NOTE_EVERY_S = 0.25
"""How often a running child's descendants are noted while it is polled: a descendant that leaves
its session and is never noted is not waited for at `stop` (a short-lived peer's shm manager)."""
SHM_DIR = Path("/dev/shm")


# --------------------------------------------------------------------------- /proc reads


def _stat(pid: int | str) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state first), or [] if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:  # polled: no Path
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    # the command name is in parentheses and may contain spaces: split after the last ')'
    return stat[stat.rindex(")") + 2 :].split()


def state(pid: int) -> str:
    """The process state letter (R, S, D, T, Z, ...), or "" if the process is gone."""
    fields = _stat(pid)
    return fields[0] if fields else ""


def start_time(pid: int) -> int | None:
    """The start time in clock ticks since boot (tells a reused PID apart), or None if gone."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid`."""
    children: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            children.extend(int(c) for c in (task / "children").read_text().split())
    except (FileNotFoundError, ProcessLookupError):
        return []
    return children


_table: tuple[float, dict[int, tuple[int, int]]] = (-math.inf, {})
"""The last scan of /proc: (when, {pid: (parent pid, start time)})."""


def _process_table(max_age_s: float = 0.0) -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, start time)} of every live process, from a scan at most `max_age_s` old.

    A scan reads every process's stat file; a launcher polling several children shares one."""
    global _table
    at, table = _table
    if time.monotonic() - at <= max_age_s:
        return table
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat(name)
            if fields:
                table[int(name)] = (int(fields[1]), int(fields[19]))
    _table = (time.monotonic(), table)
    return table


def descendants(pid: int) -> set[int]:
    """All live descendants of `pid` (children, grandchildren, ... in any session), not `pid` itself."""
    return _descendants_in(_process_table(), pid)


def _descendants_in(table: dict[int, tuple[int, int]], pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def same_netns(pid: int, netns_path: Path) -> bool:
    """True if `pid` lives in the network namespace bound at `netns_path` (/run/netns/<name>)."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(netns_path).st_ino
    except (FileNotFoundError, ProcessLookupError):
        return False


# --------------------------------------------------------------------------- liveness, signals, waits


def is_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (a zombie has exited; only its reaping is left)."""
    return state(pid) not in ("", "Z")


def same_process(pid: int, started: int | None) -> bool:
    """True while the process `pid` that started at `started` (see `start_time`) is alive."""
    return is_alive(pid) and start_time(pid) == started


def group_gone(pgid: int) -> bool:
    """True once no process (zombies included) is left in the process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def signal_pids(pids: Iterable[int], sig: signal.Signals) -> None:
    """Send `sig` to each PID; PIDs that are already gone are skipped."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def wait_gone(pids: Iterable[int], timeout_s: float) -> set[int]:
    """Wait until none of `pids` is alive (zombies count as gone); return those still alive."""
    remaining = set(pids)
    deadline = time.monotonic() + timeout_s
    while remaining:
        remaining = {pid for pid in remaining if is_alive(pid)}
        if not remaining or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    return remaining


def wait_stopped(pids: Iterable[int], stopped: bool, timeout_s: float) -> set[int]:
    """Wait until each of `pids` is stopped (state T) or, with `stopped=False`, running again.

    Signals are delivered asynchronously (a throttled process may take a cfs period to react);
    gone processes count as done. Returns the PIDs not yet in the wanted state.
    """
    remaining = set(pids)
    deadline = time.monotonic() + timeout_s
    while remaining:
        remaining = {pid for pid in remaining if is_alive(pid) and (state(pid) == "T") != stopped}
        if not remaining or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return remaining


def stop_pid(pid: int, grace_s: float) -> None:
    """SIGTERM `pid`, then SIGKILL it if it is still alive after `grace_s` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not is_alive(pid):
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        wait_gone([pid], grace_s)
    if is_alive(pid):
        logger.warning("process %d survived SIGKILL", pid)


def _is_shm_manager(pid: int) -> bool:
    argv = cmdline(pid)
    return bool(argv) and argv[0].endswith("torch_shm_manager")


def release_shm_managers(managers: set[int], clients: set[int]) -> None:
    """Do now what `torch_shm_manager`s do when they exit 2 s after their last client has gone
    (`TREE_GRACE_S`): delete the /dev/shm files the `clients` (all gone) shared, then stop."""
    for path in _shm_files(clients):
        path.unlink(missing_ok=True)
    signal_pids(managers, signal.SIGTERM)


def reap_tree(tree: dict[int, int], grace_s: float = TREE_GRACE_S, owners: Iterable[int] = ()) -> set[int]:
    """Wait for the processes of `tree` ({pid: start time}, descendants of `owners`) to exit on
    their own, SIGKILL those still alive after `grace_s`; return the PIDs that had to be killed.
    Once only torch's shared-memory managers are left and the owners are gone too, the managers
    are released at once (`release_shm_managers`)."""
    deadline = time.monotonic() + grace_s
    owners = list(owners)
    clients = set(tree) | set(owners)
    left = {pid for pid, started in tree.items() if same_process(pid, started)}
    judged = False  # whether the managers left could be released has been decided
    while left and time.monotonic() < deadline:
        managers = {pid for pid in left if _is_shm_manager(pid)}
        # without `owners` the clients are not all known: a live one could still need the manager
        if owners and not judged and managers == left and not any(is_alive(pid) for pid in clients - left):
            # each process that shares starts its own manager: more sharers than managers means
            # a manager was never noted, which then keeps its files until it exits (waited for)
            if len(set(_shm_files(clients - managers).values())) <= len(managers):
                release_shm_managers(managers, clients - managers)
            judged = True
        time.sleep(0.05)
        left = {pid for pid in left if same_process(pid, tree[pid])}
    if left:
        logger.warning("processes %s outlived their parent by %.0f s; killing them", sorted(left), grace_s)
        signal_pids(left, signal.SIGKILL)
        wait_gone(left, 5.0)
    if owners:
        _wait_for_unseen_managers(clients)
    return left


def _shm_files(clients: set[int]) -> dict[Path, int]:
    """The /dev/shm files that `clients` shared (named torch_<pid>_<random>_<n>): {file: pid}."""
    found = {}
    for path in SHM_DIR.glob("torch_*"):
        fields = path.name.split("_")
        if len(fields) > 2 and fields[1].isdigit() and int(fields[1]) in clients:
            found[path] = int(fields[1])
    return found


def _wait_for_unseen_managers(clients: set[int], timeout_s: float = 3.0) -> None:
    """Files that `clients` (all gone) shared and that are still there belong to a shm manager
    that was never noted in the tree (its client exited between two looks): it deletes them when
    it exits, 2 s after its last client; wait for that, so that nothing outlives the caller."""
    deadline = time.monotonic() + timeout_s
    while _shm_files(clients) and time.monotonic() < deadline:
        time.sleep(0.05)


# --------------------------------------------------------------------------- tracked children


class Child:
    """A child process in its own session (signals to its group reach what it started in that group),
    stdout piped (a bootstrap node prints its address there), stderr to `log_path`.

    It notes its descendants while it runs, including those that leave its session (torch's
    shared-memory manager, our watchdog), so `stop` also waits for them: nothing it started stays.
    """

    def __init__(
        self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=self._log,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        self._started = start_time(self.proc.pid)
        self.tree: dict[int, int] = {}
        """Descendants seen so far: {pid: start time}."""
        self._noted_at = 0.0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def note_tree(self, max_age_s: float = 0.0) -> None:
        """Remember the child's current descendants (they may move to other sessions or be
        orphaned), from a scan of /proc at most `max_age_s` old."""
        self._noted_at = time.monotonic()
        table = _process_table(max_age_s)
        for pid in _descendants_in(table, self.pid):
            self.tree.setdefault(pid, table[pid][1])

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            return False
        if time.monotonic() - self._noted_at > NOTE_EVERY_S:
            # the children polled together share one scan: noting only adds pids, so a scan a
            # fraction of the period old misses nothing that the next one would not catch
            self.note_tree(NOTE_EVERY_S / 2)
        return True

    def send(self, sig: int) -> None:
        """Signal the child itself; it owns the shutdown of its DHT process and p2pd."""
        if self.alive():
            self.note_tree()
            self.proc.send_signal(sig)

    def signal_group(self, sig: int) -> None:
        """Signal the child's whole process group (unless its PID was reused after it was reaped)."""
        if start_time(self.pid) in (None, self._started):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)

    def stop(self, timeout_s: float = 20.0, sig: int = signal.SIGINT, wait_tree: bool = True) -> int:
        """Ask with `sig`, wait, then kill the whole group; always reaps. With `wait_tree`, also wait
        for its descendants in other sessions (see `reap_tree`; else the caller does, with `tree`)."""
        self.send(sig)
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("%s (pid %d) did not stop in %.0f s; killing it", self.name, self.pid, timeout_s)
            self.signal_group(signal.SIGKILL)
            code = self.proc.wait(timeout=10)
        finally:
            # anything left in the child's process group (e.g. an orphaned p2pd) goes with it
            self.signal_group(signal.SIGKILL)
            self._log.close()
        if wait_tree:
            reap_tree(self.tree, owners=[self.pid])
        return code


def wait_all(children: Sequence[Child], timeout_s: float, poll_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any([c.alive() for c in children]):  # every one polled: each notes its descendants
            return True
        time.sleep(poll_s)
    return False


# --------------------------------------------------------------------------- p2pd daemons


@dataclass(frozen=True)
class DaemonProcess:
    """A p2pd started on our behalf, and the socket files that belong to it."""

    pid: int
    socket_paths: tuple[Path, ...]


def find_daemons(parent_pid: int) -> list[DaemonProcess]:
    """p2pd processes among `parent_pid`'s children, with their daemon and client socket paths."""
    daemons = []
    for pid in child_pids(parent_pid):
        for arg in cmdline(pid):
            match = _LISTEN_RE.match(arg)
            if match:
                daemon_sock = Path(match.group(1))
                client_sock = daemon_sock.with_name(f"hivemind-p2pclient-{match.group(2)}.sock")
                daemons.append(DaemonProcess(pid=pid, socket_paths=(daemon_sock, client_sock)))
    return daemons


def stop_daemon(daemon: DaemonProcess, grace_s: float) -> None:
    """Stop a p2pd we started if it still runs (checked by its command line, in case the PID was reused)."""
    listen_arg = f"-listen=/unix{daemon.socket_paths[0]}"
    if is_alive(daemon.pid) and listen_arg in cmdline(daemon.pid):
        logger.warning("p2pd %d outlived its DHT process; stopping it", daemon.pid)
        stop_pid(daemon.pid, grace_s)


def cleanup_daemons(daemons: list[DaemonProcess], grace_s: float) -> None:
    """After a start that failed: let our p2pd processes exit (stopping them if they don't within
    `grace_s`), then remove their socket files, which a p2pd that quits on its own leaves behind."""
    wait_gone([d.pid for d in daemons], grace_s)
    for daemon in daemons:
        stop_daemon(daemon, grace_s=1.0)
        leftovers = [str(path) for path in daemon.socket_paths if path.exists()]
        remove_files(daemon.socket_paths)
        logger.info(
            "p2pd %d of the failed start exited; removed its leftover files %s", daemon.pid, leftovers
        )


# --------------------------------------------------------------------------- socket files


def remove_files(paths: Iterable[Path]) -> list[Path]:
    """Remove `paths`; return those actually removed."""
    removed = []
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
            logger.debug("removed %s", path)
    return removed


def _unix_socket_paths(prefix: str) -> dict[str, Path]:
    """{socket inode: bound path} of the unix sockets whose path starts with `prefix`."""
    by_inode: dict[str, Path] = {}
    with contextlib.suppress(OSError), open("/proc/net/unix") as table:
        next(table)
        for line in table:
            fields = line.split()
            if len(fields) >= 8 and fields[7].startswith(prefix):
                by_inode[fields[6]] = Path(fields[7])
    return by_inode


def _socket_inodes(pid: int | str) -> set[str]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def hivemind_socket_files(pids: Iterable[int | str]) -> set[Path]:
    """The /tmp/hivemind-*.sock and stream gate files that `pids` hold open (p2pd's, its
    clients' and our gates' sockets; nobody removes them after a SIGKILL).

    Found through /proc (the fds' socket inodes matched against /proc/net/unix), so only these
    processes' files are named, never another run's on the same machine.
    """
    by_inode = _unix_socket_paths(f"{SOCKET_DIR}/hivemind-")
    by_inode.update(_unix_socket_paths(f"{SOCKET_DIR}/{GATE_SOCKET_PREFIX}"))
    return {by_inode[inode] for pid in pids for inode in _socket_inodes(pid) if inode in by_inode}


def own_unix_socket_paths() -> list[Path]:
    """Paths of the hivemind and gate unix sockets this process holds open (e.g. a P2P replica's
    client socket)."""
    return sorted(hivemind_socket_files(["self"]))


def p2pd_socket_ids(pids: Iterable[int]) -> set[str]:
    """Socket ids of hivemind p2pd daemons among `pids`, read from their command lines.

    hivemind names a daemon's sockets /tmp/hivemind-p2pd-<id>.sock and -p2pclient-<id>.sock; when
    its processes are killed nobody removes them, so a kill records the ids first.
    """
    return {sid for pid in pids for sid in _P2PD_SOCKET_RE.findall("\0".join(cmdline(pid)))}


def p2pd_socket_paths(socket_id: str) -> list[Path]:
    return [SOCKET_DIR / f"hivemind-{kind}-{socket_id}.sock" for kind in ("p2pd", "p2pclient")]


def remove_p2pd_sockets(socket_ids: Iterable[str]) -> list[Path]:
    """Remove the socket files of the given daemons; return the paths actually removed."""
    return remove_files(path for socket_id in socket_ids for path in p2pd_socket_paths(socket_id))
