"""Peers behind NAT routers train with the swarm: reached through relays and their own connections.

Real namespaces, iptables masquerade and p2pd; the bootstrap node is the relay. A host behind a
NAT can dial out but cannot be dialled (test_nat.py checks the testbed for that).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from p2p_trainer.lab.testbed import HostSpec, Testbed, TestbedConfig
from p2p_trainer.net.identity import load_or_create_identity
from p2p_trainer.round_log import read_log
from p2p_trainer.run.launcher import JoinArgs, bootstrap_argv, join_argv, local_options, read_initial_peers
from tests.conftest import TestbedFactory, tiny_config
from tests.integration.nat_helpers import nat_hosts, skip_without_nat, stop

ROUNDS = 4
RELAY_RATE_APP = Path(__file__).with_name("testbed_apps") / "relay_rate.py"


@dataclass
class Swarm:
    tb: Testbed
    run_dir: Path
    peers: list[tuple[subprocess.Popen[Any], IO[str]]]

    def log(self, i: int) -> str:
        return (self.run_dir / f"peer{i}.log").read_text()


def run_swarm(
    tb: Testbed, tmp_path: Path, peer_hosts: list[str], extra: tuple[str, ...] = (), timeout_s: float = 30.0
) -> Swarm:
    """A bootstrap node on host "pub", one `join` per entry of `peer_hosts`, all run to the end;
    `timeout_s` bounds each exchange."""
    cfg = tiny_config("diloco", rounds=ROUNDS, timeout_s=timeout_s)
    opts = local_options(tmp_path, cfg, peers=len(peer_hosts))
    boot_log = open(tmp_path / "bootstrap.log", "w")
    boot = tb.run("pub", bootstrap_argv(tmp_path / "boot.key", tb.address("pub")), stdout=subprocess.PIPE,
                  stderr=boot_log, text=True)  # fmt: skip
    swarm = Swarm(tb, tmp_path, [])
    try:
        line = read_initial_peers(boot, tmp_path / "bootstrap.log", 90)
        for i, host in enumerate(peer_hosts):
            args = JoinArgs(
                config_path=opts.config_path,
                identity=tmp_path / f"p{i}.key",
                run_dir=tmp_path / f"peer{i}",
                host=tb.address(host),
                wait_for_peers=len(peer_hosts),
                extra=extra,
            )
            peer_log = open(tmp_path / f"peer{i}.log", "w")
            swarm.peers.append(
                (tb.run(host, join_argv(args, line), stdout=peer_log, stderr=peer_log), peer_log)
            )
        codes = [proc.wait(timeout=240) for proc, _ in swarm.peers]
        assert codes == [0] * len(codes), [swarm.log(i)[-3000:] for i in range(len(codes))]
    finally:
        for proc, log in swarm.peers:
            if proc.poll() is None:
                tb.kill(proc.pid)
            log.close()
        stop(tb, boot)
        boot_log.close()
    return swarm


def merged_rounds(swarm: Swarm, i: int, group: int) -> int:
    """Peer i's rounds whose every exchange merged a group of `group` peers."""
    rounds = read_log(swarm.run_dir / f"peer{i}" / "metrics.jsonl").rounds
    assert len(rounds) == ROUNDS
    return sum(all(e.ok and e.group_size == group for e in r.exchanges) and bool(r.exchanges) for r in rounds)


@pytest.mark.timeout(330)
def test_peer_behind_nat_trains_with_two_outside(testbed_factory: TestbedFactory, tmp_path: Path) -> None:
    skip_without_nat()
    tb = testbed_factory(TestbedConfig(hosts=nat_hosts(("lan", "rtr"), public=("pub", "a", "b"))))
    swarm = run_swarm(tb, tmp_path, ["a", "b", "lan"])
    natted = swarm.log(2)
    assert "reachability: other peers cannot dial this node (behind NAT" in natted, natted[-3000:]
    assert f"sees it as {tb.address('rtr')}" in natted
    assert "--announce-host" in natted and "forward TCP port" in natted
    assert "peers reach this node directly" in swarm.log(0)
    # the peer behind NAT merged with both others; the first round may still wait for routes
    for i in range(3):
        assert merged_rounds(swarm, i, 3) >= ROUNDS - 1, (i, swarm.log(i)[-3000:])


@pytest.mark.timeout(330)
def test_two_peers_behind_two_nats_train_through_the_relay(
    testbed_factory: TestbedFactory, tmp_path: Path
) -> None:
    skip_without_nat()
    tb = testbed_factory(TestbedConfig(hosts=nat_hosts(("x", "rx"), ("y", "ry"))))
    swarm = run_swarm(tb, tmp_path, ["x", "y"])
    for i, router in ((0, "rx"), (1, "ry")):
        assert f"sees it as {tb.address(router)}" in swarm.log(i), swarm.log(i)[-3000:]
    # neither can dial the other: every exchange went through the bootstrap node's relay
    for i in range(2):
        assert merged_rounds(swarm, i, 2) >= ROUNDS - 1, (i, swarm.log(i)[-3000:])
    for i in range(2):
        assert "through relays: " in swarm.log(i)
    assert "relayed " in (tmp_path / "bootstrap.log").read_text()


@pytest.mark.timeout(200)
def test_with_relay_off_two_nats_cannot_exchange_and_say_so(
    testbed_factory: TestbedFactory, tmp_path: Path
) -> None:
    skip_without_nat()
    tb = testbed_factory(TestbedConfig(hosts=nat_hosts(("x", "rx"), ("y", "ry"))))
    swarm = run_swarm(tb, tmp_path, ["x", "y"], extra=("--relay", "off"), timeout_s=4.0)
    for i in range(2):
        assert "with --relay off, peers that are not connected to it cannot send to it" in swarm.log(i)
        assert merged_rounds(swarm, i, 2) == 0  # each trained alone: the failure is the reported one
        assert "through relays" not in swarm.log(i)


def _line(proc: subprocess.Popen[str], err_log: Path) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("{"):
        # an app that printed nothing has exited or is exiting: say how, and what it logged
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        tail = err_log.read_text(errors="replace")[-3000:] if err_log.exists() else ""
        raise AssertionError(f"relay_rate.py printed {line!r}, exit status {proc.poll()}; its log:\n{tail}")
    return dict(json.loads(line))


def _relay_rate(tb: Testbed, tmp_path: Path, sender: str, receiver: str, n_bytes: int, *recv_args: str
                ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], str]:  # fmt: skip
    """Send `n_bytes` from host `sender` to host `receiver` with relay_rate.py; the bootstrap node
    (the relay) runs on "pub"; the receiver starts first. Returns what the receiver's keeper did
    (with "--keep" in `recv_args`), the sender's and receiver's results and the bootstrap node's log."""
    tmp_path.mkdir(exist_ok=True)
    boot_log = open(tmp_path / "bootstrap.log", "w")
    boot = tb.run("pub", bootstrap_argv(tmp_path / "boot.key", tb.address("pub")), stdout=subprocess.PIPE,
                  stderr=boot_log, text=True)  # fmt: skip
    ids = {h: load_or_create_identity(tmp_path / f"{h}.key").peer_id for h in (sender, receiver)}
    procs: list[subprocess.Popen[str]] = []
    logs: dict[int, Path] = {}
    try:
        initial_peer = read_initial_peers(boot, tmp_path / "bootstrap.log", 90).split()[1]

        def start(host: str, *args: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
            argv = [sys.executable, str(RELAY_RATE_APP), *args, "--identity", str(tmp_path / f"{host}.key")]
            argv += ["--host", tb.address(host), "--initial-peer", initial_peer]
            err_log = tmp_path / f"{host}.log"
            with open(err_log, "w") as err:
                proc = tb.run(
                    host, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
                )
            procs.append(proc)
            logs[proc.pid] = err_log
            ready = _line(proc, err_log)
            assert ready["ready"]
            return proc, ready

        recv, _ = start(receiver, "recv", "--sender", ids[sender], *recv_args)
        send, _ = start(sender, "send", "--target", ids[receiver], "--bytes", str(n_bytes))
        kept: dict[str, Any] = {}
        if "--keep" in recv_args:
            _tell(recv)
            kept = _line(recv, logs[recv.pid])
        _tell(send)
        sent, got = _line(send, logs[send.pid]), _line(recv, logs[recv.pid])
    finally:
        for proc in procs:
            if proc.poll() is None:
                tb.kill(proc.pid)
            proc.communicate()
        stop(tb, boot)
        boot_log.close()
    return kept, sent, got, (tmp_path / "bootstrap.log").read_text()


def _tell(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


@pytest.mark.timeout(200)
def test_relay_carries_a_large_message_at_about_the_link_rate(
    testbed_factory: TestbedFactory, tmp_path: Path
) -> None:
    skip_without_nat()
    rate_mbit, n_bytes = 20.0, 8_000_000
    hosts = (
        HostSpec("pub", 100.0, 100.0, None),
        HostSpec("rx", None, None, None, nat=True),
        HostSpec("x", rate_mbit, rate_mbit, None, behind="rx"),
        HostSpec("ry", None, None, None, nat=True),
        HostSpec("y", rate_mbit, rate_mbit, None, behind="ry"),
    )
    tb = testbed_factory(TestbedConfig(hosts=hosts))
    _, sent, got, boot_log = _relay_rate(tb, tmp_path, "x", "y", n_bytes)
    assert got == {"bytes": n_bytes, "relayed": 1} and sent["relayed"] == 1, (sent, got)
    bound_s = n_bytes * 8 / (rate_mbit * 1e6)  # each NATed link once: up from x, down to y
    print(f"relayed {n_bytes / 1e6:.0f} MB in {sent['elapsed_s']:.2f} s (link bound {bound_s:.2f} s)")
    assert bound_s < sent["elapsed_s"] < 2.0 * bound_s, sent
    assert "relayed 1 messages" in boot_log


@pytest.mark.timeout(200)
def test_peer_behind_nat_is_reached_over_the_connection_it_keeps(
    testbed_factory: TestbedFactory, tmp_path: Path
) -> None:
    skip_without_nat()
    tb = testbed_factory(TestbedConfig(hosts=nat_hosts(("lan", "rtr"), public=("pub", "out"))))
    # started after the peer behind NAT, the sender outside can open no stream to it, unless the
    # peer's own DHT traffic happened to dial the sender first: through the relay, or directly
    _, sent, got, _ = _relay_rate(tb, tmp_path / "alone", "out", "lan", 1_000_000)
    assert got["bytes"] == 1_000_000 and got["relayed"] == sent["relayed"] in (0, 1), (sent, got)
    print(f"without the keeper: {'relayed' if sent['relayed'] else 'direct'}")
    # with it, the peer behind NAT has a connection to the sender, and the message takes it
    kept, sent, got, boot_log = _relay_rate(tb, tmp_path / "kept", "out", "lan", 1_000_000, "--keep")
    assert kept["kept"] and got == {"bytes": 1_000_000, "relayed": 0} and sent["relayed"] == 0, (kept, sent)
    assert "relayed 0 messages" in boot_log
