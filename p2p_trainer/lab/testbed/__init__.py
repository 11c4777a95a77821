"""Emulated WAN on one machine: hosts in network namespaces, capped links, CPU quotas, faults.

Each host gets its own network namespace with one interface, `eth0`, on a bridge that lives in a
separate "switch" namespace; nothing is added to the root namespace, and the hosts' private
addresses are reachable only from the testbed's own namespaces. Links are shaped with tbf on both
ends (upload: the host's `eth0`; download: the switch-side end), optionally through a user-space
delay line; processes run CPU-capped in a cgroup per host, single-threaded by environment.

    from p2p_trainer.lab.testbed import HostSpec, Testbed, TestbedConfig, measure_transfer

    hosts = (HostSpec("boot", cpu_cores=None), HostSpec("p0", up_rate_mbit=5, down_rate_mbit=20))
    with Testbed(TestbedConfig(hosts=hosts)) as tb:
        proc = tb.run("p0", [sys.executable, "-m", "p2p_trainer", "join", ...])
        tb.set_rate("p0", 1.0, 1.0); tb.cut("p0"); tb.heal("p0")      # faults on the link
        tb.stall(proc.pid); tb.resume(proc.pid); tb.kill(proc.pid)      # faults on the process
        tb.counters("p0").tx_bytes                                      # bytes on the wire

NAT: `HostSpec("rtr", nat=True)` is a router with a private LAN; `HostSpec("home", behind="rtr")`
sits on it, can dial out and cannot be dialled (`nat.py`; needs iptables).

Tests use the `testbed_factory` fixture from tests/conftest.py (skips without root or
`ip netns`); `bench/testbed_demo.py` is a bench. `cleanup_stale()` removes what a killed run
left. Needs root and iproute2 (`ip netns`, `tc` with tbf, pfifo); cgroup v1 `cpu` (or v2 `cpu`).
"""

from p2p_trainer.lab.testbed.layout import HostSpec, TestbedConfig, TestbedConfigError, uniform_hosts
from p2p_trainer.lab.testbed.measure import (
    CpuShare,
    TransferResult,
    measure_cpu_share,
    measure_rtt_ms,
    measure_transfer,
)
from p2p_trainer.lab.testbed.netns import LinkCounters, support_problem
from p2p_trainer.lab.testbed.stale import cleanup_stale
from p2p_trainer.lab.testbed.testbed import Host, Testbed, TestbedError

__all__ = [
    "CpuShare",
    "Host",
    "HostSpec",
    "LinkCounters",
    "Testbed",
    "TestbedConfig",
    "TestbedConfigError",
    "TestbedError",
    "TransferResult",
    "cleanup_stale",
    "measure_cpu_share",
    "measure_rtt_ms",
    "measure_transfer",
    "support_problem",
    "uniform_hosts",
]
