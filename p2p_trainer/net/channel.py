"""The direct data plane's session keys and sealed frames (`direct.py`).

The signed handshake proves who holds each identity key; this makes everything after it belong
to that handshake. Each side adds a fresh X25519 public key to its hello, inside what it signs,
so the Diffie-Hellman secret is known only to the two key holders. From it and both nonces come
one key per direction (BLAKE2b, keyed), and every frame after the handshake is sealed with
ChaCha20-Poly1305 under the next counter of its direction. Someone on the path can then neither
read, change, reorder, replay nor insert a frame: any of these fails the receiver's tag check,
which closes the connection. p2pd's streams gave the same through libp2p's secure channel.
"""

from __future__ import annotations

import nacl.bindings
import nacl.encoding
import nacl.exceptions
import nacl.hash
import nacl.public
import nacl.utils

KEY_BYTES = 32
TAG_BYTES = 16
_TO_LISTENER, _TO_DIALLER = b"p2pt-direct-d2l", b"p2pt-direct-l2d"


class Ephemeral:
    """One handshake's X25519 key pair; used once."""

    def __init__(self) -> None:
        self._secret = nacl.public.PrivateKey.generate()
        self.public = bytes(self._secret.public_key)

    def shared(self, their_public: bytes) -> bytes:
        if len(their_public) != KEY_BYTES:
            raise ValueError("handshake without a 32-byte session key")
        try:
            secret = nacl.bindings.crypto_scalarmult(bytes(self._secret), their_public)
        except nacl.exceptions.CryptoError as exc:  # a low-order point: no secret to agree on
            raise ValueError(f"unusable session key: {exc}") from None
        if secret == bytes(KEY_BYTES):
            raise ValueError("unusable session key (all-zero secret)")
        return bytes(secret)


class Sealer:
    """One direction's frames: sealed (or opened) in order, each under the next counter."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._counter = 0

    def _nonce(self) -> bytes:
        nonce = self._counter.to_bytes(12, "little")
        self._counter += 1
        return nonce

    def seal(self, data: bytes) -> bytes:
        return bytes(
            nacl.bindings.crypto_aead_chacha20poly1305_ietf_encrypt(data, None, self._nonce(), self._key)
        )

    def open(self, sealed: bytes) -> bytes:
        try:
            return bytes(
                nacl.bindings.crypto_aead_chacha20poly1305_ietf_decrypt(
                    sealed, None, self._nonce(), self._key
                )
            )
        except nacl.exceptions.CryptoError:
            raise ValueError("a frame failed its authentication tag") from None


def session(
    shared: bytes, dialler_nonce: bytes, listener_nonce: bytes, dialler: bool
) -> tuple[Sealer, Sealer]:
    """(outgoing, incoming) sealers of one side of a connection."""

    def key(direction: bytes) -> bytes:
        return bytes(
            nacl.hash.blake2b(
                dialler_nonce + listener_nonce,
                digest_size=KEY_BYTES,
                key=shared,
                person=direction,
                encoder=nacl.encoding.RawEncoder,
            )
        )

    to_listener, to_dialler = Sealer(key(_TO_LISTENER)), Sealer(key(_TO_DIALLER))
    return (to_listener, to_dialler) if dialler else (to_dialler, to_listener)
