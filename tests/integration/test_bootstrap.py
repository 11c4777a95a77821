"""Bootstrap nodes and DHT peers as real processes on loopback; every process is reaped by PID."""

from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import pytest

from p2p_trainer import processes
from p2p_trainer.net import records
from p2p_trainer.net.dht import DHTConfig, NetNode, start_node
from p2p_trainer.net.identity import IdentityInUseError
from p2p_trainer.net.records import RunDefinitionMismatch
from p2p_trainer.net.swarm_entry import join_swarm

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 20.0


@dataclass
class Bootstrap:
    """A `p2p-trainer bootstrap` subprocess and what it started (found through /proc)."""

    proc: subprocess.Popen[str]
    stderr_path: Path
    initial_peers: list[str] = field(default_factory=list)
    descendants: list[int] = field(default_factory=list)
    tree: dict[int, int] = field(default_factory=dict)
    """The descendants with their start times (for reaping them by PID at teardown)."""
    sockets: list[Path] = field(default_factory=list)

    def stderr(self) -> str:
        return self.stderr_path.read_text()


def _read_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            return ""
    return proc.stdout.readline()


class Launch(Protocol):
    def __call__(self, *args: str, wait_ready: bool = ...) -> Bootstrap: ...


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launch]:
    started: list[Bootstrap] = []

    def _launch(*args: str, wait_ready: bool = True) -> Bootstrap:
        stderr_path = tmp_path / f"bootstrap-{len(started)}.log"
        command = [sys.executable, "-m", "p2p_trainer.net.bootstrap_command", "--host", "127.0.0.1", *args]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with stderr_path.open("w") as stderr:
            proc = subprocess.Popen(
                command,
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,  # its own process group, so a test can signal the group
            )
        node = Bootstrap(proc, stderr_path)
        started.append(node)
        if wait_ready:
            line = _read_line(proc, READY_TIMEOUT_S)
            assert line.startswith("--initial-peers "), f"no initial-peers line; stderr:\n{node.stderr()}"
            node.initial_peers = line.split()[1::2]
            node.descendants = sorted(processes.descendants(proc.pid))
            node.tree = {pid: t for pid in node.descendants if (t := processes.start_time(pid)) is not None}
            for pid in node.descendants:
                node.sockets += [p for d in processes.find_daemons(pid) for p in d.socket_paths]
        return node

    yield _launch
    for node in started:
        processes.stop_pid(node.proc.pid, grace_s=3)
        node.proc.wait(timeout=10)
        # what it started exits once it is gone (torch's shared-memory manager ~2 s later, and only
        # then are its /dev/shm files removed, so it is not signalled early); stragglers are killed
        processes.reap_tree(node.tree)
        if node.proc.stdout is not None:
            node.proc.stdout.close()


def _peer(tmp_path: Path, name: str, initial_peers: list[str]) -> NetNode:
    key = str(tmp_path / f"{name}.key")
    return start_node(DHTConfig(identity_path=key, host="127.0.0.1", initial_peers=tuple(initial_peers)))


def _wait_for_peers(node: NetNode, run: str, expected: set[str], timeout_s: float = 10.0) -> set[str]:
    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()
    while time.monotonic() < deadline and seen != expected:
        seen = {beat.peer_id for beat in records.list_live_peers(node, run)}
        time.sleep(0.2)
    return seen


def test_peers_joining_two_bootstrap_nodes_see_each_others_heartbeats(launch: Launch, tmp_path: Path) -> None:
    first = launch("--port", "0", "--identity", "first.key")
    second = launch("--port", "0", "--identity", "second.key", "--initial-peers", first.initial_peers[0])
    peers = [_peer(tmp_path, "a", first.initial_peers), _peer(tmp_path, "b", second.initial_peers)]
    try:
        for peer in peers:
            beat = records.Heartbeat(peer.peer_id, 1, 4096, 2.5, 1000.0, "0.1.0", records.now())
            assert records.publish_heartbeat(peer, "swarm", beat, ttl_s=30, signer=peer.signer)
        expected = {peer.peer_id for peer in peers}
        for peer in peers:
            assert _wait_for_peers(peer, "swarm", expected) == expected
    finally:
        for peer in peers:
            peer.shutdown()
    for peer in peers:
        assert not any(processes.is_alive(pid) for pid in peer.daemon_pids)


def test_the_same_identity_twice_is_refused(launch: Launch, tmp_path: Path) -> None:
    first = launch("--port", "0", "--identity", "node.key")
    again = launch("--port", "0", "--identity", "node.key", wait_ready=False)
    assert again.proc.wait(timeout=20) == 1
    assert "is already used by a running node on this machine" in again.stderr()
    # a peer with the bootstrap node's own key
    shutil.copy(tmp_path / "node.key", tmp_path / "copy.key")
    with pytest.raises(IdentityInUseError, match="is the identity of initial peer"):
        _peer(tmp_path, "copy", first.initial_peers)
    # a peer's key copied to another path (another machine, in effect): caught by the liveness record
    peer = _peer(tmp_path, "peer", first.initial_peers)
    try:
        shutil.copy(tmp_path / "peer.key", tmp_path / "peer-copy.key")
        with pytest.raises(IdentityInUseError, match="is already live in the swarm"):
            _peer(tmp_path, "peer-copy", first.initial_peers)
    finally:
        peer.shutdown()


def test_unreachable_initial_peers_give_an_actionable_error_in_bounded_time(launch: Launch) -> None:
    unreachable = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWQnzt8fuWAkZdLjt9HiEYGPEP1oSy6yFy4TSk4nRr1ZUr"
    start = time.monotonic()
    args = ["--port", "0", "--identity", "n.key", "--initial-peers", unreachable, "--connect-attempts", "3"]
    node = launch(*args, wait_ready=False)
    assert node.proc.wait(timeout=30) == 1
    elapsed_s = time.monotonic() - start
    message = node.stderr()
    assert f"none of the initial peers answered after 3 attempt(s): {unreachable}" in message
    assert "firewall" in message and "p2p-trainer bootstrap" in message
    assert elapsed_s < 30, elapsed_s  # interpreter start, 3 tries, 1 + 2 s of backoff; generous for load
    # each attempt's p2pd quit on its own; its socket files were found (by PID, during the start) and removed
    cleanups = [line for line in message.splitlines() if "of the failed start exited" in line]
    assert len(cleanups) == 3, message
    leftovers = re.findall(r"/tmp/hivemind-p2p\w+-[\w-]+\.sock", "\n".join(cleanups))
    assert leftovers and not [path for path in leftovers if Path(path).exists()]


def test_a_malformed_multiaddr_is_named_with_an_example(launch: Launch) -> None:
    node = launch(
        "--port", "0", "--identity", "n.key", "--initial-peers", "127.0.0.1:31337", wait_ready=False
    )
    assert node.proc.wait(timeout=20) == 1
    assert "malformed initial peer '127.0.0.1:31337'" in node.stderr()
    assert "expected a multiaddr like /ip4/" in node.stderr()


@pytest.mark.parametrize(
    ("signum", "to_group"),
    [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGTERM, True)],
    ids=["SIGTERM", "SIGINT", "SIGTERM-to-process-group"],
)
def test_a_signal_stops_the_bootstrap_cleanly(launch: Launch, signum: int, to_group: bool) -> None:
    """`to_group`: what `timeout`, systemd or a terminal's Ctrl-C do: p2pd and the DHT process get it too."""
    node = launch("--port", "0", "--identity", "n.key", "--status-interval-s", "0.2")
    commands = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] for pid in node.descendants}
    daemons = [pid for pid, command in commands.items() if command.endswith(b"/p2pd")]
    assert len(daemons) == 1, commands
    assert node.sockets[0].exists()  # p2pd's control socket
    time.sleep(0.5)
    if to_group:
        os.killpg(node.proc.pid, signum)
    else:
        node.proc.send_signal(signum)
    # a clean stop that still tells the caller it was interrupted: 128 + the signal's number
    assert node.proc.wait(timeout=15) == 128 + signum, node.stderr()
    assert not processes.is_alive(daemons[0])  # p2pd is gone by the time the command exits
    # and every other descendant (the DHT process, the watchdog) except torch's shm manager, which
    # importing torch starts and which exits on its own some seconds later (the fixture reaps it)
    ours = [pid for pid in node.descendants if commands[pid] != b"torch_shm_manager"]
    deadline = time.monotonic() + 5
    while any(processes.is_alive(pid) for pid in ours) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [commands[pid] for pid in ours if processes.is_alive(pid)]
    assert not [path for path in node.sockets if path.exists()]
    assert "peers connected, up" in node.stderr()


def test_a_peer_with_a_different_run_definition_is_refused(launch: Launch, tmp_path: Path) -> None:
    boot = launch("--port", "0", "--identity", "boot.key")
    ours = {"model": {"layers": 4}, "method": "factored", "data": "shakespeare", "seed": 0}
    config = DHTConfig(
        identity_path=str(tmp_path / "a.key"), host="127.0.0.1", initial_peers=tuple(boot.initial_peers)
    )
    first = join_swarm(config, "run", ours)
    try:
        other = replace(config, identity_path=str(tmp_path / "b.key"))
        with pytest.raises(
            RunDefinitionMismatch, match=r"method: ours='diloco', swarm's='factored'"
        ) as raised:
            join_swarm(other, "run", {**ours, "method": "diloco"})
        assert "seed" not in str(raised.value)
        same = join_swarm(other, "run", dict(ours))  # the refused peer left nothing behind: it can join
        same.shutdown()
    finally:
        first.shutdown()


def test_after_kill_9_the_watchdog_stops_p2pd_and_removes_its_sockets(launch: Launch) -> None:
    node = launch("--port", "0", "--identity", "n.key")
    assert node.sockets[0].exists()
    node.proc.kill()
    assert node.proc.wait(timeout=10) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while any(processes.is_alive(pid) for pid in node.descendants) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in node.descendants if processes.is_alive(pid)]
    assert not [path for path in node.sockets if path.exists()]
