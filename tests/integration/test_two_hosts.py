"""Two machines emulated with two network namespaces: bootstrap on one, peers on both."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from p2p_trainer.lab.testbed.layout import HostSpec, TestbedConfig
from p2p_trainer.run.launcher import JoinArgs, bootstrap_argv, join_argv, local_options, read_initial_peers
from tests.conftest import TestbedFactory, final_of, rounds_of, tiny_config

pytestmark = pytest.mark.timeout(300)


def test_training_works_across_two_namespaces(testbed_factory: TestbedFactory, tmp_path: Path) -> None:
    hosts = (HostSpec("a", 100.0, 100.0, None), HostSpec("b", 100.0, 100.0, None))
    tb = testbed_factory(TestbedConfig(hosts=hosts))
    opts = local_options(tmp_path, tiny_config("diloco", rounds=6), peers=3)
    boot_log = open(tmp_path / "bootstrap.log", "w")
    boot = tb.run(
        "a",
        bootstrap_argv(tmp_path / "boot.key", tb.address("a")),
        stdout=subprocess.PIPE,
        stderr=boot_log,
        text=True,
    )
    line = [read_initial_peers(boot, tmp_path / "bootstrap.log", 90)]
    assert line and line[0].startswith("--initial-peers"), "bootstrap did not print its address"
    assert tb.address("a") in line[0]
    peers = []
    for i, host in enumerate(["a", "b", "b"]):
        args = JoinArgs(
            config_path=opts.config_path,
            identity=tmp_path / f"p{i}.key",
            run_dir=tmp_path / f"peer{i}",
            host=tb.address(host),
            wait_for_peers=3,
        )
        argv = join_argv(args, line[0])
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
        boot_log.close()
    for i in range(3):
        rounds = rounds_of(tmp_path, i)
        assert len(rounds) == 6 and all(e.ok and e.group_size == 3 for r in rounds for e in r.exchanges)
        assert final_of(tmp_path, i) is not None
    # the peers in namespace b really talked across the link: b's interface carried the exchanges
    assert tb.counters("b").tx_bytes > sum(r.bytes_sent for r in rounds_of(tmp_path, 1))
