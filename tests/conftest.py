"""Shared fixtures and helpers: a launched local swarm, tracked processes, emulated-WAN testbeds.

Every multi-process fixture stops and reaps what it started at teardown, by PID (the processes'
groups and the descendants noted while they ran), also when the test failed half-way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from p2p_trainer import processes
from p2p_trainer.config import RunConfig
from p2p_trainer.lab.testbed.layout import TestbedConfig
from p2p_trainer.lab.testbed.netns import support_problem
from p2p_trainer.lab.testbed.stale import cleanup_stale
from p2p_trainer.lab.testbed.testbed import Testbed
from p2p_trainer.lab.tiny_run import tiny_config as tiny_config  # the tests import it from here
from p2p_trainer.round_log import FinalRecord, RoundRecord, read_log
from p2p_trainer.run.launcher import LocalSwarm, local_options

# --------------------------------------------------------------------------- helpers


class ManualClock:
    """A clock the test moves by hand (`clock.now += ...`), for code that takes a `clock` callable."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def rounds_of(run_dir: Path, i: int) -> list[RoundRecord]:
    return read_log(run_dir / f"peer{i}" / "metrics.jsonl").rounds


def final_of(run_dir: Path, i: int) -> FinalRecord | None:
    """Peer i's first final record (a peer that finished once never trains on)."""
    finals = read_log(run_dir / f"peer{i}" / "metrics.jsonl").finals
    return finals[0] if finals else None


def wait_until(predicate: Callable[[], object], timeout_s: float, poll_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return False


def held_sockets(roots: list[int]) -> set[Path]:
    """hivemind socket files held open by these processes and their descendants.

    Taken while a test's processes run; after they stop, none of these files may remain. Only
    files of this test's own processes are checked, so other work on a shared machine cannot
    make the check fail or pass.
    """
    return processes.hivemind_socket_files(
        {pid for root in roots for pid in {root} | processes.descendants(root)}
    )


def node_sockets(key_path: Path) -> set[Path]:
    """Socket files of the running p2pd that uses the identity `key_path` (daemon and client).

    Unlike a before/after glob of /tmp, this stays right while other swarms run on the machine.
    """
    found: set[Path] = set()
    for entry in Path("/proc").iterdir():
        args = processes.cmdline(int(entry.name)) if entry.name.isdigit() else []
        if f"-id={key_path}" not in args:
            continue
        for arg in args:
            if arg.startswith("-listen=/unix") and "hivemind-p2pd-" in arg:
                daemon = Path(arg.removeprefix("-listen=/unix"))
                found |= {daemon, daemon.with_name(daemon.name.replace("p2pd", "p2pclient", 1))}
    return found


def remaining(paths: set[Path]) -> set[Path]:
    return {p for p in paths if p.exists()}


def skip_unless_supported() -> None:
    """Skip the calling test with the reason when this machine cannot run a testbed."""
    problem = support_problem()
    if problem is not None:
        pytest.skip(f"WAN testbed unavailable: {problem}")


# --------------------------------------------------------------------------- fixtures

SwarmFactory = Callable[[RunConfig, int], LocalSwarm]
TestbedFactory = Callable[[TestbedConfig], Testbed]


@pytest.fixture
def local_swarm(tmp_path: Path) -> Iterator[SwarmFactory]:
    """`launch(cfg, peers)`: a swarm in tmp_path with its bootstrap node up (peers: `start_peer`).

    Stopped and reaped at teardown; a test that checks the cleanup itself calls `stop()` first
    (stopping twice is harmless).
    """
    swarms: list[LocalSwarm] = []

    def launch(cfg: RunConfig, peers: int) -> LocalSwarm:
        swarm = LocalSwarm(local_options(tmp_path, cfg, peers))
        swarms.append(swarm)
        swarm.start_bootstrap()
        return swarm

    yield launch
    for swarm in reversed(swarms):
        swarm.stop(peer_timeout_s=20, boot_timeout_s=15)


class Tracker:
    """Processes a test started in their own session (`start_new_session=True`), tracked by PID.

    A background thread notes each one's descendants while it runs (they may leave its session, or
    outlive it); at teardown a process still running gets SIGTERM, then its group SIGKILL, and
    every noted descendant is waited for (and killed if it stays).
    """

    def __init__(self) -> None:
        self.procs: list[tuple[subprocess.Popen[Any], int | None]] = []
        self.trees: dict[int, dict[int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def __call__(self, proc: subprocess.Popen[Any]) -> subprocess.Popen[Any]:
        self.procs.append((proc, processes.start_time(proc.pid)))
        self.trees[proc.pid] = {}
        self._note(proc.pid)
        return proc

    def _note(self, pid: int) -> None:
        for child in processes.descendants(pid):
            started = processes.start_time(child)
            if started is not None:
                self.trees[pid].setdefault(child, started)

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            for proc, _ in list(self.procs):
                if proc.poll() is None:
                    self._note(proc.pid)

    def left(self, proc: subprocess.Popen[Any]) -> dict[int, str]:
        """Noted descendants of `proc` still alive: {pid: command line}."""
        tree = self.trees[proc.pid]
        return {
            pid: " ".join(processes.cmdline(pid)) for pid in tree if processes.same_process(pid, tree[pid])
        }

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for proc, started in self.procs:
            if proc.poll() is None:
                self._note(proc.pid)
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if processes.start_time(proc.pid) in (None, started):  # the PID was not reused
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            processes.reap_tree(self.trees[proc.pid], owners=[proc.pid])


@pytest.fixture
def tracked() -> Iterator[Tracker]:
    """`tracked(popen)` registers a process the test started; it and its descendants are reaped."""
    tracker = Tracker()
    yield tracker
    tracker.close()


_stale_checked: set[str] = set()


@pytest.fixture
def testbed_factory() -> Iterator[TestbedFactory]:
    """Build started testbeds; all are closed after the test, in reverse order (asserting that cleanup
    left nothing). Skips the test, with the reason, when not root or `ip netns`/`tc` is unavailable.
    Leftovers of earlier, dead test processes are removed once per session."""
    skip_unless_supported()
    opened: list[Testbed] = []

    def make(config: TestbedConfig) -> Testbed:
        if config.name_prefix not in _stale_checked:
            cleanup_stale(config.name_prefix)
            _stale_checked.add(config.name_prefix)
        tb = Testbed(config)
        tb.start()
        opened.append(tb)
        return tb

    yield make
    for tb in reversed(opened):
        tb.close()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in its own thread (in-memory transports submit to it)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
    loop.close()
