"""A stopped child's torch shared-memory manager is released at once, and its files go with it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from p2p_trainer import processes
from p2p_trainer.processes import SHM_DIR, Child, reap_tree

pytestmark = pytest.mark.timeout(60)

SHARES = """
import time, torch, torch.multiprocessing as mp
mp.set_sharing_strategy("file_system")
t = torch.zeros(8).share_memory_()  # starts torch_shm_manager, which holds the file until it exits
print("shared", flush=True)
time.sleep(60)
"""


def _files(pid: int) -> list[Path]:
    return sorted(SHM_DIR.glob(f"torch_{pid}_*"))


def test_the_manager_of_a_stopped_child_is_released_with_its_files(tmp_path: Path) -> None:
    child = Child("sharer", [sys.executable, "-c", SHARES], tmp_path / "log.txt")
    try:
        assert child.proc.stdout is not None and child.proc.stdout.readline().strip() == b"shared"
        child.note_tree()
        managers = [pid for pid in child.tree if processes.cmdline(pid)[0].endswith("torch_shm_manager")]
        assert len(managers) == 1, {pid: processes.cmdline(pid) for pid in child.tree}
        assert _files(child.pid), "the child shared no file through the manager"
        started = time.monotonic()
        assert child.stop(timeout_s=10) != 0
        # the manager alone would wait 2 s after its last client before deleting and exiting
        assert time.monotonic() - started < 1.5
        assert not processes.is_alive(managers[0])
        assert _files(child.pid) == [], "the shared files were left behind"
    finally:
        child.stop(timeout_s=5)
        reap_tree(child.tree, owners=[child.pid])


def test_a_manager_whose_clients_live_is_not_released(tmp_path: Path) -> None:
    child = Child("sharer", [sys.executable, "-c", SHARES], tmp_path / "log.txt")
    try:
        assert child.proc.stdout is not None and child.proc.stdout.readline().strip() == b"shared"
        child.note_tree()
        shared = _files(child.pid)
        assert shared
        # the owner (a client) still runs: its files stay, whatever happens to a tree that outlives
        # the grace period
        reap_tree(child.tree, grace_s=0.3, owners=[child.pid])
        assert _files(child.pid) == shared
    finally:
        child.stop(timeout_s=5)
        for path in _files(child.pid):  # the grace period's SIGKILL left them
            path.unlink(missing_ok=True)
