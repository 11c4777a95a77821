"""The swarm a chaos run acts on: a bootstrap node and peer processes, on loopback or in a testbed.

Both kinds hand out `Node`s with the same fault operations; a node is tracked by PID and always
reaped. On loopback a peer's process group holds the peer, its DHT process and its p2pd, so faults
reach all three; in the testbed every node has its own network namespace (and link) and faults go
through the testbed, which signals the process tree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import subprocess
from pathlib import Path
from typing import IO, Any, Protocol

from p2p_trainer.processes import Child, descendants, hivemind_socket_files
from p2p_trainer.run.launcher import (
    LocalOptions,
    LocalSwarm,
    bootstrap_argv,
    join_argv,
    peer_args,
    read_initial_peers,
    record_checks,
    thread_env,
)


class Node(Protocol):
    name: str
    removed_sockets: set[Path]

    @property
    def pid(self) -> int: ...

    def alive(self) -> bool: ...

    def kill(self) -> None:
        """SIGKILL the node and everything it started; reap it."""
        ...

    def stall(self) -> None: ...

    def resume(self) -> None: ...

    def stop(self, timeout_s: float) -> None:
        """SIGINT (clean shutdown), then SIGKILL after `timeout_s`; always reaps."""
        ...


class LocalNode:
    """A `Child` on loopback; faults go to its whole process group."""

    def __init__(self, child: Child) -> None:
        self.child, self.name = child, child.name
        self.removed_sockets: set[Path] = set()
        """Socket files of this node that its kill removed (p2pd's and its clients')."""

    @property
    def pid(self) -> int:
        return self.child.pid

    def alive(self) -> bool:
        return self.child.alive()

    def _group(self, sig: int) -> None:
        self.child.signal_group(sig)

    def kill(self) -> None:
        # nobody removes a SIGKILLed p2pd's socket files: note them first, remove them after
        sockets = hivemind_socket_files({self.pid} | descendants(self.pid))
        self._group(signal.SIGKILL)
        self.child.stop(timeout_s=10, wait_tree=False)  # the swarm's close waits for the rest
        for path in sockets:
            path.unlink(missing_ok=True)
        self.removed_sockets |= sockets

    def stall(self) -> None:
        self._group(signal.SIGSTOP)

    def resume(self) -> None:
        self._group(signal.SIGCONT)

    def stop(self, timeout_s: float) -> None:
        self._group(signal.SIGCONT)  # a stalled node cannot handle SIGINT
        self.child.stop(timeout_s=timeout_s, wait_tree=False)


class ChaosSwarm:
    """Starts the nodes of one chaos run; subclasses place them (loopback or testbed hosts)."""

    def __init__(self, opts: LocalOptions, startup_timeout_s: float = 60.0) -> None:
        self.opts, self.startup_timeout_s = opts, startup_timeout_s
        self.initial_peers = ""
        self._local = LocalSwarm(dataclasses.replace(opts, startup_timeout_s=startup_timeout_s))

    def start_bootstrap(self) -> Node:
        child = self._local.start_bootstrap()
        self.initial_peers = self._local.initial_peers
        return LocalNode(child)

    def start_peer(self, i: int, extra: list[str]) -> Node:
        return LocalNode(self._local.start_peer(i, extra))

    def throttle(self, i: int, rate_mbit: float) -> None:
        raise NotImplementedError("link events need the testbed (the scenario sets testbed = true)")

    def cut(self, i: int) -> None:
        raise NotImplementedError("link events need the testbed")

    def heal(self, i: int) -> None:
        raise NotImplementedError("link events need the testbed")

    def close(self) -> None:
        """Stop what still runs; wait for everything the nodes started (in all their lives)."""
        self._local.stop(peer_timeout_s=30, boot_timeout_s=10)


class TestbedNode:
    """A process in a testbed host; faults go through the testbed (process tree, owned PIDs only)."""

    def __init__(self, tb: Any, name: str, proc: subprocess.Popen[bytes], log: IO[bytes]) -> None:
        self.tb, self.name, self.proc, self._log = tb, name, proc, log
        self.removed_sockets: set[Path] = set()  # the testbed's kill removes p2pd's sockets itself

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            with contextlib.suppress(Exception):  # it may have exited between the check and the kill
                self.tb.kill(self.pid)
        self.proc.wait(timeout=10)
        self._log.close()

    def stall(self) -> None:
        self.tb.stall(self.pid)

    def resume(self) -> None:
        self.tb.resume(self.pid)

    def stop(self, timeout_s: float) -> None:
        if self.alive():
            with contextlib.suppress(Exception):
                self.tb.resume(self.pid)
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


class TestbedChaosSwarm(ChaosSwarm):
    """Every node in its own namespace: host "boot" for the bootstrap node, "p{i}" for peer i."""

    def __init__(self, opts: LocalOptions, rate_mbit: float | None, startup_timeout_s: float = 60.0) -> None:
        from p2p_trainer.lab.testbed import HostSpec, Testbed, TestbedConfig

        super().__init__(opts, startup_timeout_s)
        hosts = [HostSpec("boot", cpu_cores=None)] + [
            HostSpec(f"p{i}", up_rate_mbit=rate_mbit, down_rate_mbit=rate_mbit, cpu_cores=None)
            for i in range(opts.peers)
        ]
        self.tb = Testbed(TestbedConfig(hosts=tuple(hosts)))
        self.tb.start()

    def _run(self, host: str, name: str, argv: list[str], log_path: Path) -> TestbedNode:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab")
        env = thread_env(self.opts.torch_threads)
        proc = self.tb.run(host, argv, env=env, stdout=subprocess.PIPE, stderr=log)
        return TestbedNode(self.tb, name, proc, log)

    def start_bootstrap(self) -> Node:
        node = self._run(
            "boot",
            "bootstrap",
            bootstrap_argv(
                self.opts.run_dir / "keys" / "bootstrap.key",
                host=self.tb.address("boot"),
                extra=record_checks(self.opts.run),
            ),
            self.opts.run_dir / "bootstrap.log",
        )
        try:
            self.initial_peers = read_initial_peers(
                node.proc, self.opts.run_dir / "bootstrap.log", self.startup_timeout_s
            )
        except RuntimeError:
            node.kill()
            raise
        return node

    def start_peer(self, i: int, extra: list[str]) -> Node:
        host = f"p{i}"
        argv = join_argv(peer_args(self.opts, i, self.tb.address(host), extra), self.initial_peers)
        return self._run(host, f"peer{i}", argv, self.opts.run_dir / f"peer{i}" / "log.txt")

    def throttle(self, i: int, rate_mbit: float) -> None:
        self.tb.set_rate(f"p{i}", rate_mbit, rate_mbit)

    def cut(self, i: int) -> None:
        self.tb.cut(f"p{i}")

    def heal(self, i: int) -> None:
        self.tb.heal(f"p{i}")

    def close(self) -> None:
        self.tb.close()
