"""NAT routers in the testbed: a host behind one dials out, and nothing outside can dial it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from p2p_trainer.lab.testbed import TestbedConfig, cleanup_stale, measure_transfer
from p2p_trainer.lab.testbed import nat as tb_nat
from p2p_trainer.lab.testbed import netns as tb_netns
from tests.conftest import TestbedFactory
from tests.integration.nat_helpers import nat_hosts, skip_without_nat

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(60)
def test_host_behind_nat_dials_out_but_cannot_be_dialled(testbed_factory: TestbedFactory) -> None:
    skip_without_nat()
    tb = testbed_factory(TestbedConfig(hosts=nat_hosts(("lan", "rtr"))))
    assert tb.address("lan").startswith("192.168.")
    out = measure_transfer(tb, "lan", "pub", 200_000, timeout_s=10)
    assert out.error is None and out.n_bytes == 200_000, out
    # no route to the LAN from outside: refused at once, like a private address on the internet
    blocked = measure_transfer(tb, "pub", "lan", 10_000, timeout_s=3)
    assert blocked.error is not None and "unreachable" in blocked.error.lower(), blocked
    # and the router forwards nothing that starts outside, even to a host that routes via it
    tb_netns.run_cmd(["ip", "-n", tb.host("pub").netns, "route", "add", "192.168.100.0/24", "via",
                      tb.address("rtr")])  # fmt: skip
    routed = measure_transfer(tb, "pub", "lan", 10_000, timeout_s=3)
    assert routed.error is not None and "timed out" in routed.error.lower(), routed
    rules = tb_nat.rules(tb.host("rtr").netns)
    assert "MASQUERADE" in rules and "-j DROP" in rules


@pytest.mark.timeout(60)
def test_two_nats_cannot_dial_each_other(testbed_factory: TestbedFactory) -> None:
    skip_without_nat()
    tb = testbed_factory(TestbedConfig(hosts=nat_hosts(("a", "ra"), ("b", "rb"))))
    assert tb.address("a").split(".")[2] != tb.address("b").split(".")[2]  # two LANs
    for src in ("a", "b"):
        assert measure_transfer(tb, src, "pub", 100_000, timeout_s=10).error is None
    assert measure_transfer(tb, "a", "b", 10_000, timeout_s=3).error is not None
    assert measure_transfer(tb, "b", "a", 10_000, timeout_s=3).error is not None


_DIE_WITH_A_NAT = """
import json, os, signal, sys
from p2p_trainer.lab.testbed import HostSpec, Testbed, TestbedConfig
hosts = (HostSpec("rtr", None, None, None, nat=True), HostSpec("lan", None, None, None, behind="rtr"))
tb = Testbed(TestbedConfig(hosts=hosts, install_signal_handlers=False))
tb.start()
print(json.dumps({"name": tb.name}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.timeout(60)
def test_cleanup_stale_removes_a_dead_instances_routers_and_their_rules() -> None:
    skip_without_nat()
    proc = subprocess.run([sys.executable, "-c", _DIE_WITH_A_NAT], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=40, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    name = json.loads(proc.stdout.splitlines()[0])["name"]
    left = [ns for ns in tb_netns.list_namespaces() if ns.startswith(f"{name}-")]
    assert f"{name}-rtr" in left and f"{name}-lan" in left  # the router, its LAN host and its rules
    removed = cleanup_stale()
    assert {f"netns {name}-rtr", f"netns {name}-lan"} <= set(removed)
    assert not [ns for ns in tb_netns.list_namespaces() if ns.startswith(f"{name}-")]
