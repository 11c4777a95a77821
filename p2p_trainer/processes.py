"""What hivemind leaves behind: p2pd children and `hivemind-*.sock` files, tracked by PID and path.

hivemind's DHT runs in a forked process that starts p2pd; p2pd listens on
`/tmp/hivemind-p2pd-<uid>.sock` and the client on `/tmp/hivemind-p2pclient-<uid>.sock`. A p2pd that
exits on its own (e.g. when no bootstrap peer answers) leaves its socket file behind. These helpers
find the daemons we started (children of our DHT process, read from /proc) and remove only their
files, or files that appeared during our own failed start and that no live process listens on.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

_LISTEN_RE = re.compile(r"^-listen=/unix(/.*hivemind-p2pd-(.+)\.sock)$")


@dataclass(frozen=True)
class DaemonProcess:
    """A p2pd started on our behalf, and the socket files that belong to it."""

    pid: int
    socket_paths: tuple[Path, ...]


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc)."""
    children: list[int] = []
    task_dir = Path(f"/proc/{pid}/task")
    try:
        for task in task_dir.iterdir():
            children.extend(int(c) for c in (task / "children").read_text().split())
    except (FileNotFoundError, ProcessLookupError):
        return []
    return children


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except (FileNotFoundError, ProcessLookupError):
        return []


def find_daemons(parent_pid: int) -> list[DaemonProcess]:
    """p2pd processes among `parent_pid`'s children, with their daemon and client socket paths."""
    daemons = []
    for pid in child_pids(parent_pid):
        for arg in _cmdline(pid):
            match = _LISTEN_RE.match(arg)
            if match:
                daemon_sock = Path(match.group(1))
                client_sock = daemon_sock.with_name(f"hivemind-p2pclient-{match.group(2)}.sock")
                daemons.append(DaemonProcess(pid=pid, socket_paths=(daemon_sock, client_sock)))
    return daemons


def is_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return status.rsplit(")", 1)[1].split()[0] != "Z"


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused PID apart), or None."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(status.rsplit(")", 1)[1].split()[19])


def stop_pid(pid: int, grace_s: float) -> None:
    """SIGTERM `pid`, then SIGKILL it if it is still alive after `grace_s` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not is_alive(pid):
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while is_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    if is_alive(pid):
        logger.warning("process %d survived SIGKILL", pid)


def stop_daemon(daemon: DaemonProcess, grace_s: float) -> None:
    """Stop a p2pd we started if it still runs (checked by its command line, in case the PID was reused)."""
    listen_arg = f"-listen=/unix{daemon.socket_paths[0]}"
    if is_alive(daemon.pid) and listen_arg in _cmdline(daemon.pid):
        logger.warning("p2pd %d outlived its DHT process; stopping it", daemon.pid)
        stop_pid(daemon.pid, grace_s)


def remove_files(paths: tuple[Path, ...] | list[Path]) -> None:
    for path in paths:
        try:
            path.unlink()
            logger.debug("removed %s", path)
        except FileNotFoundError:
            pass


def cleanup_daemons(daemons: list[DaemonProcess], grace_s: float) -> None:
    """After a start that failed: let our p2pd processes exit (stopping them if they don't within
    `grace_s`), then remove their socket files, which a p2pd that quits on its own leaves behind."""
    deadline = time.monotonic() + grace_s
    while any(is_alive(d.pid) for d in daemons) and time.monotonic() < deadline:
        time.sleep(0.05)
    for daemon in daemons:
        stop_daemon(daemon, grace_s=1.0)
        leftovers = [str(path) for path in daemon.socket_paths if path.exists()]
        remove_files(daemon.socket_paths)
        logger.info(
            "p2pd %d of the failed start exited; removed its leftover files %s", daemon.pid, leftovers
        )


def own_unix_socket_paths(prefix: str = "/tmp/hivemind-") -> list[Path]:
    """Paths of the unix sockets this process holds open (e.g. a P2P replica's client socket).

    Found through /proc (our fds' socket inodes matched against /proc/net/unix), so only our own
    files are ever removed, never another process's.
    """
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    paths = []
    with open("/proc/net/unix") as table:
        next(table)
        for line in table:
            fields = line.split()
            if len(fields) >= 8 and fields[6] in inodes and fields[7].startswith(prefix):
                paths.append(Path(fields[7]))
    return paths
