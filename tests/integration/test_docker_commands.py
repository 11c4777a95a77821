"""What `docker compose up` runs, run in this venv (no Docker engine here): the compose file's own
commands and healthchecks, with its volumes as directories and its service names as "localhost".

The peers start before the bootstrap node, so they have to wait for its address file; the run
config comes from the environment the compose file passes through (P2PT_CONFIG, P2PT_ROUNDS).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from p2p_trainer.config import to_toml
from p2p_trainer.net.addresses import free_port
from p2p_trainer.run.launcher import thread_env
from tests.conftest import Tracker, tiny_config, wait_until

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 3


def _local(args: list[str], mounts: dict[str, Path], ports: dict[str, str]) -> list[str]:
    """A service's command or healthcheck with container paths, names, addresses and ports made local."""
    out = []
    for i, arg in enumerate(args):
        before = args[i - 1] if i else ""
        for inside, outside in mounts.items():
            if arg == inside or arg.startswith(inside + "/"):
                arg = str(outside) + arg[len(inside) :]
        if before == "--announce-host":
            arg = "localhost"  # a name, resolved at start, as the service names are in compose
        elif arg == "0.0.0.0":
            arg = "127.0.0.1"
        for fixed, free in ports.items():
            arg = arg.replace(f"127.0.0.1:{fixed}", f"127.0.0.1:{free}")
        if before in ("--port", "--metrics-port"):
            arg = ports.get(arg, arg)
        out.append(arg)
    return out


def _mounts(service: dict[str, Any], volumes: Path) -> dict[str, Path]:
    """{container path: directory} of a service's named volumes, one directory per volume."""
    mounts = {}
    for spec in service["volumes"]:
        volume, inside = spec.split(":")[:2]
        mounts[inside] = volumes / volume
        mounts[inside].mkdir(parents=True, exist_ok=True)
    return mounts


def _start(tracked: Tracker, argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return tracked(
            subprocess.Popen(
                [sys.executable, "-m", "p2p_trainer", *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        )


def _logged(log: Path, text: str) -> bool:
    return text in log.read_text()


def _healthy(test: list[str]) -> bool:
    assert test[:2] == ["CMD", "python"]
    argv = [sys.executable, *test[2:]]
    return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0


def test_compose_commands_bring_up_a_swarm_that_trains(tmp_path: Path, tracked: Tracker) -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    peers = [name for name, s in services.items() if s["command"][0] == "join"]
    config = tmp_path / "tiny.toml"
    config.write_text(to_toml(tiny_config("factored", rounds=50)))
    passed = set(compose["x-peer"]["environment"])
    env = {"P2PT_CONFIG": str(config), "P2PT_ROUNDS": str(ROUNDS)}  # the environment beats the file
    assert set(env) <= passed
    env = {**os.environ, **env, **thread_env(1)}
    boot_port = str(free_port("127.0.0.1"))
    ports = {"31337": boot_port, "9100": ""}
    volumes = tmp_path / "volumes"

    procs: dict[str, subprocess.Popen[bytes]] = {}
    health: dict[str, list[str]] = {}
    for name in peers:  # first: the bootstrap's address does not exist yet
        service = services[name]
        ports["9100"] = str(free_port("127.0.0.1"))
        mounts = _mounts(service, volumes)
        argv = _local([str(c) for c in service["command"]], mounts, ports)
        health[name] = _local([str(t) for t in service["healthcheck"]["test"]], mounts, ports)
        procs[name] = _start(tracked, argv, tmp_path / f"{name}.log", env)
    for name in peers:
        peer_log = tmp_path / f"{name}.log"
        waiting = functools.partial(_logged, peer_log, "waiting up to")
        assert wait_until(waiting, 120), peer_log.read_text()[-2000:]
        assert procs[name].poll() is None

    boot = services["bootstrap"]
    mounts = _mounts(boot, volumes)
    boot_argv = _local([str(c) for c in boot["command"]], mounts, ports)
    boot_health = _local([str(t) for t in boot["healthcheck"]["test"]], mounts, ports)
    address = Path(boot_argv[boot_argv.index("--address-file") + 1])
    assert not _healthy(boot_health)
    procs["bootstrap"] = _start(tracked, boot_argv, tmp_path / "bootstrap.log", env)
    assert wait_until(lambda: address.exists(), 120), (tmp_path / "bootstrap.log").read_text()[-2000:]
    assert address.read_text().startswith(f"/ip4/127.0.0.1/tcp/{boot_port}/p2p/12D3KooW")
    assert _healthy(boot_health)

    seen_healthy: set[str] = set()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and any(procs[n].poll() is None for n in peers):
        for name in peers:
            if name not in seen_healthy and procs[name].poll() is None and _healthy(health[name]):
                seen_healthy.add(name)
        time.sleep(0.5)
    for name in peers:
        log = (tmp_path / f"{name}.log").read_text()[-3000:]
        assert procs[name].wait(timeout=10) == 0, log
    assert seen_healthy == set(peers)

    from p2p_trainer.round_log import read_log

    for name in peers:
        rounds = read_log(volumes / "runs" / name / "metrics.jsonl").rounds
        assert len(rounds) == ROUNDS, name  # P2PT_ROUNDS, not the file's 50
        merged = [e for r in rounds for e in r.exchanges if e.ok and e.group_size >= 2]
        assert merged, f"{name} never exchanged with the other peer"
        assert (volumes / f"{name}-identity" / "peer.key").exists()  # kept in its volume
    assert (volumes / "bootstrap-identity" / "bootstrap.key").exists()

    procs["bootstrap"].send_signal(signal.SIGTERM)  # what `docker compose down` sends
    assert procs["bootstrap"].wait(timeout=60) == 128 + signal.SIGTERM
    assert not address.exists()  # no stale address for the next peers to dial
    assert wait_until(lambda: not any(tracked.left(p) for p in procs.values()), 20)
