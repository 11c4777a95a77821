"""`p2p-trainer invite`, `revoke` and `identity`: the commands a closed swarm's owner and its
peers use (`admission.py`). Heavy modules are imported inside the commands, so `--help` is quick."""

from __future__ import annotations

import time
from pathlib import Path

import click

from p2p_trainer.net.node_defaults import DEFAULT_PEER_IDENTITY


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
def revoke(peer_id: str, owner_key: str, swarm: str, out: str) -> None:
    """Withdraw PEER_ID's admission to a swarm with security.admission = "invitations" before its
    invitation expires; every peer holding the revocation refuses it."""
    from p2p_trainer.config.checks import ConfigError
    from p2p_trainer.config.security import SecurityConfig
    from p2p_trainer.net.identity import IdentityError, load_or_create_identity, load_signing_key
    from p2p_trainer.net.revocation import RevocationError
    from p2p_trainer.net.revocation import revoke as sign_revocation
    from p2p_trainer.train.checkpoint import atomic_write_text

    try:
        SecurityConfig(allow=(peer_id,))  # the same check a config's peer ids get
        owner = load_or_create_identity(Path(owner_key).expanduser())  # exists: click checked
        text = sign_revocation(load_signing_key(owner), swarm, peer_id).encode()
    except (ConfigError, IdentityError, RevocationError) as exc:
        raise click.ClickException(str(exc)) from None
    atomic_write_text(Path(out), text + "\n")
    click.echo(f"revoked {peer_id} in swarm {swarm!r} (owner {owner.peer_id}): {out}")
    click.echo(f'add it to the peers\' [security] section: revoked = ["{text}"]')
