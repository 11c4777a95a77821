"""`p2p-trainer join` turns bad input into a clear message and a non-zero exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from p2p_trainer.config import to_toml
from tests.conftest import SwarmFactory, rounds_of, tiny_config, wait_until

pytestmark = pytest.mark.timeout(240)
GOOD_ADDR = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWBvkcNXCzZ17A1jo7mF9HtcCZwcPsptQscTUsBqapibya"


def _join(tmp: Path, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable,
        "-m",
        "p2p_trainer",
        "join",
        "--host",
        "127.0.0.1",
        "--run-dir",
        str(tmp / "run"),
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)


def test_malformed_multiaddr(tmp_path: Path) -> None:
    res = _join(tmp_path, "--initial-peers", "127.0.0.1:31337", "--identity", str(tmp_path / "k.key"))
    assert res.returncode != 0
    assert (
        "127.0.0.1:31337" in res.stderr and "/ip4/" in res.stderr
    )  # names the bad value and shows a good one


def test_unreachable_initial_peers_name_the_addresses(tmp_path: Path) -> None:
    res = _join(tmp_path, "--initial-peers", GOOD_ADDR, "--identity", str(tmp_path / "k.key"))
    assert res.returncode != 0
    assert GOOD_ADDR in res.stderr and "bootstrap" in res.stderr


def test_identity_with_open_permissions(tmp_path: Path) -> None:
    key = tmp_path / "k.key"
    _join(tmp_path, "--initial-peers", "garbage", "--identity", str(key))  # fails later; creates nothing
    key.write_bytes(b"not a key")
    os.chmod(key, 0o644)
    res = _join(tmp_path, "--initial-peers", GOOD_ADDR, "--identity", str(key))
    assert res.returncode != 0 and "chmod 600" in res.stderr
    os.chmod(key, 0o600)
    res = _join(tmp_path, "--initial-peers", GOOD_ADDR, "--identity", str(key))
    assert res.returncode != 0 and str(key) in res.stderr and "Error" in res.stderr


def test_bad_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[outer]\nmethod = 'allreduce'\n")
    res = _join(
        tmp_path, "--config", str(cfg), "--initial-peers", GOOD_ADDR, "--identity", str(tmp_path / "k.key")
    )
    assert res.returncode != 0 and "choose one of" in res.stderr


def test_mismatched_run_definition_names_the_fields(local_swarm: SwarmFactory, tmp_path: Path) -> None:
    swarm = local_swarm(tiny_config("factored", rounds=100_000), 1)
    initial = swarm.initial_peers
    try:
        swarm.start_peer(0)
        assert wait_until(lambda: len(rounds_of(tmp_path, 0)) >= 1, 180)
        other = tmp_path / "other.toml"
        other.write_text(to_toml(tiny_config("factored", rounds=3)).replace("seed = 0", "seed = 7"))
        res = _join(tmp_path, "--config", str(other), *initial.split(), "--identity", str(tmp_path / "o.key"))
        assert res.returncode != 0 and "seed" in res.stderr and "7" in res.stderr, res.stderr[-1500:]
    finally:
        swarm.stop(peer_timeout_s=30, boot_timeout_s=30)
