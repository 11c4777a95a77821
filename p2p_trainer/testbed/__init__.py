"""Emulated WAN on one machine: hosts in network namespaces, capped links, CPU quotas, faults.

See `testbed.py` for a usage example, `pytest_fixture.py` for tests, `bench/testbed_demo.py` for a
bench. Needs root and iproute2 (`ip netns`, `tc` with tbf).
"""

from p2p_trainer.testbed.config import HostSpec, TestbedConfig, TestbedConfigError, uniform_hosts
from p2p_trainer.testbed.measure import (
    CpuShare,
    TransferResult,
    measure_cpu_share,
    measure_rtt_ms,
    measure_transfer,
)
from p2p_trainer.testbed.netns import LinkCounters, support_problem
from p2p_trainer.testbed.stale import cleanup_stale
from p2p_trainer.testbed.testbed import Host, Testbed, TestbedError

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
