"""Testbed pieces that need no root: config validation, shaper sizes, process helpers."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from p2p_trainer import processes
from p2p_trainer.lab.testbed import HostSpec, TestbedConfig, TestbedConfigError, uniform_hosts
from p2p_trainer.lab.testbed.netns import (
    LinkCounters,
    NetnsError,
    ShaperParams,
    _tcp_retrans_segs,
    support_problem,
)
from p2p_trainer.lab.testbed.stale import _owner_pid
from tests.conftest import skip_unless_supported


def test_default_config_is_valid_and_addresses_stay_in_the_subnet() -> None:
    config = TestbedConfig(hosts=uniform_hosts(4))
    config.validate()
    assert [config.host_address(i) for i in range(4)] == [f"10.213.0.{i}" for i in range(1, 5)]
    assert config.prefix_len == 24


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (TestbedConfig(subnet="8.8.8.0/24"), "private"),
        (TestbedConfig(subnet="127.0.0.0/24"), "private"),
        (TestbedConfig(subnet="10.213.0.0/30"), "/28"),
        (TestbedConfig(hosts=(HostSpec("a"), HostSpec("a"))), "unique"),
        (TestbedConfig(hosts=(HostSpec("Bad Name"),)), "host name"),
        (TestbedConfig(hosts=(HostSpec("a", up_rate_mbit=0.0),)), "up_rate_mbit"),
        (TestbedConfig(hosts=(HostSpec("a", cpu_cores=0.0),)), "cpu_cores"),
        (TestbedConfig(name_prefix="x-y"), "name_prefix"),
        (TestbedConfig(hosts=uniform_hosts(15), subnet="10.213.0.0/28"), "do not fit"),
        (TestbedConfig(congestion_control="cubic; reboot"), "congestion_control"),
    ],
)
def test_invalid_configs_say_what_to_change(config: TestbedConfig, message: str) -> None:
    with pytest.raises(TestbedConfigError, match=message):
        config.validate()


def test_tbf_sizes_follow_the_rate_with_floors() -> None:
    shaper = ShaperParams(burst_s=0.002, queue_s=0.02)
    assert shaper.tbf_args(10.0) == ["tbf", "rate", "10000kbit", "burst", "15000", "limit", "45000"]
    args = shaper.tbf_args(1000.0)  # 125 MB/s: 250 kB burst, 2.5 MB queue
    assert args[args.index("burst") + 1] == "250000" and args[args.index("limit") + 1] == "2500000"


def test_counter_difference() -> None:
    assert LinkCounters(10, 20, 3, 4) - LinkCounters(1, 2, 1, 1) == LinkCounters(9, 18, 2, 3)
    assert (LinkCounters(10, 20, 3, 4, 7) - LinkCounters(1, 2, 1, 1, 2)).tcp_retrans_segs == 5


def test_tcp_retransmissions_are_read_from_the_snmp_table() -> None:
    snmp = (
        "Ip: Forwarding DefaultTTL\nIp: 2 64\n"
        "Tcp: RtoAlgorithm RtoMin ActiveOpens OutSegs RetransSegs InErrs\n"
        "Tcp: 1 200 10 5000 42 0\n"
    )
    assert _tcp_retrans_segs(snmp) == 42
    with pytest.raises(NetnsError, match="RetransSegs"):
        _tcp_retrans_segs("Ip: Forwarding\nIp: 2\n")


def test_stale_names_are_parsed_by_prefix_and_pid() -> None:
    assert _owner_pid("p2ptb-123-0-sw", "p2ptb") == 123
    assert _owner_pid("p2ptb-123-4", "p2ptb") == 123
    assert _owner_pid("p2ptbx-123-0-sw", "p2ptb") is None
    assert _owner_pid("other-123-0", "p2ptb") is None


def test_descendants_and_signals_by_pid() -> None:
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while not processes.descendants(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        (child,) = processes.descendants(parent.pid)
        processes.signal_pids([child, parent.pid], signal.SIGKILL)
        assert processes.wait_gone([child, parent.pid], 5.0) == set()
    finally:
        parent.kill()
        parent.wait()


def test_p2pd_socket_ids_come_from_command_lines() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(30)",
            "-listen",
            "/unix/tmp/hivemind-p2pd-Ab_c-9.sock",
        ]
    )
    try:
        deadline = time.monotonic() + 10  # until the child has exec'd its own command line
        while not processes.p2pd_socket_ids([proc.pid]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert processes.p2pd_socket_ids([proc.pid]) == {"Ab_c-9"}
        assert [p.name for p in processes.p2pd_socket_paths("Ab_c-9")] == [
            "hivemind-p2pd-Ab_c-9.sock",
            "hivemind-p2pclient-Ab_c-9.sock",
        ]
    finally:
        proc.kill()
        proc.wait()


def test_without_root_tests_skip_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert support_problem() == "the testbed needs root (network namespaces, tc, cgroups)"
    with pytest.raises(pytest.skip.Exception, match="WAN testbed unavailable: the testbed needs root"):
        skip_unless_supported()


def test_without_ip_tests_skip_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "ip" else "/usr/sbin/" + tool)
    assert support_problem() == "`ip` (iproute2) is not installed"
