"""`p2p-trainer invite`, `revoke` and `identity`: the commands a closed swarm's owner and its
peers use (`admission.py`). Heavy modules are imported inside the commands, so `--help` is quick."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from p2p_trainer.net.node_defaults import DEFAULT_PEER_IDENTITY

if TYPE_CHECKING:
    from p2p_trainer.net.envelope import Signer


@click.command("identity")
@click.option(
    "--identity",
    "identity_path",
    default=DEFAULT_PEER_IDENTITY,
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Identity key file (created, mode 0600, if missing).",
)
def identity(identity_path: str) -> None:
    """Print the peer id of an identity key: what an allow-list or an invitation names."""
    from p2p_trainer.net.identity import IdentityError, load_or_create_identity

    try:
        click.echo(load_or_create_identity(Path(identity_path).expanduser()).peer_id)
    except IdentityError as exc:
        raise click.ClickException(str(exc)) from None


@click.command("invite")
@click.argument("peer_id")
@click.option(
    "--owner-key",
    required=True,
    type=click.Path(dir_okay=False),
    help="The owner's identity key (its peer id goes in the swarm's security.owners); created if missing.",
)
@click.option("--swarm", default="default", show_default=True, help="The swarm the invitation is for.")
@click.option(
    "--days", default=30.0, show_default=True, type=click.FloatRange(min=0, min_open=True), help="Validity."
)
@click.option(
    "--invitation",
    "out",
    required=True,
    type=click.Path(dir_okay=False),
    help="Invitation file to write; the invited peer passes the same file to `join --invitation`.",
)
def invite(peer_id: str, owner_key: str, swarm: str, days: float, out: str) -> None:
    """Sign an invitation for PEER_ID (from `p2p-trainer identity`) to a swarm with
    security.admission = "invitations"."""
    from p2p_trainer.config.checks import ConfigError
    from p2p_trainer.config.security import SecurityConfig
    from p2p_trainer.net.admission import InvitationError, issue
    from p2p_trainer.net.identity import IdentityError, load_or_create_identity, load_signing_key
    from p2p_trainer.train.checkpoint import atomic_write_text

    try:
        SecurityConfig(allow=(peer_id,))  # the same check a config's peer ids get
        owner = load_or_create_identity(Path(owner_key).expanduser())
        invitation = issue(load_signing_key(owner), swarm, peer_id, time.time() + days * 86400)
    except (ConfigError, IdentityError, InvitationError) as exc:
        raise click.ClickException(str(exc)) from None
    atomic_write_text(Path(out), invitation.encode() + "\n")
    click.echo(f"invited {peer_id} to swarm {swarm!r} for {days:g} days: {out}")
    click.echo(f'the swarm\'s config needs: admission = "invitations", owners = ["{owner.peer_id}"]')


@click.command("revoke")
@click.argument("peer_id")
@click.option(
    "--owner-key",
    required=True,
    type=click.Path(dir_okay=False, exists=True),
    help="An owner's identity key (its peer id is in the swarm's security.owners).",
)
@click.option("--swarm", default="default", show_default=True, help="The swarm the revocation is for.")
@click.option(
    "--revocation",
    "out",
    required=True,
    type=click.Path(dir_okay=False),
    help="Revocation file to write; its text goes in the peers' security.revoked.",
)
@click.option(
    "--initial-peers",
    multiple=True,
    help="Also publish it to the running swarm through this node (a multiaddr as `p2p-trainer "
    "bootstrap` prints it; repeatable): its peers refuse PEER_ID within about a minute.",
)
def revoke(peer_id: str, owner_key: str, swarm: str, out: str, initial_peers: tuple[str, ...]) -> None:
    """Withdraw PEER_ID's admission to a swarm with security.admission = "invitations" before its
    invitation expires; every peer holding the revocation refuses it, and a revoked peer that is
    training stops. With --initial-peers the running swarm learns it at once (its peers pass it
    on); without, it takes effect where it is added to a peer's security.revoked."""
    from p2p_trainer.config.checks import ConfigError
    from p2p_trainer.config.security import SecurityConfig
    from p2p_trainer.net.addresses import AddressError, validate_initial_peers
    from p2p_trainer.net.envelope import Signer
    from p2p_trainer.net.identity import IdentityError, load_or_create_identity, load_signing_key
    from p2p_trainer.net.revocation import RevocationError
    from p2p_trainer.net.revocation import revoke as sign_revocation
    from p2p_trainer.train.checkpoint import atomic_write_text

    try:
        SecurityConfig(allow=(peer_id,))  # the same check a config's peer ids get
        validate_initial_peers(initial_peers)
        owner = load_or_create_identity(Path(owner_key).expanduser())  # exists: click checked
        signing_key = load_signing_key(owner)
        text = sign_revocation(signing_key, swarm, peer_id).encode()
    except (ConfigError, AddressError, IdentityError, RevocationError) as exc:
        raise click.ClickException(str(exc)) from None
    atomic_write_text(Path(out), text + "\n")
    click.echo(f"revoked {peer_id} in swarm {swarm!r} (owner {owner.peer_id}): {out}")
    click.echo(f'add it to the peers\' [security] section: revoked = ["{text}"]')
    if initial_peers:
        _publish_revocation(text, peer_id, swarm, Signer(signing_key), initial_peers)


PUBLISHED_TTL_S = 24 * 3600.0
"""How long an owner's own publication of revocations stays in the DHT: the swarm's peers
republish what they learn as long as they run, and this covers a swarm whose peers all left and
came back within a day. Use an owner key that no peer runs with: a peer's own shorter-lived
records under the same subkey lose to this one until it expires."""


def _publish_revocation(
    text: str, peer_id: str, swarm: str, signer: Signer, initial_peers: tuple[str, ...]
) -> None:
    """Store the revocation in the swarm's DHT under the owner's own subkey (signed by the owner,
    so peers read it as an owner's record), through a client node that joins no routing table,
    then read it back."""
    from p2p_trainer.net import revocation
    from p2p_trainer.net.status_client import StatusClient

    def by_this_owner(published: str) -> bool:
        try:
            revocation.check(published, (signer.peer_id,), swarm)
        except revocation.RevocationError:
            return False
        return published != text

    try:
        with StatusClient(initial_peers, writable=True) as client:
            # the record under the owner's subkey replaces the last one: carry its earlier ones on
            earlier = sorted(filter(by_this_owner, set(revocation.read(client, swarm, (signer.peer_id,)))))
            held = [text, *earlier[: revocation.MAX_PER_RECORD - 1]]
            stored = revocation.publish(client, swarm, held, PUBLISHED_TTL_S, signer)
            seen = text in revocation.read(client, swarm, prefer=(signer.peer_id,))
    except (TimeoutError, RuntimeError, ValueError) as exc:  # unreachable peers, the DHT's own errors
        raise click.ClickException(
            f"{exc}; the revocation file is written, add it to a peer's config"
        ) from None
    if not (stored and seen):
        raise click.ClickException(
            "the swarm's DHT did not keep the revocation; the file is written: run this again, "
            "or add it to a running peer's security.revoked"
        )
    click.echo(f"published to swarm {swarm!r}: its peers refuse {peer_id} within about a minute")
    if len(earlier) >= revocation.MAX_PER_RECORD:
        click.echo(
            f"this owner's record carries {revocation.MAX_PER_RECORD} revocations; "
            f"{len(earlier) + 1 - revocation.MAX_PER_RECORD} earlier ones are left to the peers' configs"
        )
