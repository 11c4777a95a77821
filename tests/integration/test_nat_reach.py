"""The reachability check against a real NAT router: behind it, with a port forward, and outside."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from p2p_trainer.lab.testbed import Testbed, TestbedConfig
from p2p_trainer.lab.testbed import nat as tb_nat
from p2p_trainer.run.launcher import bootstrap_argv, read_initial_peers
from tests.conftest import TestbedFactory
from tests.integration.nat_helpers import nat_hosts, skip_without_nat, stop

APP = Path(__file__).with_name("testbed_apps") / "reach_check.py"
FORWARDED_PORT = 40123


def _check(tb: Testbed, tmp_path: Path, host: str, initial_peer: str, *extra: str) -> dict[str, Any]:
    argv = [sys.executable, str(APP), "--identity", str(tmp_path / f"{host}.key"), "--host", tb.address(host)]
    proc = tb.run(host, [*argv, "--initial-peer", initial_peer, *extra], stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE, text=True)  # fmt: skip
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err[-3000:]
    return dict(json.loads(out.strip().splitlines()[-1]))


@pytest.mark.timeout(200)
def test_check_tells_nat_port_forward_and_public_apart(
    testbed_factory: TestbedFactory, tmp_path: Path
) -> None:
    skip_without_nat()
    tb = testbed_factory(
        TestbedConfig(hosts=nat_hosts(("lan", "rtr"), ("fwd", "rtr"), public=("pub", "out")))
    )
    tb_nat.forward_port(tb.host("rtr").netns, FORWARDED_PORT, tb.address("fwd"))
    boot_log = open(tmp_path / "bootstrap.log", "w")
    boot = tb.run("pub", bootstrap_argv(tmp_path / "boot.key", tb.address("pub")), stdout=subprocess.PIPE,
                  stderr=boot_log, text=True)  # fmt: skip
    try:
        initial_peer = read_initial_peers(boot, tmp_path / "bootstrap.log", 90).split()[1]
        natted = _check(tb, tmp_path, "lan", initial_peer)
        forwarded = _check(tb, tmp_path, "fwd", initial_peer, "--port", str(FORWARDED_PORT),
                           "--announce-host", tb.address("rtr"))  # fmt: skip
        public = _check(tb, tmp_path, "out", initial_peer)
    finally:
        stop(tb, boot)
        boot_log.close()
    assert natted["dialable"] is False and natted["seen_ip"] == tb.address("rtr"), natted
    assert tb.address("lan") in natted["own_ips"] and "behind NAT" in natted["advice"][0]
    # what the advice says to do, done: the router forwards the port and the peer announces it
    assert forwarded["dialable"] is True and forwarded["port"] == FORWARDED_PORT, forwarded
    assert forwarded["own_ips"] == [tb.address("rtr")] and "directly" in forwarded["advice"][0]
    assert public["dialable"] is True and public["seen_ip"] == tb.address("out"), public


CIRCUIT_APP = Path(__file__).with_name("testbed_apps") / "circuit_probe.py"
CIRCUIT_LIMIT = 128 * 1024
"""libp2p's default circuit v2 data limit, per direction of a relayed connection."""


@pytest.mark.timeout(150)
def test_p2pd_circuit_relay_resets_after_128_kib(testbed_factory: TestbedFactory) -> None:
    """Why p2p-trainer relays on its own streams (net/message_relay.py): p2pd's circuit relay reserves a
    slot for a peer behind NAT and opens relayed streams to it, then resets the connection after
    128 KiB, less than one copy of even the tiny test model's parameters (136 kB)."""
    skip_without_nat()
    tb = testbed_factory(TestbedConfig(hosts=nat_hosts(("lan", "rtr"), public=("pub", "out"))))
    procs: list[subprocess.Popen[str]] = []

    def start(host: str, *args: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
        argv = [sys.executable, str(CIRCUIT_APP), *args, "--host", tb.address(host)]
        proc = tb.run(
            host, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        procs.append(proc)
        assert proc.stdout is not None
        return proc, dict(json.loads(proc.stdout.readline()))

    try:
        _, relay = start("pub", "relay", "--port", "41000")
        relay_maddr = relay["maddrs"][0]
        target, target_info = start("lan", "target", "--relay", relay_maddr)
        sender, _ = start("out", "sender", "--relay", relay_maddr, "--target", target_info["peer_id"],
                          "--bytes", str(8 * CIRCUIT_LIMIT))  # fmt: skip
        assert sender.stdout is not None and target.stdin is not None and target.stdout is not None
        sent = json.loads(sender.stdout.readline())
        target.stdin.close()
        received = json.loads(target.stdout.readline())["received"]
    finally:
        for proc in procs:
            if proc.poll() is None:
                tb.kill(proc.pid)
            proc.wait()
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
    # a stream to the peer behind NAT opened through the circuit (its daemon took the first
    # writes), then the relay reset the connection before 128 KiB had arrived
    print(f"through p2pd's circuit: {received} bytes arrived, then {sent['error']}")
    cut = sent["error"].split(":")[0] in {"ConnectionResetError", "BrokenPipeError"}
    assert sent["written"] > 0 and cut, sent
    assert received < CIRCUIT_LIMIT < 8 * CIRCUIT_LIMIT, (received, sent)
