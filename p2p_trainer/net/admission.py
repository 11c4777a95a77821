"""Admission: which peers a swarm lets in (SECURITY.md, "Admission").

`security.admission` is one of

- `open`: any peer whose records are validly signed (the default);
- `allow-list`: only the peer ids in `security.allow`;
- `invitations`: peers holding an invitation signed by one of the swarm owners in
  `security.owners`. An owner is an identity key like any node's; `p2p-trainer invite` signs, with
  it, the swarm's name, the invited peer id and an expiry. The invited peer passes the file to
  `join --invitation` and carries the invitation in every heartbeat, so each peer checks it for
  itself: no coordinator is asked, and an owner need not be online.

A peer that is not admitted never enters a view (its heartbeats are dropped and counted as
"not-admitted"), so it is in nobody's groups and its exchange streams are closed unread (the
transport takes messages only from the live view); the state server refuses it too. A joiner that
would be refused learns it before it starts (`check_self`), with what to change.

An invitation is bound to one peer id, and heartbeats are signed by their peer's key, so a copied
invitation admits nobody else. It is not secret; what it admits is listed, not guessed. An owner
withdraws one before it expires with a revocation (`revocation.py`): the peer is then refused
like an uninvited one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import nacl.signing

from p2p_trainer.config.security import MAX_REVOKED, SecurityConfig
from p2p_trainer.net import owner_text, revocation
from p2p_trainer.net.envelope import READ_DROPS
from p2p_trainer.net.identity import peer_id_from_public_key
from p2p_trainer.net.records import MAX_INVITATION_CHARS, DHTLike

logger = logging.getLogger(__name__)

DOMAIN = b"p2p-trainer/invitation/v1\x00"


class InvitationError(ValueError):
    """Not a well-formed, validly signed invitation; the message says why."""


@dataclass(frozen=True)
class Invitation:
    """An owner's signed statement: `peer_id` may train in `swarm` until `expires` (unix time)."""

    swarm: str
    peer_id: str
    expires: float
    owner_public_key: bytes
    signature: bytes

    @property
    def owner(self) -> str:
        """The owner's peer id."""
        return peer_id_from_public_key(self.owner_public_key)

    def encode(self) -> str:
        fields = {
            "s": self.swarm,
            "p": self.peer_id,
            "e": self.expires,
            "o": self.owner_public_key,
            "g": self.signature,
        }
        return owner_text.encode(fields)

    @staticmethod
    def decode(text: str) -> Invitation:
        """Parse (not verify) an invitation; raises `InvitationError` for anything malformed."""
        fields = owner_text.decode(text, MAX_INVITATION_CHARS, "an invitation", "invite", InvitationError)
        swarm, peer, expires = fields.get("s"), fields.get("p"), fields.get("e")
        owner, signature = fields.get("o"), fields.get("g")
        if not (isinstance(swarm, str) and isinstance(peer, str) and isinstance(expires, int | float)):
            raise InvitationError("an invitation names a swarm, a peer id and an expiry")
        if not (isinstance(owner, bytes) and len(owner) == 32 and isinstance(signature, bytes)):
            raise InvitationError("an invitation carries an owner's 32-byte key and its signature")
        if len(signature) != 64:
            raise InvitationError("an invitation's signature has 64 bytes")
        return Invitation(swarm, peer, float(expires), owner, signature)

    def verify(self) -> None:
        """Raise `InvitationError` unless the owner's key signed exactly this invitation."""
        owner_text.verify(self.owner_public_key, _message(self), self.signature, InvitationError)


def _message(inv: Invitation) -> bytes:
    return owner_text.signed_bytes(DOMAIN, [inv.swarm, inv.peer_id, inv.expires])


def issue(owner_key: nacl.signing.SigningKey, swarm: str, peer_id: str, expires: float) -> Invitation:
    """An invitation for `peer_id` to `swarm` until `expires`, signed with `owner_key`."""
    owner_text.check_names(swarm, peer_id, InvitationError)
    unsigned = Invitation(swarm, peer_id, float(expires), bytes(owner_key.verify_key), b"")
    signature = owner_key.sign(_message(unsigned)).signature
    return Invitation(swarm, peer_id, float(expires), unsigned.owner_public_key, signature)


class Admission:
    """This peer's admission rule for one swarm; `refusal` says why a peer is not admitted."""

    def __init__(self, cfg: SecurityConfig, swarm: str) -> None:
        self.mode, self.swarm = cfg.admission, swarm
        self.allow, self.owners = frozenset(cfg.allow), frozenset(cfg.owners)
        self._checked: dict[tuple[str, str], tuple[str | None, float]] = {}
        self._reported: set[str] = set()
        self._lock = threading.Lock()
        self._revoked: dict[str, tuple[str, str]] = {}
        """Revoked peer id -> (the revocation's text, its owner), for revocations that verified."""
        self._seen: set[str] = set()
        """Revocation texts already checked, valid or not: each costs one signature check."""
        for text, why in self.learn(cfg.revoked).items():
            logger.warning("ignoring security.revoked entry %s...: %s", text[:16], why)

    def learn(self, texts: Iterable[str]) -> dict[str, str]:
        """Hold the revocations among `texts` that an owner of this swarm signed (at most
        `MAX_REVOKED`); returns the new ones that do not verify, with why."""
        if self.mode != "invitations":
            return {}
        refused = {}
        for text in texts:
            with self._lock:
                if text in self._seen or len(self._revoked) >= MAX_REVOKED:
                    continue
                if len(self._seen) >= 4 * MAX_REVOKED:  # a flood of junk only costs checks again
                    self._seen.clear()
                self._seen.add(text)
            try:
                rev = revocation.check(text, self.owners, self.swarm)
            except revocation.RevocationError as exc:
                refused[text] = str(exc)
                continue
            with self._lock:
                self._revoked.setdefault(rev.peer_id, (text.strip(), rev.owner))
        return refused

    def revoked_by(self, peer_id: str) -> str | None:
        """The owner that revoked `peer_id` in this swarm, or None."""
        with self._lock:
            found = self._revoked.get(peer_id)
        return None if found is None else found[1]

    def revocations(self) -> list[str]:
        """The texts of the revocations this peer holds (what it republishes)."""
        with self._lock:
            return sorted(text for text, _ in self._revoked.values())

    @property
    def open(self) -> bool:
        return self.mode == "open"

    def refusal(self, peer_id: str, invitation: str = "", now: float | None = None) -> str | None:
        """Why `peer_id` (carrying `invitation`) may not train in this swarm, or None."""
        if self.mode == "open":
            return None
        if self.mode == "allow-list":
            return None if peer_id in self.allow else "its peer id is not on the swarm's allow-list"
        owner = self.revoked_by(peer_id)
        if owner is not None:
            return f"its invitation was revoked by owner {owner[-8:]}"
        now = time.time() if now is None else now
        with self._lock:
            cached = self._checked.get((peer_id, invitation))
        if cached is not None and (cached[0] is not None or now < cached[1]):
            return cached[0]
        why, expires = self._check_invitation(peer_id, invitation, now)
        with self._lock:
            if len(self._checked) > 4096:  # a flood of distinct invitations only costs checks
                self._checked.clear()
            self._checked[(peer_id, invitation)] = (why, expires)
        return why

    def _check_invitation(self, peer_id: str, text: str, now: float) -> tuple[str | None, float]:
        if not text:
            return "it carries no invitation", 0.0
        try:
            inv = Invitation.decode(text)
            inv.verify()
        except InvitationError as exc:
            return f"its invitation is invalid: {exc}", 0.0
        if inv.owner not in self.owners:
            return f"its invitation is signed by {inv.owner[-8:]}, not by an owner of this swarm", 0.0
        if inv.swarm != self.swarm:
            return f"its invitation is for swarm {inv.swarm!r}, not {self.swarm!r}", 0.0
        if inv.peer_id != peer_id:
            return f"its invitation is for peer {inv.peer_id[-8:]}", 0.0
        if inv.expires <= now:
            return "its invitation has expired", 0.0
        return None, inv.expires

    def admits(self, peer_id: str, invitation: str = "") -> bool:
        """`refusal` is None; a refusal is counted and logged once per peer."""
        why = self.refusal(peer_id, invitation)
        if why is None:
            return True
        READ_DROPS.count("not-admitted", f"peer {peer_id[-8:]}: {why}")
        with self._lock:
            first = peer_id not in self._reported
            self._reported.add(peer_id)
        if first:
            logger.warning("refused peer %s: %s (admission %s)", peer_id[-8:], why, self.mode)
        return False


def learn_published(admission: Admission, dht: DHTLike, swarm: str, prefer: Collection[str] = ()) -> None:
    """Have `admission` hold the valid revocations published for `swarm` in the DHT (`prefer`:
    publishers read first, `revocation.read`); published ones that do not verify are counted and
    logged (rate-limited) as forged."""
    if admission.mode != "invitations":
        return
    for text, why in admission.learn(revocation.read(dht, swarm, prefer)).items():
        READ_DROPS.count("wrong-owner", f"ignoring a published revocation {text[:16]}...: {why}")


def check_self(admission: Admission, peer_id: str, invitation: str) -> None:
    """Raise `InvitationError`, saying what to change, if this swarm would not admit this peer."""
    why = admission.refusal(peer_id, invitation)
    if why is None:
        return
    if admission.mode == "allow-list":
        fix = "ask the swarm's operators to add it to security.allow in the swarm's config"
    elif admission.revoked_by(peer_id) is not None:
        fix = "an owner withdrew it (security.revoked or the swarm's DHT); only they can lift that"
    else:
        fix = "ask a swarm owner for an invitation (`p2p-trainer invite`) and pass it with --invitation"
    raise InvitationError(f"this swarm would refuse peer {peer_id}: {why}; {fix}")


class _Node(Protocol):
    """The part of a running node `check_entry` uses."""

    @property
    def peer_id(self) -> str: ...

    def get(self, key: Any, latest: bool = False) -> Any: ...

    def store(self, key: Any, value: Any, expiration_time: float, subkey: Any = None) -> Any: ...


def check_entry(admission: Admission, node: _Node, invitation: str) -> None:
    """`check_self` for a node that has just started, after learning the revocations its swarm
    published: a revoked joiner learns it even if its own config does not list the revocation."""
    try:
        learn_published(admission, node, admission.swarm, prefer=admission.owners)
    except (TimeoutError, RuntimeError) as exc:  # the DHT's own errors: the config's list still holds
        logger.warning("could not read the swarm's revocations: %s", exc)
    check_self(admission, node.peer_id, invitation)
