"""Two machines emulated with two network namespaces: bootstrap on one, peers on both."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from p2p_trainer.lab.testbed.layout import HostSpec, TestbedConfig
from p2p_trainer.lab.testbed.pytest_fixture import TestbedFactory, testbed_factory  # noqa: F401  (fixture)
from tests.integration.swarm_helpers import final_of, local_options, rounds_of, tiny_config

pytestmark = pytest.mark.timeout(300)


def test_training_works_across_two_namespaces(testbed_factory: TestbedFactory, tmp_path: Path) -> None:  # noqa: F811
    hosts = (HostSpec("a", 100.0, 100.0, None), HostSpec("b", 100.0, 100.0, None))
    tb = testbed_factory(TestbedConfig(hosts=hosts))
    opts = local_options(tmp_path, tiny_config("diloco", rounds=6), peers=3)
    py = [sys.executable, "-m", "p2p_trainer"]
    boot = tb.run(
        "a",
        [
            *py,
            "bootstrap",
            "--host",
            tb.address("a"),
            "--port",
            "0",
            "--identity",
            str(tmp_path / "boot.key"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert boot.stdout is not None
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(boot.stdout.readline().strip()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(90)
    assert line and line[0].startswith("--initial-peers"), "bootstrap did not print its address"
    assert tb.address("a") in line[0]
    peers = []
    for i, host in enumerate(["a", "b", "b"]):
        argv = [
            *py,
            "join",
            "--config",
            str(opts.config_path),
            *line[0].split(),
            "--identity",
            str(tmp_path / f"p{i}.key"),
            "--host",
            tb.address(host),
            "--run-dir",
            str(tmp_path / f"peer{i}"),
            "--wait-for-peers",
            "3",
            "--torch-threads",
            "1",
        ]
        log = open(tmp_path / f"peer{i}.log", "w")
        peers.append((tb.run(host, argv, stdout=log, stderr=log), log))
    try:
        for proc, _ in peers:
            assert proc.wait(timeout=200) == 0
    finally:
        for proc, log in peers:
            if proc.poll() is None:
                tb.kill(proc.pid)
            log.close()
        tb.kill(boot.pid)
    for i in range(3):
        rounds = rounds_of(tmp_path, i)
        assert len(rounds) == 6 and all(e.ok and e.group_size == 3 for r in rounds for e in r.exchanges)
        assert final_of(tmp_path, i) is not None
    # the peers in namespace b really talked across the link: b's interface carried the exchanges
    assert tb.counters("b").tx_bytes > sum(r.bytes_sent for r in rounds_of(tmp_path, 1))
