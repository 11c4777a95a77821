"""Processes by PID only: descendants from /proc, signals, waiting, and p2pd socket files.

Nothing here matches processes by name. The testbed passes the PIDs it knows (from its cgroups and
`ip netns pids`); descendants are found by walking parent links in /proc.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import time
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

_P2PD_SOCKET_RE = re.compile(r"hivemind-p2pd-([A-Za-z0-9_-]+)\.sock")
SOCKET_DIR = Path("/tmp")


def _parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # the command name is in parentheses and may contain spaces: split after the last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[1])


def descendants(pid: int) -> set[int]:
    """All live descendants of `pid` (children, grandchildren, ...), not `pid` itself."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            ppid = _parent_pid(int(entry.name))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def is_alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    return state(pid) not in ("", "Z")


def state(pid: int) -> str:
    """The process state letter from /proc (R, S, D, T, Z, ...), or "" if the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return ""
    return stat[stat.rindex(")") + 2]


def wait_stopped(pids: Iterable[int], stopped: bool, timeout_s: float) -> set[int]:
    """Wait until each of `pids` is stopped (state T) or, with `stopped=False`, running again.

    Signals are delivered asynchronously (a throttled process may take a cfs period to react);
    gone processes count as done. Returns the PIDs not yet in the wanted state.
    """
    remaining = set(pids)
    deadline = time.monotonic() + timeout_s
    while remaining:
        remaining = {
            pid for pid in remaining if state(pid) not in ("", "Z") and (state(pid) == "T") != stopped
        }
        if not remaining or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return remaining


def same_netns(pid: int, netns_path: Path) -> bool:
    """True if `pid` lives in the network namespace bound at `netns_path` (/run/netns/<name>)."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(netns_path).st_ino
    except (FileNotFoundError, ProcessLookupError):
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


def p2pd_socket_ids(pids: Iterable[int]) -> set[str]:
    """Socket ids of hivemind p2pd daemons among `pids`, read from their command lines.

    hivemind names a daemon's sockets /tmp/hivemind-p2pd-<id>.sock and -p2pclient-<id>.sock; when
    its processes are killed nobody removes them, so the testbed records the ids before killing.
    """
    ids: set[str] = set()
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError):
            continue
        ids.update(_P2PD_SOCKET_RE.findall(cmdline))
    return ids


def p2pd_socket_paths(socket_id: str) -> list[Path]:
    return [SOCKET_DIR / f"hivemind-{kind}-{socket_id}.sock" for kind in ("p2pd", "p2pclient")]


def remove_p2pd_sockets(socket_ids: Iterable[str]) -> list[Path]:
    """Remove the socket files of the given daemons; return the paths actually removed."""
    removed = []
    for socket_id in socket_ids:
        for path in p2pd_socket_paths(socket_id):
            try:
                path.unlink()
                removed.append(path)
            except FileNotFoundError:
                pass
    return removed
