"""A swarm closed by invitations, with real processes: invited peers train together, others are refused."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from p2p_trainer.config import SecurityConfig
from p2p_trainer.net.identity import load_or_create_identity
from tests.conftest import SwarmFactory, rounds_of, tiny_config

pytestmark = pytest.mark.timeout(240)


def _cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "p2p_trainer", *args], capture_output=True, text=True, timeout=timeout_s
    )


def test_invited_peers_train_together_and_the_rest_are_refused(
    local_swarm: SwarmFactory, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    ids = [load_or_create_identity(keys / f"peer{i}.key").peer_id for i in range(4)]
    owner_key = tmp_path / "owner" / "owner.key"
    invitations = []
    for i in (0, 1, 3):
        out = tmp_path / f"peer{i}.invitation"
        made = _cli(
            "invite", ids[i], "--owner-key", str(owner_key), "--swarm", "default", "--invitation", str(out)
        )
        assert made.returncode == 0, made.stderr[-1500:]
        invitations.append(out)
    revocation = tmp_path / "peer3.revocation"  # peer3 was invited, then revoked
    made = _cli("revoke", ids[3], "--owner-key", str(owner_key), "--revocation", str(revocation))
    assert made.returncode == 0, made.stderr[-1500:]
    owner = load_or_create_identity(owner_key).peer_id
    revoked = (revocation.read_text().strip(),)
    security = SecurityConfig(admission="invitations", owners=(owner,), revoked=revoked)
    cfg = dataclasses.replace(tiny_config("factored", rounds=4), security=security)
    swarm = local_swarm(cfg, 2)
    peers = [swarm.start_peer(i, extra=("--invitation", str(invitations[i]))) for i in (0, 1)]

    def intruder(*extra: str, peer: int = 2) -> subprocess.CompletedProcess[str]:
        run_dir, key = tmp_path / f"peer{peer}", keys / f"peer{peer}.key"
        base = ("join", "--config", str(swarm.opts.config_path), *swarm.initial_peers.split())
        return _cli(*base, "--host", "127.0.0.1", "--identity", str(key), "--run-dir", str(run_dir), *extra)

    uninvited = intruder()
    assert uninvited.returncode == 1, uninvited.stderr[-1500:]
    assert f"this swarm would refuse peer {ids[2]}: it carries no invitation" in uninvited.stderr
    assert "ask a swarm owner for an invitation" in uninvited.stderr
    copied = intruder("--invitation", str(invitations[0]))  # peer0's invitation names peer0's id
    assert copied.returncode == 1 and f"its invitation is for peer {ids[0][-8:]}" in copied.stderr
    withdrawn = intruder("--invitation", str(invitations[2]), peer=3)
    assert withdrawn.returncode == 1 and "its invitation was revoked by owner" in withdrawn.stderr
    assert not rounds_of(tmp_path, 2) and not rounds_of(tmp_path, 3)  # refused before a first round

    for child in peers:
        assert child.proc.wait(timeout=150) == 0
    for i in (0, 1):
        rounds = rounds_of(tmp_path, i)
        assert len(rounds) == 4
        merged = [e for r in rounds for e in r.exchanges if e.merged and e.group_size == 2]
        assert merged, f"invited peer{i} never merged with the other"
