"""`Testbed`: hosts in network namespaces on one bridge, with capped links, CPU quotas and cleanup.

    config = TestbedConfig(hosts=uniform_hosts(2, rate_mbit=10.0))
    with Testbed(config) as tb:
        proc = tb.run("h1", [sys.executable, "server.py"])   # a Popen, in h1's namespace and cgroup
        tb.address("h1")                                    # "10.213.0.2"
        tb.set_rate("h0", up_rate_mbit=5.0, down_rate_mbit=20.0)
        tb.cut("h0"); tb.heal("h0")                         # blackhole both directions, then restore
        tb.stall(proc.pid); tb.resume(proc.pid); tb.kill(proc.pid)
        tb.counters("h0").tx_bytes
    # namespaces, links, qdiscs, cgroups and processes are gone here, also after an exception

NAT: a host with `HostSpec(nat=True)` is a router holding a private LAN; a host whose `behind`
names it is linked to that LAN instead of the switch (`nat.py`: masquerade out, nothing in).

Latency: netem is missing on these kernels. `HostSpec.delay_ms` > 0 puts a user-space delay line
(relay.py: two TAP devices and a Python loop) into the host's link instead of a veth; it costs CPU
outside the peers' quotas, so it is off by default and plain links have ~0.05 ms RTT.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import IO, Any

from p2p_trainer import processes
from p2p_trainer.lab.testbed import nat, netns
from p2p_trainer.lab.testbed.cgroup import CpuCgroup, detect_layout
from p2p_trainer.lab.testbed.guard import CleanupGuard
from p2p_trainer.lab.testbed.layout import HostSpec, TestbedConfig, TestbedConfigError
from p2p_trainer.lab.testbed.netns import HOST_IF, LinkCounters, ShaperParams

logger = logging.getLogger(__name__)

_instance_counter = itertools.count()
STALL_TRIES = 3
"""SIGSTOP rounds `stall` makes before it gives up (see there for why one may not be enough)."""
STALL_RETRY_S = 0.2
"""How long stalled processes run between two rounds: time for a vfork child to reach its exec."""


class TestbedError(RuntimeError):
    """Setup failed, a request names something the testbed does not own, or cleanup left debris."""

    __test__ = False


@dataclass
class Host:
    """A host's namespace, address, link ends and current link state."""

    spec: HostSpec
    index: int
    netns: str
    address: str
    switch_if: str
    """The far end of the host's veth: on the switch, or on its router's LAN (`link_ns`)."""
    cgroup: CpuCgroup | None
    up_rate_mbit: float | None
    down_rate_mbit: float | None
    is_cut: bool = False
    relay: subprocess.Popen[str] | None = None
    """The user-space delay line of the link, if `spec.delay_ms` > 0; not one of the host's pids."""
    link_ns: str = ""
    """Namespace of the far end of the link: the switch's, or the router's for a host behind a NAT."""
    lan_hosts: int = 0
    """Hosts behind this host, if it is a NAT router."""
    router_ordinal: int = -1
    """Which NAT router of the testbed this host is (0-based), if it is one."""


class Testbed:
    """An emulated WAN; use as a context manager (or `start()` / `close()`)."""

    __test__ = False

    def __init__(self, config: TestbedConfig) -> None:
        config.validate()
        self.config = config
        self.name = f"{config.name_prefix}-{os.getpid()}-{next(_instance_counter)}"
        self.switch_ns = f"{self.name}-sw"
        self._shaper = ShaperParams(burst_s=config.burst_s, queue_s=config.queue_s)
        self._layout = detect_layout()
        self._root_cgroup: CpuCgroup | None = None
        self._hosts: dict[str, Host] = {}
        self._procs: dict[int, subprocess.Popen[Any]] = {}
        self._namespaces: list[str] = []
        self._guard = CleanupGuard(self.name, self._close_quietly, config.install_signal_handlers)
        self._lock = threading.RLock()
        self._started = False
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Testbed:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # with an exception already propagating, report cleanup debris in the log, not by masking it
        self.close(raise_errors=exc is None)

    def start(self) -> None:
        """Create the switch, cgroups and all configured hosts; on any failure, undo and raise."""
        if self._started:
            raise TestbedError(f"{self.name} was already started")
        self._started = True
        problem = netns.support_problem()
        if problem is not None:
            raise TestbedError(problem)
        self._guard.install()
        try:
            self._namespaces.append(self.switch_ns)
            netns.add_namespace(self.switch_ns)
            netns.add_bridge(self.switch_ns)
            if self._layout is not None:
                self._root_cgroup = CpuCgroup(self._layout, self.name)
                self._root_cgroup.create()
                self._root_cgroup.ensure_delegates_cpu()
            for spec in self.config.hosts:
                self.add_host(spec)
        except BaseException:
            self.close(raise_errors=False)
            raise
        quota_cores = sum(h.spec.cpu_cores or 0.0 for h in self._hosts.values())
        if quota_cores > (os.cpu_count() or 1):
            logger.warning(
                "testbed %s: CPU quotas add up to %.2f cores on a %d-core machine; hosts will get less "
                "than their quota and utilisation will not mean what it would on dedicated hardware",
                self.name, quota_cores, os.cpu_count() or 1,
            )  # fmt: skip
        logger.info("testbed %s up with %d hosts", self.name, len(self._hosts))

    def add_host(self, spec: HostSpec) -> Host:
        """Create one more host (namespace, link to the bridge, shaping, cgroup)."""
        spec.validate()
        with self._lock:
            if spec.name in self._hosts:
                raise TestbedConfigError(f"host {spec.name} exists already")
            if spec.cpu_cores is not None and self._layout is None:
                raise TestbedError(f"host {spec.name}: cpu_cores set, but no writable cpu cgroup here")
            router = self._router_of(spec)
            host = self._new_host(spec, router)
            self._hosts[spec.name] = host
            self._namespaces.append(host.netns)
            netns.add_namespace(host.netns, self.config.congestion_control)
            if router is not None:
                gateway = self.config.lan_address(router.router_ordinal, 0)
                nat.add_lan_link(router.netns, host.switch_if, host.netns, host.address, gateway)
            else:
                link = (self.switch_ns, host.switch_if, host.netns, host.address, self.config.prefix_len)
                if spec.delay_ms > 0:
                    host.relay = netns.add_delayed_link(*link, delay_ms=spec.delay_ms)
                else:
                    netns.add_link(*link)
            if spec.nat:
                nat.setup_router(host.netns, self.config.lan_address(host.router_ordinal, 0))
            self._apply_shaping(host)
            if self._root_cgroup is not None:
                host.cgroup = CpuCgroup(self._root_cgroup.layout, f"{self.name}/{spec.name}")
                host.cgroup.create()
                host.cgroup.set_quota(spec.cpu_cores)
                host.cgroup.set_weight(self.config.cpu_shares)
                # the instance's group competes with the rest of the machine as one entity
                self._root_cgroup.set_weight(min(self.config.cpu_shares * len(self._hosts), 262_144))
            return host

    def _router_of(self, spec: HostSpec) -> Host | None:
        """The NAT router `spec` sits behind (None: on the switch); checks NAT support first."""
        if not spec.nat and spec.behind is None:
            return None
        problem = nat.support_problem()
        if problem is not None:
            raise TestbedError(f"host {spec.name} needs a NAT router, but {problem}")
        if spec.behind is None:
            return None
        router = self._hosts.get(spec.behind)
        if router is None or not router.spec.nat:
            raise TestbedConfigError(f"host {spec.name}: behind={spec.behind!r} is not a NAT router here")
        return router

    def _new_host(self, spec: HostSpec, router: Host | None) -> Host:
        on_switch = [h for h in self._hosts.values() if h.spec.behind is None]
        if router is not None:  # on the router's LAN: .1 is the router, its hosts from .2
            router.lan_hosts += 1
            address = self.config.lan_address(router.router_ordinal, router.lan_hosts)
            far_end, link_ns = f"l{router.lan_hosts}", router.netns
        else:
            address, far_end, link_ns = (
                self.config.host_address(len(on_switch)),
                f"v{len(on_switch)}",
                self.switch_ns,
            )
        host = Host(
            spec=spec,
            index=len(self._hosts),
            netns=f"{self.name}-{spec.name}",
            address=address,
            switch_if=far_end,
            cgroup=None,
            up_rate_mbit=spec.up_rate_mbit,
            down_rate_mbit=spec.down_rate_mbit,
            link_ns=link_ns,
        )
        if spec.nat:
            host.router_ordinal = sum(h.spec.nat for h in self._hosts.values())
        return host

    def close(self, raise_errors: bool = True) -> None:
        """Kill every process of every host, delete namespaces and cgroups. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            with CleanupGuard.signals_deferred():
                errors = self._teardown()
                self._guard.uninstall()
        if errors:
            for err in errors:
                logger.error("testbed %s cleanup: %s", self.name, err)
            if raise_errors:
                raise TestbedError(f"cleanup of {self.name} left debris: {'; '.join(errors)}")
        else:
            logger.info("testbed %s removed", self.name)

    def _teardown(self) -> list[str]:
        """Kill, reap, delete. Every step runs even if an earlier one failed; failures are returned."""
        errors: list[str] = []

        def attempt(what: str, action: Callable[[], object]) -> None:
            try:
                action()
            except Exception as err:  # cleanup goes on; every failure is reported by `close`
                errors.append(f"{what}: {type(err).__name__}: {err}")

        relays = [host.relay for host in self._hosts.values() if host.relay is not None]
        pids: set[int] = {p.pid for p in [*self._procs.values(), *relays] if p.poll() is None}
        socket_ids: set[str] = set()

        def kill_all() -> None:
            pids.update(self._all_pids())
            socket_ids.update(processes.p2pd_socket_ids(pids))  # before the kill: cmdlines vanish
            processes.signal_pids(pids, signal.SIGKILL)

        attempt("kill", kill_all)
        for proc in self._procs.values():  # the caller owns their pipes: only reap
            attempt(f"reap {proc.pid}", partial(proc.wait, timeout=self.config.kill_grace_s))
        for relay in relays:
            attempt(f"reap relay {relay.pid}", partial(relay.communicate, timeout=self.config.kill_grace_s))

        def check_gone() -> None:
            left = processes.wait_gone(pids | self._all_pids(), self.config.kill_grace_s)
            if left:
                raise TestbedError(f"processes still alive: {sorted(left)}")

        attempt("wait", check_gone)
        for name in reversed(self._namespaces):
            attempt(f"netns {name}", partial(netns.delete_namespace, name))
        if self._root_cgroup is not None:
            attempt(f"cgroup {self._root_cgroup.path}", self._root_cgroup.remove)
        attempt("p2pd sockets", lambda: processes.remove_p2pd_sockets(socket_ids))
        return errors

    def _close_quietly(self) -> None:
        self.close(raise_errors=False)

    # ------------------------------------------------------------------ hosts and links

    @property
    def hosts(self) -> list[str]:
        return list(self._hosts)

    def host(self, name: str) -> Host:
        try:
            return self._hosts[name]
        except KeyError:
            raise TestbedError(f"no host {name!r} in {self.name}; hosts: {self.hosts}") from None

    def address(self, name: str) -> str:
        """The host's IPv4 address on its link: on the switch, or on its router's LAN."""
        return self.host(name).address

    def set_rate(self, name: str, up_rate_mbit: float | None, down_rate_mbit: float | None) -> None:
        """Change a host's caps at runtime (None: uncapped). A cut link stays cut until `heal`."""
        HostSpec(name, up_rate_mbit, down_rate_mbit, None).validate()
        host = self.host(name)
        host.up_rate_mbit, host.down_rate_mbit = up_rate_mbit, down_rate_mbit
        if not host.is_cut:
            self._apply_shaping(host)

    def cut(self, name: str) -> None:
        """Silently drop everything the host sends or is sent (a partition, not a link error)."""
        host = self.host(name)
        netns.drop_egress(host.netns, HOST_IF)
        netns.drop_egress(host.link_ns, host.switch_if)
        host.is_cut = True

    def heal(self, name: str) -> None:
        """Undo `cut`: restore the host's current rate caps."""
        host = self.host(name)
        self._apply_shaping(host)
        host.is_cut = False

    def _apply_shaping(self, host: Host) -> None:
        netns.set_egress(host.netns, HOST_IF, host.up_rate_mbit, self._shaper)
        netns.set_egress(host.link_ns, host.switch_if, host.down_rate_mbit, self._shaper)

    def counters(self, name: str) -> LinkCounters:
        """The host's interface counters: tx_bytes = uploaded, rx_bytes = downloaded."""
        return netns.read_counters(self.host(name).netns)

    def set_cpu(self, name: str, cpu_cores: float | None) -> None:
        """Change the host's CPU quota at runtime (a straggler: e.g. 0.1 core); None lifts it."""
        HostSpec(name, cpu_cores=cpu_cores).validate()
        cgroup = self.host(name).cgroup
        if cgroup is None:
            raise TestbedError(f"host {name} has no cgroup on this machine")
        cgroup.set_quota(cpu_cores)

    def throttled_time_s(self, name: str) -> float:
        """How long the host's processes were held back by the CPU quota so far (0 without cgroup)."""
        cgroup = self.host(name).cgroup
        return 0.0 if cgroup is None else cgroup.throttled_time_s()

    # ------------------------------------------------------------------ processes

    def run(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        stdin: int | IO[Any] | None = subprocess.DEVNULL,
        stdout: int | IO[Any] | None = None,
        stderr: int | IO[Any] | None = None,
        text: bool = False,
    ) -> subprocess.Popen[Any]:
        """Start `argv` in the host: its namespace, its CPU cgroup, single-threaded environment.

        The returned Popen's pid is the command's own (`ip netns exec` execs, it does not fork).
        The process gets its own session, so a terminal's Ctrl-C reaches only the caller, whose
        handler then cleans up the whole testbed.
        """
        host = self.host(name)
        if self._closed:
            raise TestbedError(f"{self.name} is closed")
        full_env = {**os.environ, **self.config.thread_env, **(env or {})}
        cmd = ["ip", "netns", "exec", host.netns, *argv]
        if host.cgroup is not None:
            # the shell joins the cgroup first, then becomes the command: no window outside it
            cmd = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(host.cgroup.procs_file), *cmd]
        proc = subprocess.Popen(
            cmd, env=full_env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr, text=text,
            start_new_session=True,
        )  # fmt: skip
        self._procs[proc.pid] = proc
        self._wait_inside(host, proc)
        logger.debug("started pid %d in %s: %s", proc.pid, name, " ".join(argv))
        return proc

    def _wait_inside(self, host: Host, proc: subprocess.Popen[Any]) -> None:
        """Return once `proc` runs in the host's namespace, so `pids` and `signal` know it."""
        ns_path = netns.NETNS_RUN_DIR / host.netns
        deadline = time.monotonic() + self.config.kill_grace_s
        while not processes.same_netns(proc.pid, ns_path) and proc.poll() is None:
            if time.monotonic() > deadline:
                raise TestbedError(f"pid {proc.pid} did not enter {host.netns}")
            time.sleep(0.002)

    def pids(self, name: str) -> set[int]:
        """PIDs of all processes in the host (its cgroup and its namespace), children included."""
        host = self.host(name)
        cg = host.cgroup.pids() if host.cgroup is not None else set()
        relay = {host.relay.pid} if host.relay is not None else set()
        return {pid for pid in (cg | netns.namespace_pids(host.netns)) - relay if processes.is_alive(pid)}

    def _all_pids(self) -> set[int]:
        found: set[int] = set()
        for name in self._hosts:
            found |= self.pids(name)
        return found

    def signal(self, pid: int, sig: signal.Signals, tree: bool = True) -> set[int]:
        """Send `sig` to `pid` (and its descendants if `tree`); return the PIDs signalled.

        Only processes that belong to this testbed's hosts can be signalled.
        """
        targets = self._targets(pid, tree)
        processes.signal_pids(targets, sig)
        return targets

    def _targets(self, pid: int, tree: bool) -> set[int]:
        owned = self._all_pids()
        if pid not in owned:
            raise TestbedError(f"pid {pid} is not a live process of {self.name}")
        return {pid} | (processes.descendants(pid) & owned if tree else set())

    def stall(self, pid: int, tree: bool = True) -> set[int]:
        """SIGSTOP the process (and its children, e.g. p2pd, so the peer stops answering too).

        Returns once all of them are stopped. A parent that is starting a child with vfork (as
        CPython's subprocess does) cannot stop until the child has exec'd, and a child stopped
        before its exec never gets there: when not all stop, all are let go on briefly and
        stopped again.
        """
        late: set[int] = set()
        for _ in range(STALL_TRIES):
            targets = self.signal(pid, signal.SIGSTOP, tree)
            late = processes.wait_stopped(targets, True, self.config.kill_grace_s / STALL_TRIES)
            if not late:
                return targets
            processes.signal_pids(targets, signal.SIGCONT)
            time.sleep(STALL_RETRY_S)
        states = ", ".join(f"{p} ({processes.state(p) or 'gone'})" for p in sorted(late))
        raise TestbedError(f"pids did not stop after {STALL_TRIES} tries of SIGSTOP: {states}")

    def resume(self, pid: int, tree: bool = True) -> set[int]:
        """SIGCONT what `stall` stopped; returns once all of them run again."""
        targets = self.signal(pid, signal.SIGCONT, tree)
        if processes.wait_stopped(targets, False, self.config.kill_grace_s):
            raise TestbedError(f"pids {sorted(targets)} did not all resume")
        return targets

    def kill_host(self, name: str) -> set[int]:
        """SIGKILL every process of the host (e.g. a whole peer, or a bootstrap node)."""
        pids = self.pids(name)
        self._kill_and_reap(pids)
        return pids

    def kill(self, pid: int, tree: bool = True) -> set[int]:
        """SIGKILL the process (and children), reap it if we started it, remove its p2pd sockets.

        A process this testbed started that has exited meanwhile (a zombie, or already reaped) is
        only reaped: a caller's `poll()` and this call race with the process's own exit, and a
        process on its way out leaves its host's namespace before it is a zombie."""
        if pid in self._procs and not processes.is_alive(pid):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._procs[pid].wait(timeout=self.config.kill_grace_s)
            return set()
        try:
            targets = self._targets(pid, tree)
        except TestbedError:
            if pid not in self._procs:
                raise
            # no longer in its namespace: it is exiting, so it is only reaped; its children
            # (p2pd) may still be running there
            children = processes.descendants(pid) & self._all_pids() if tree else set()
            self._kill_and_reap(children)
            try:
                self._procs[pid].wait(timeout=self.config.kill_grace_s)
            except subprocess.TimeoutExpired:
                raise TestbedError(f"pid {pid} left {self.name}'s hosts but did not exit") from None
            return children
        self._kill_and_reap(targets)
        return targets

    def _kill_and_reap(self, pids: set[int]) -> None:
        socket_ids = processes.p2pd_socket_ids(pids)  # before the kill: cmdlines vanish with it
        processes.signal_pids(pids, signal.SIGKILL)
        for pid in pids & self._procs.keys():
            self._procs[pid].wait(timeout=self.config.kill_grace_s)
        processes.wait_gone(pids, self.config.kill_grace_s)
        processes.remove_p2pd_sockets(socket_ids)
