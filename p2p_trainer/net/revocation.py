"""Revocations: a swarm owner withdrawing a peer's admission before its invitation expires.

`p2p-trainer revoke` signs, with an owner key, the swarm's name and the revoked peer id (the same
conventions as an invitation, `owner_text.py`). A revocation from any of the
swarm's `owners` refuses that peer id in that swarm whatever invitation it carries; it has no
expiry. Running peers keep the revocations they learn and pass them on, so lifting one takes
removing it from every peer's config and restarting the swarm once the published records expire.

Peers learn revocations two ways. Operators list them in `security.revoked`, which is not part
of the run definition, so adding one does not split the swarm. And every peer of a closed swarm
republishes the revocations it holds under `p2p-trainer/<swarm>/revocations` (subkey: its own
peer id, signed like every record) and reads the others' there when it refreshes its view, so a
revocation added to one peer's config reaches every peer, joiners included. What is read is
bounded (publishers, revocations per record, revocations kept) and each one is checked against
this peer's own owner list: a publisher can only repeat an owner's statement, never make one.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

import nacl.signing

from p2p_trainer.net import owner_text, records
from p2p_trainer.net.envelope import READ_DROPS, Signer
from p2p_trainer.net.identity import peer_id_from_public_key

DOMAIN = b"p2p-trainer/revocation/v1\x00"
MAX_REVOCATION_CHARS = 400
"""Longest revocation text (about 230 characters; 390 with a swarm name of the longest kind)."""
MAX_PER_RECORD = 8
"""Revocations one published record carries (8 of the longest fit `records.MAX_RECORD_BYTES`)."""
MAX_PUBLISHERS = 64
"""Publishers whose revocation records one read looks at."""


class RevocationError(ValueError):
    """Not a well-formed, validly signed revocation; the message says why."""


@dataclass(frozen=True)
class Revocation:
    """An owner's signed statement: `peer_id` may no longer train in `swarm`."""

    swarm: str
    peer_id: str
    owner_public_key: bytes
    signature: bytes

    @property
    def owner(self) -> str:
        return peer_id_from_public_key(self.owner_public_key)

    def encode(self) -> str:
        fields = {"s": self.swarm, "p": self.peer_id, "o": self.owner_public_key, "g": self.signature}
        return owner_text.encode(fields)

    @staticmethod
    def decode(text: object) -> Revocation:
        """Parse (not verify) a revocation; raises `RevocationError` for anything malformed."""
        fields = owner_text.decode(text, MAX_REVOCATION_CHARS, "a revocation", "revoke", RevocationError)
        swarm, peer, owner, signature = (fields.get(k) for k in ("s", "p", "o", "g"))
        if not (isinstance(swarm, str) and isinstance(peer, str)):
            raise RevocationError("a revocation names a swarm and a peer id")
        if not (isinstance(owner, bytes) and len(owner) == 32):
            raise RevocationError("a revocation carries an owner's 32-byte key")
        if not (isinstance(signature, bytes) and len(signature) == 64):
            raise RevocationError("a revocation carries a 64-byte signature")
        return Revocation(swarm, peer, owner, signature)

    def verify(self) -> None:
        """Raise `RevocationError` unless the owner's key signed exactly this revocation."""
        owner_text.verify(self.owner_public_key, _message(self), self.signature, RevocationError)


def _message(rev: Revocation) -> bytes:
    return owner_text.signed_bytes(DOMAIN, [rev.swarm, rev.peer_id])


def revoke(owner_key: nacl.signing.SigningKey, swarm: str, peer_id: str) -> Revocation:
    """A revocation of `peer_id` in `swarm`, signed with `owner_key`."""
    owner_text.check_names(swarm, peer_id, RevocationError)
    unsigned = Revocation(swarm, peer_id, bytes(owner_key.verify_key), b"")
    return Revocation(swarm, peer_id, unsigned.owner_public_key, owner_key.sign(_message(unsigned)).signature)


def check(text: object, owners: Iterable[str], swarm: str) -> Revocation:
    """The revocation in `text` if an owner of `swarm` signed it; else `RevocationError` says why."""
    rev = Revocation.decode(text)
    rev.verify()
    if rev.owner not in set(owners):
        raise RevocationError(f"it is signed by {rev.owner[-8:]}, not by an owner of this swarm")
    if rev.swarm != swarm:
        raise RevocationError(f"it is for swarm {rev.swarm!r}, not {swarm!r}")
    return rev


def revocations_key(swarm: str) -> str:
    return f"{records.KEY_PREFIX}/{swarm}/revocations"


def publish(
    dht: records.DHTLike, swarm: str, texts: list[str], ttl_s: float, signer: Signer, turn: int = 0
) -> bool:
    """Store `MAX_PER_RECORD` of `texts` under this peer's subkey of the swarm's key: the
    `turn`-th window of them in sorted order, so that successive turns carry every one (readers
    keep what they learn)."""
    ordered = sorted(texts)
    start = (turn * MAX_PER_RECORD) % len(ordered) if len(ordered) > MAX_PER_RECORD else 0
    body = records.pack({"revoked": (ordered[start:] + ordered[:start])[:MAX_PER_RECORD]})
    key = revocations_key(swarm)
    return records.seal_and_store(dht, signer, key, signer.peer_id, body, records.now() + ttl_s)


def read(dht: records.DHTLike, swarm: str, prefer: Collection[str] = ()) -> list[str]:
    """The revocation texts published for `swarm` (signed records only; not yet checked against
    the owners: `Admission.learn` does that), at most `MAX_PUBLISHERS` × `MAX_PER_RECORD`.

    Publishers in `prefer` (the admitted peers in view) are read first: anyone may store a record
    under their own subkey, and strangers whose ids sort first would otherwise fill the bound and
    hide the admitted peers' records."""
    key = revocations_key(swarm)
    entries = getattr(dht.get(key, latest=True), "value", None)
    if not isinstance(entries, dict):
        return []
    texts: list[str] = []
    publishers = sorted(p for p in entries if isinstance(p, str))
    preferred = set(prefer)
    ordered = [p for p in publishers if p in preferred] + [p for p in publishers if p not in preferred]
    for publisher in ordered[:MAX_PUBLISHERS]:
        try:
            fields = records.unpack(records.open_body(entries[publisher], key, publisher, verify=True))
            listed = fields.get("revoked")
            if not isinstance(listed, list) or len(listed) > MAX_PER_RECORD:
                raise records.RecordError(f"expected a list of at most {MAX_PER_RECORD} revocations")
            if not all(isinstance(t, str) and len(t) <= MAX_REVOCATION_CHARS for t in listed):
                raise records.RecordError(
                    f"a revocation is text of at most {MAX_REVOCATION_CHARS} characters"
                )
        except records.RecordError as e:
            READ_DROPS.count(e.reason, f"ignoring the revocations of {publisher[-8:]}: {e}")
            continue
        texts.extend(listed)
    return texts
