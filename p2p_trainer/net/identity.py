"""A node's persistent Ed25519 identity, in the key format p2pd loads with `-id`.

The key file holds libp2p's protobuf `PrivateKey` (KeyType Ed25519 = 1, Data = 32-byte seed followed
by the 32-byte public key), 68 bytes in all. It is created on first run with mode 0600 and reused
afterwards, so the node's peer id stays the same across restarts. The peer id is computed here (an
identity multihash of the protobuf `PublicKey`, in base58) rather than with hivemind's
`PeerID.from_identity`, which assumes RSA keys.

`IdentityLock` holds an exclusive `flock` on `<key>.lock` for the node's lifetime, so a second
process on the same machine cannot start with a key that is already in use.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import nacl.signing

logger = logging.getLogger(__name__)

_KEY_TYPE_ED25519 = 1
_SEED_BYTES = 32
_PUBLIC_KEY_BYTES = 32
# protobuf: field 1 (varint) = key type, field 2 (length-delimited) = data
_PRIVATE_KEY_HEADER = bytes([0x08, _KEY_TYPE_ED25519, 0x12, _SEED_BYTES + _PUBLIC_KEY_BYTES])
_PUBLIC_KEY_HEADER = bytes([0x08, _KEY_TYPE_ED25519, 0x12, _PUBLIC_KEY_BYTES])
_KEY_FILE_BYTES = len(_PRIVATE_KEY_HEADER) + _SEED_BYTES + _PUBLIC_KEY_BYTES
_IDENTITY_MULTIHASH = 0x00
B58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


class IdentityError(RuntimeError):
    """The identity file cannot be used; the message says what to do."""


class IdentityInUseError(IdentityError):
    """Another live node already uses this identity."""


@dataclass(frozen=True)
class NodeIdentity:
    """A loaded identity: where its key lives and the peer id it gives the node."""

    path: Path
    peer_id: str
    """libp2p peer id in base58 (starts with "12D3KooW" for Ed25519 keys)."""
    public_key: bytes


def b58encode(data: bytes) -> str:
    """Bitcoin-alphabet base58, as libp2p uses for peer ids."""
    number = int.from_bytes(data, "big")
    digits = []
    while number > 0:
        number, remainder = divmod(number, 58)
        digits.append(B58_ALPHABET[remainder])
    leading_zeros = len(data) - len(data.lstrip(b"\x00"))
    return "1" * leading_zeros + "".join(reversed(digits))


def peer_id_from_public_key(public_key: bytes) -> str:
    """libp2p peer id of an Ed25519 public key: base58(identity multihash of the protobuf PublicKey)."""
    if len(public_key) != _PUBLIC_KEY_BYTES:
        raise ValueError(f"an Ed25519 public key has {_PUBLIC_KEY_BYTES} bytes, got {len(public_key)}")
    encoded = _PUBLIC_KEY_HEADER + public_key
    return b58encode(bytes([_IDENTITY_MULTIHASH, len(encoded)]) + encoded)


def encode_private_key(signing_key: nacl.signing.SigningKey) -> bytes:
    """The 68-byte protobuf PrivateKey that p2pd's `-id` flag loads."""
    return _PRIVATE_KEY_HEADER + bytes(signing_key) + bytes(signing_key.verify_key)


def decode_private_key(data: bytes, path: Path) -> nacl.signing.SigningKey:
    """Parse and check a key file's content; raise `IdentityError` saying what to do if it is wrong."""
    remedy = (
        f"delete {path} to create a new identity (the node gets a new peer id), or restore the original file"
    )
    if len(data) != _KEY_FILE_BYTES or not data.startswith(_PRIVATE_KEY_HEADER):
        raise IdentityError(
            f"identity file {path} is not an Ed25519 key in libp2p format "
            f"(expected {_KEY_FILE_BYTES} bytes starting with {_PRIVATE_KEY_HEADER.hex()}, "
            f"got {len(data)} bytes starting with {data[:4].hex() or 'nothing'}); {remedy}"
        )
    seed = data[len(_PRIVATE_KEY_HEADER) : len(_PRIVATE_KEY_HEADER) + _SEED_BYTES]
    stored_public = data[len(_PRIVATE_KEY_HEADER) + _SEED_BYTES :]
    signing_key = nacl.signing.SigningKey(seed)
    if bytes(signing_key.verify_key) != stored_public:
        raise IdentityError(
            f"identity file {path} is corrupt: its public key does not match its seed; {remedy}"
        )
    return signing_key


def _write_new_key(path: Path) -> None:
    """Create the key atomically: write a 0600 temp file in the same directory, then link it into place."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise IdentityError(f"cannot create directory {path.parent} for identity file {path}: {e}") from None
    data = encode_private_key(nacl.signing.SigningKey.generate())
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        # link() fails if the file appeared meanwhile, so a concurrent first run cannot overwrite a key
        os.link(tmp_name, path)
    except FileExistsError:
        logger.info("identity file %s was created concurrently; using that one", path)
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(tmp_name)


def _check_permissions(path: Path) -> None:
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):
        raise IdentityError(f"identity path {path} is not a regular file; point --identity at a key file")
    if mode & 0o077:
        raise IdentityError(
            f"identity file {path} has mode {stat.S_IMODE(mode):04o}, readable by other users; "
            f"run `chmod 600 {path}` (or delete it to create a new identity)"
        )


def load_or_create_identity(path: str | os.PathLike[str]) -> NodeIdentity:
    """Load the key at `path`, creating it (mode 0600) on first run. Raises `IdentityError`."""
    key_path = Path(path).expanduser().absolute()
    if not key_path.exists():
        logger.info("creating a new identity at %s", key_path)
        _write_new_key(key_path)
    _check_permissions(key_path)
    signing_key = decode_private_key(key_path.read_bytes(), key_path)
    public_key = bytes(signing_key.verify_key)
    identity = NodeIdentity(path=key_path, peer_id=peer_id_from_public_key(public_key), public_key=public_key)
    logger.info("identity %s: peer id %s", key_path, identity.peer_id)
    return identity


def load_signing_key(identity: NodeIdentity) -> nacl.signing.SigningKey:
    """The private key of a loaded identity, to sign the node's DHT records with (`envelope.py`)."""
    signing_key = decode_private_key(identity.path.read_bytes(), identity.path)
    if bytes(signing_key.verify_key) != identity.public_key:
        raise IdentityError(f"identity file {identity.path} changed while the node was starting")
    return signing_key


class IdentityLock:
    """An exclusive flock on `<key>.lock`, held while a node uses the key on this machine."""

    def __init__(self, identity: NodeIdentity) -> None:
        self._identity = identity
        self.lock_path = identity.path.with_name(identity.path.name + ".lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise IdentityInUseError(
                f"identity {self._identity.path} (peer id {self._identity.peer_id}) is already used by a "
                f"running node on this machine (pid {holder}); stop that node first, or give this node "
                f"its own key with a different --identity path"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock; the lock file stays (removing it would race)
            self._fd = None

    def __enter__(self) -> IdentityLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
