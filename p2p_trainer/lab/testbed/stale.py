"""Remove what earlier testbed instances left behind when their process died without cleaning up.

An instance is named `<prefix>-<pid>-<n>`; its leftovers are namespaces `<prefix>-<pid>-<n>-*` and
the cgroup `<prefix>-<pid>-<n>` (with one child group per host). They are stale when `<pid>` is no
longer alive. (A recycled PID hides an instance's debris until that PID exits too.)
"""

from __future__ import annotations

import logging
import re
import signal
from pathlib import Path

from p2p_trainer import processes
from p2p_trainer.lab.testbed import netns
from p2p_trainer.lab.testbed.cgroup import CpuCgroup, detect_layout

logger = logging.getLogger(__name__)


def _owner_pid(name: str, prefix: str) -> int | None:
    match = re.match(rf"^{re.escape(prefix)}-(\d+)-\d+(?:-|$)", name)
    return int(match.group(1)) if match else None


def _cgroup_pids(path: Path) -> set[int]:
    pids: set[int] = set()
    for procs in path.rglob("cgroup.procs"):
        pids |= {int(tok) for tok in procs.read_text().split()}
    return pids


def cleanup_stale(prefix: str = "p2ptb", kill_grace_s: float = 5.0) -> list[str]:
    """Kill processes in, and delete, namespaces and cgroups of dead instances; return what went."""
    removed: list[str] = []
    stale_ns = [
        name
        for name in netns.list_namespaces()
        if (pid := _owner_pid(name, prefix)) and not processes.is_alive(pid)
    ]
    layout = detect_layout()
    stale_cg: list[Path] = []
    if layout is not None:
        stale_cg = [
            path
            for path in layout.root.iterdir()
            if path.is_dir() and (pid := _owner_pid(path.name, prefix)) and not processes.is_alive(pid)
        ]
    pids: set[int] = set()
    for name in stale_ns:
        pids |= netns.namespace_pids(name)
    for path in stale_cg:
        pids |= _cgroup_pids(path)
    socket_ids = processes.p2pd_socket_ids(pids)
    processes.signal_pids(pids, signal.SIGKILL)
    left = processes.wait_gone(pids, kill_grace_s)
    if left:
        logger.error("stale testbed processes survived SIGKILL: %s", sorted(left))
    for name in stale_ns:
        netns.delete_namespace(name)
        removed.append(f"netns {name}")
    if layout is not None:
        for path in stale_cg:
            CpuCgroup(layout, path.name).remove()
            removed.append(f"cgroup {path}")
    removed += [f"socket {path}" for path in processes.remove_p2pd_sockets(socket_ids)]
    if removed:
        logger.warning("removed stale testbed debris: %s", ", ".join(removed))
    return removed
