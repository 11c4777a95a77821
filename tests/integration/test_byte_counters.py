"""What an exchange says it moved is what the hosts' interfaces carried (within 5%).

Two peers in two network namespaces run one butterfly exchange of a known vector over real p2pd
daemons; the exchange's own counts (payload bytes delivered and received) are compared with the
namespaces' interface counters read around it. The interfaces also carry TCP/IP and libp2p
framing and the DHT's keep-alives: that, and only that, is the slack.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from p2p_trainer.lab.testbed import TestbedConfig, uniform_hosts
from tests.conftest import TestbedFactory

APP = Path(__file__).with_name("testbed_apps") / "exchange_pair.py"
FLOATS = 3_000_000
PORT = 31460


def _line(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"no output (exit {proc.poll()})"
    result: dict[str, Any] = json.loads(line)
    return result


@pytest.mark.timeout(150)
@pytest.mark.parametrize("codec", ["float32", "int8"])
def test_exchange_byte_counts_match_the_interface_counters(
    testbed_factory: TestbedFactory, codec: str
) -> None:
    tb = testbed_factory(TestbedConfig(hosts=uniform_hosts(2, rate_mbit=None, cpu_cores=None)))
    base = [sys.executable, str(APP), "--port", str(PORT), "--floats", str(FLOATS), "--codec", codec]
    procs: list[subprocess.Popen[str]] = []
    try:
        first = tb.run(
            "h0",
            [*base, "--address", tb.address("h0")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(first)
        a = _line(first)
        second = tb.run(
            "h1",
            [*base, "--address", tb.address("h1"), "--initial-peer", a["maddrs"][0]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(second)
        b = _line(second)
        before = {h: tb.counters(h) for h in ("h0", "h1")}
        for proc, partner in ((first, b["peer_id"]), (second, a["peer_id"])):
            assert proc.stdin is not None
            proc.stdin.write(partner + "\n")
            proc.stdin.flush()
        results = {"h0": _line(first), "h1": _line(second)}
        moved = {h: tb.counters(h) - before[h] for h in ("h0", "h1")}
    finally:
        for proc in procs:
            with contextlib.suppress(Exception):
                assert proc.stdin is not None
                proc.stdin.close()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
    value_bytes = 4 if codec == "float32" else 1 + 4 / 128
    for host, res in results.items():
        assert res["ok"], res
        # each of 2 members sends its partner half the vector and half the mean back
        assert res["transport_sent"] == pytest.approx(FLOATS * value_bytes, rel=0.01)
        assert (
            res["result_sent"] == res["transport_sent"]
            and res["result_received"] == res["transport_received"]
        )
        wire = moved[host]
        print(
            f"{codec} {host}: tx/sent {wire.tx_bytes / res['transport_sent']:.4f}, rx/received "
            f"{wire.rx_bytes / res['transport_received']:.4f}"
        )
        assert res["transport_sent"] <= wire.tx_bytes <= 1.05 * res["transport_sent"], (host, res, wire)
        assert res["transport_received"] <= wire.rx_bytes <= 1.05 * res["transport_received"], (
            host,
            res,
            wire,
        )
