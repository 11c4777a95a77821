"""A swarm closed by invitations, with real processes: invited peers train together, others are refused."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from safetensors import safe_open

from p2p_trainer.config import SecurityConfig
from p2p_trainer.net.identity import load_or_create_identity
from tests.conftest import SwarmFactory, rounds_of, tiny_config, wait_until

pytestmark = pytest.mark.timeout(240)


def _cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "p2p_trainer", *args], capture_output=True, text=True, timeout=timeout_s
    )


def test_invited_peers_train_the_rest_are_refused_and_a_published_revocation_stops_one(
    local_swarm: SwarmFactory, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    ids = [load_or_create_identity(keys / f"peer{i}.key").peer_id for i in range(5)]
    owner_key = tmp_path / "owner" / "owner.key"
    owner = load_or_create_identity(owner_key).peer_id  # before the commands, which all read it
    invitations = {i: tmp_path / f"peer{i}.invitation" for i in range(4)}  # peer4 is never invited
    revocation = tmp_path / "peer3.revocation"  # peer3 was invited, then revoked in the config
    commands: list[tuple[str, ...]] = [
        ("invite", ids[i], "--owner-key", str(owner_key), "--swarm", "default", "--invitation", str(out))
        for i, out in invitations.items()
    ]
    commands.append(("revoke", ids[3], "--owner-key", str(owner_key), "--revocation", str(revocation)))
    with ThreadPoolExecutor(len(commands)) as pool:  # independent commands, started together
        for made in pool.map(lambda argv: _cli(*argv), commands):
            assert made.returncode == 0, made.stderr[-1500:]
    revoked = (revocation.read_text().strip(),)
    security = SecurityConfig(admission="invitations", owners=(owner,), revoked=revoked)
    cfg = dataclasses.replace(tiny_config("factored", rounds=100_000), security=security)
    swarm = local_swarm(cfg, 3)
    # peer2 stops ~10 s after the peers start here; the others train on long enough after that
    # to show they still merge (the refusals checked below need only the bootstrap's DHT)
    limit = ("--minutes", "0.9")
    peers = [swarm.start_peer(i, extra=(*limit, "--invitation", str(invitations[i]))) for i in range(2)]
    # peer2 checkpoints only when it is refused, so its checkpoint shows that save
    extra = (*limit, "--invitation", str(invitations[2]), "--checkpoint-every", "100000")
    peers.append(swarm.start_peer(2, extra=extra))

    # the owner revokes peer2 while it trains, and publishes that to the running swarm
    assert wait_until(lambda: len(rounds_of(tmp_path, 2)) >= 4, 120), "the swarm did not get going"
    published = _cli(
        "revoke", ids[2], "--owner-key", str(owner_key), "--revocation", str(tmp_path / "peer2.revocation"),
        *swarm.initial_peers.split(),
    )  # fmt: skip
    assert published.returncode == 0, published.stderr[-1500:]
    assert "published to swarm 'default'" in published.stdout
    revoked_at = time.time()
    assert peers[2].proc.wait(timeout=150) == 1, "the revoked peer did not stop"
    stopped_at = time.time()
    log = (tmp_path / "peer2" / "log.txt").read_text()
    assert f"this swarm now refuses peer {ids[2]}" in log and "its invitation was revoked by owner" in log
    saved = re.search(r"its state at round (\d+) is saved in", log)
    assert saved is not None, log[-1500:]
    with safe_open(str(tmp_path / "peer2" / "checkpoint.safetensors"), framework="pt") as f:
        assert json.loads(f.metadata()["p2p_trainer"])["round"] == int(saved.group(1))
    assert stopped_at - revoked_at < 60, (
        f"peer2 trained on {stopped_at - revoked_at:.0f} s after the revocation"
    )

    def intruder(*extra: str, peer: int = 4) -> subprocess.CompletedProcess[str]:
        run_dir, key = tmp_path / f"peer{peer}", keys / f"peer{peer}.key"
        base = ("join", "--config", str(swarm.opts.config_path), *swarm.initial_peers.split())
        return _cli(*base, "--host", "127.0.0.1", "--identity", str(key), "--run-dir", str(run_dir), *extra)

    uninvited = intruder()
    assert uninvited.returncode == 1, uninvited.stderr[-1500:]
    assert f"this swarm would refuse peer {ids[4]}: it carries no invitation" in uninvited.stderr
    assert "ask a swarm owner for an invitation" in uninvited.stderr
    copied = intruder("--invitation", str(invitations[0]))  # peer0's invitation names peer0's id
    assert copied.returncode == 1 and f"its invitation is for peer {ids[0][-8:]}" in copied.stderr
    withdrawn = intruder("--invitation", str(invitations[3]), peer=3)
    assert withdrawn.returncode == 1 and "its invitation was revoked by owner" in withdrawn.stderr
    rejoining = intruder("--invitation", str(invitations[2]), peer=2)  # the published revocation holds
    assert rejoining.returncode == 1 and "its invitation was revoked by owner" in rejoining.stderr
    assert not rounds_of(tmp_path, 3) and not rounds_of(tmp_path, 4)  # refused before a first round

    for i in (0, 1):
        assert peers[i].proc.wait(timeout=150) == 0
    for i in (0, 1):  # they trained together, and on together once peer2 was gone
        rounds = rounds_of(tmp_path, i)
        merged = [any(e.ok and e.group_size >= 2 for e in r.exchanges) for r in rounds]
        assert True in merged, f"invited peer{i} never merged in {len(rounds)} rounds"
        after = [m for r, m in zip(rounds, merged, strict=True) if r.unix_time > stopped_at + 5]
        assert len(after) >= 3 and sum(after) >= 0.75 * len(after), (
            f"peer{i} merged in {sum(after)} of {len(after)} rounds after peer2 stopped"
        )
