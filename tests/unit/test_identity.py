"""Identity: 0600 key in p2pd's format, stable peer id, refusals that say what to do."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import base58
import hivemind
import nacl.signing
import pytest

from p2p_trainer.net.identity import (
    IdentityError,
    IdentityInUseError,
    IdentityLock,
    b58encode,
    encode_private_key,
    load_or_create_identity,
)

pytestmark = pytest.mark.timeout(30)


def test_first_run_creates_a_0600_key_and_restart_reuses_it(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "node.key"
    first = load_or_create_identity(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.stat().st_size == 68
    assert first.peer_id.startswith("12D3KooW")
    again = load_or_create_identity(path)
    assert again.peer_id == first.peer_id
    assert [p.name for p in path.parent.iterdir()] == ["node.key"]  # no temp file left behind


def test_group_or_other_permissions_are_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    load_or_create_identity(path)
    os.chmod(path, 0o644)
    with pytest.raises(IdentityError, match=rf"mode 0644.*`chmod 600 {re.escape(str(path))}`"):
        load_or_create_identity(path)


@pytest.mark.parametrize(
    "content",
    [b"", b"not a key", b"\x08\x00\x12\x40" + bytes(64), os.urandom(1190)],
    ids=["empty", "text", "rsa-type", "random"],
)
def test_wrong_content_is_refused_with_the_fix(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "node.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, content)
    os.close(fd)
    with pytest.raises(
        IdentityError, match=rf"not an Ed25519 key.*delete {re.escape(str(path))} to create a new identity"
    ):
        load_or_create_identity(path)


def test_public_key_not_matching_the_seed_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    data = bytearray(encode_private_key(nacl.signing.SigningKey.generate()))
    data[-1] ^= 0xFF
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, bytes(data))
    os.close(fd)
    with pytest.raises(IdentityError, match=r"corrupt.*public key does not match"):
        load_or_create_identity(path)


def test_b58encode_matches_the_base58_package() -> None:
    for data in [b"", b"\x00", b"\x00\x00\x01", os.urandom(38)]:
        assert b58encode(data) == base58.b58encode(data).decode()


def test_second_lock_on_the_same_key_is_refused(tmp_path: Path) -> None:
    identity = load_or_create_identity(tmp_path / "node.key")
    expected = rf"already used by a running node on this machine \(pid {os.getpid()}\)"
    with IdentityLock(identity), pytest.raises(IdentityInUseError, match=expected):
        IdentityLock(identity).acquire()
    with IdentityLock(identity):  # released on exit, so it can be taken again
        pass


def test_peer_id_equals_what_p2pd_reports(tmp_path: Path) -> None:
    identity = load_or_create_identity(tmp_path / "node.key")
    dht = hivemind.DHT(
        start=True,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        identity_path=str(identity.path),
        check_if_identity_free=False,
    )
    try:
        assert dht.peer_id.to_base58() == identity.peer_id
    finally:
        dht.shutdown()
