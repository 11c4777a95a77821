"""CPU quotas with cgroups: v1 `cpu` controller (cfs quota) or v2 `cpu.max`, whichever is usable.

On the machines this was built on, /sys/fs/cgroup is a v1 hierarchy with a `cpu` controller
(cpu.cfs_quota_us / cpu.cfs_period_us) and a `unified` v2 mount without controllers, so v1 is
preferred; a pure v2 mount (cgroup.controllers listing `cpu`) is used when there is no v1 `cpu`.
A cgroup also tracks every process started in a host, children included (p2pd, multiprocessing
workers), which is how the testbed finds and kills them without ever matching process names.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
REMOVE_WAIT_S = 5.0
"""How long removing a group waits for its last (already killed) members to be reaped."""


@dataclass(frozen=True)
class CgroupLayout:
    """Where cpu cgroups live and which interface files they use."""

    root: Path
    version: int
    """1: cpu.cfs_quota_us/cpu.cfs_period_us; 2: cpu.max."""


def detect_layout(root: Path = CGROUP_ROOT) -> CgroupLayout | None:
    """The usable cpu cgroup hierarchy, or None when neither v1 `cpu` nor v2 `cpu` is writable."""
    v1 = root / "cpu"
    if (v1 / "cpu.cfs_quota_us").exists() and os.access(v1, os.W_OK):
        return CgroupLayout(v1, 1)
    controllers = root / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split() and os.access(root, os.W_OK):
        return CgroupLayout(root, 2)
    return None


class CpuCgroup:
    """One cgroup directory: create, set a quota in cores, add/list/empty processes, remove."""

    def __init__(self, layout: CgroupLayout, rel_path: str) -> None:
        self.layout = layout
        self.path = layout.root / rel_path

    def create(self) -> None:
        if self.layout.version == 2:
            # children of the parent only get a cpu.max when the parent delegates the controller
            parent_ctl = self.path.parent / "cgroup.subtree_control"
            if "cpu" not in parent_ctl.read_text().split():
                parent_ctl.write_text("+cpu")
        self.path.mkdir()

    def set_quota(self, cpu_cores: float | None) -> None:
        """Cap the group at `cpu_cores` cores per `PERIOD_US`; None removes the cap."""
        quota_us = -1 if cpu_cores is None else max(int(cpu_cores * PERIOD_US), 1000)
        if self.layout.version == 1:
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota_us))
        else:
            quota = "max" if quota_us < 0 else str(quota_us)
            (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")

    def set_weight(self, shares: int) -> None:
        """CFS weight against sibling groups and other processes (v1 cpu.shares, default 1024)."""
        if self.layout.version == 1:
            (self.path / "cpu.shares").write_text(str(shares))
        else:
            (self.path / "cpu.weight").write_text(str(min(max(shares * 100 // 1024, 1), 10_000)))

    def ensure_delegates_cpu(self) -> None:
        """v2 only: let child groups of this group set cpu.max."""
        if self.layout.version == 2:
            (self.path / "cgroup.subtree_control").write_text("+cpu")

    @property
    def procs_file(self) -> Path:
        """Writing a PID here moves that process (and its future children) into the group."""
        return self.path / "cgroup.procs"

    def pids(self) -> set[int]:
        """PIDs of all processes in this group (empty if the group is gone)."""
        try:
            return {int(tok) for tok in self.procs_file.read_text().split()}
        except FileNotFoundError:
            return set()

    def throttled_time_s(self) -> float:
        """Total time the group was held back by its quota (from cpu.stat)."""
        fields = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        if self.layout.version == 1:
            return int(fields.get("throttled_time", "0")) / 1e9
        return int(fields.get("throttled_usec", "0")) / 1e6

    def remove(self) -> None:
        """Remove the (empty) group; child groups first. A missing group is fine."""
        if not self.path.exists():
            return
        for child in sorted(p for p in self.path.iterdir() if p.is_dir()):
            CpuCgroup(self.layout, str(child.relative_to(self.layout.root))).remove()
        # A killed process whose parent had exited stays a member until init reaps it (a zombie
        # counts as gone for our waits); on a busy machine that can take a moment.
        deadline = time.monotonic() + REMOVE_WAIT_S
        while True:
            try:
                self.path.rmdir()
                return
            except OSError as err:
                if err.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
            time.sleep(0.05)
