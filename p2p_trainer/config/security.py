"""The [security] section: what a peer checks before it trusts records, messages and contributions.

SECURITY.md states the threat model these checks answer. Every check is on by default; `defences
= false` turns them all off at once, which only the attack tests and benches should do (to show
that an attack is real).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from p2p_trainer.config.checks import check_fields, require

RobustMean = Literal["mean", "trimmed", "centred-clip"]
AdmissionMode = Literal["open", "allow-list", "invitations"]
MAX_REVOKED = 1024
"""Revocations a peer holds at most (from its config and the DHT together)."""
_B58 = set("123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz")


def _peer_ids(name: str, ids: tuple[str, ...]) -> None:
    for i, peer in enumerate(ids):
        require(
            peer.startswith("12D3KooW") and 40 <= len(peer) <= 64 and set(peer) <= _B58,
            f"{name}[{i}]={peer!r}: expected an Ed25519 peer id (12D3KooW..., as `join` logs it)",
        )


@dataclass(frozen=True)
class SecurityConfig:
    """Checks on what other peers send: DHT records, stream messages, contributions and state."""

    defences: bool = True
    """Master switch: false accepts whatever a well-formed record or message says (attack tests)."""
    round_window: int = 100
    """A heartbeat claiming a round more than this many rounds above the live peers' median round
    is ignored (never a donor, never a rejoin target); honest peers lag by a few rounds."""
    clock_skew_s: float = 60.0
    """Heartbeat timestamps and round starts further ahead of this peer's clock are not believed."""
    max_throughput_tokens_per_s: float = 1e9
    """A heartbeat claiming a higher throughput is ignored; far above what one peer processes."""
    donor_tolerance: float = 0.05
    """A joiner adopts a donor's state only if a second donor serves the same one, or one within
    this relative L2 distance of φ (peers of gossip methods hold slightly different states)."""
    donor_loss_margin: float = 0.25
    """A joiner refuses a donor's state whose φ predicts the joiner's validation batches worse than
    its own φ (the seed when it joins, its current φ when it rejoins the swarm's round) by more than
    this fraction: training lowers that loss, so a much higher one is a state that was not trained
    from this run's model, whatever its round and however many donors serve it (a forger alone in
    sight, or two that agree). A joiner without validation batches (a workload without them)
    cannot check and says so."""
    update_ratio_max: float = 6.0
    """R (docs/algorithms.md §10): a contribution's update (vector − reference) may be at most R
    times the part owner's own update on that part (times the sender's tokens over the owner's
    where the owner's round was shorter). Honest members stay within 2.4 on the default model
    (factored and NoLoCo, pairs) and 4 on the integration tests' 5-step rounds, so 6 rejects only
    what is clearly not one round's training."""
    cosine_min: float = -0.8
    """Lowest cosine between a contribution's update and the owner's own on a part (§10). Honest
    updates of one round mostly point the same way, but short noisy rounds reach −0.5 (the tiny
    test model at 5 inner steps), so only updates close to the owner's own reversed are refused.
    Both bounds also hold a part owner's weighted mean: the mean of the others' updates that it
    implies, once this member's own share is taken out, must pass them too."""
    result_cosine_min: float = 0.0
    """Lowest cosine between a part owner's result update and this member's own (§10), where this
    member's weight is at least half the others' mean: its update is then a fair share of the
    weighted mean, and an honest result does not point against it (0.5 to 1 on the tiny test
    model); a reversed result does. Not held where the member did a few steps of a round (a
    joiner's first; the mean of the others' updates the result implies is held to `cosine_min`),
    in a re-agreement (its mean points along the drift between states), or under a robust mean of
    three or more, which may leave the member's own update out (held to `cosine_min`)."""
    result_ratio_max: float = 7.0
    """R' (§10): a part owner's result may be at most R' times this member's own update away from
    this member's own values; R + 1 is what a mean of contributions within R allows (honest
    results on the tiny test model: at most 1.2)."""
    weight_ratio_max: float = 1.5
    """§10: a claimed weight may be at most this many times the larger of this peer's own weight
    and one full round's tokens: survivors topping up a dead peer's share (§6) stay below it."""
    robust_mean: RobustMean = "mean"
    """§10: how a part owner merges a group of three or more: the weighted `mean`, a coordinate-wise
    `trimmed` mean (the largest and smallest value dropped, unweighted), or `centred-clip` (each
    contribution's distance from the owner's own values clipped to the owner's own update norm).
    Pairs always use the mean: with two there is nobody to outvote."""
    penalty_half_life: float = 6.0
    """§10: a peer that sent a contribution or result outside the bounds is left out of this peer's
    groups; its penalty halves every this many exchanges of this peer (about three rounds of
    factored mixing) and it is back once below one half."""
    sender_mailbox_payloads: float = 4.0
    """Most payload bytes one sender may have waiting in the mailbox, in largest messages (the
    transport's payload limit); past it that sender's oldest messages are dropped first."""
    sender_mailbox_messages: int = 64
    """Most messages one sender may have waiting in the mailbox (oldest dropped first)."""
    sender_open_streams: int = 8
    """Most incoming streams one sender may have open at once; further ones are closed unread."""
    stream_read_timeout_s: float = 60.0
    """Longest an incoming message may take to arrive whole; a stream that stalls is closed."""
    state_serves_per_minute: float = 4.0
    """Full states one peer may download from this one per minute (a burst of this many, then
    refilled at this rate; net/serve_limits.py). A joiner needs one, and a second where it waits
    to enter (it also asks for a few headers, a tenth each); a rejoin one more."""
    state_serves_concurrent: int = 2
    """Full state transfers this peer runs at once, whoever asks: the uplink it lends joiners."""
    admission: AdmissionMode = "open"
    """Who may train in this swarm (`net/admission.py`): `open` (any validly signed peer),
    `allow-list` (the peer ids in `allow`) or `invitations` (peers holding an invitation signed by
    one of the `owners`, from `p2p-trainer invite`). Part of the run definition when not open."""
    allow: tuple[str, ...] = ()
    """Peer ids admitted with `admission = "allow-list"`."""
    owners: tuple[str, ...] = ()
    """Peer ids of the owner keys whose invitations admit a peer with `admission = "invitations"`."""
    revoked: tuple[str, ...] = ()
    """Revocations from `p2p-trainer revoke`, as the text it prints: a peer an owner revoked is
    refused whatever invitation it carries. Not part of the run definition, so operators add one
    to their peers' configs without splitting the swarm (the peers also pass it on through the
    DHT); one that does not verify against `owners` and this swarm is ignored with a warning."""

    def __post_init__(self) -> None:
        check_fields(self, "security")
        require(self.round_window >= 1, f"security.round_window={self.round_window}: use >= 1")
        require(self.clock_skew_s > 0, f"security.clock_skew_s={self.clock_skew_s}: use a positive value")
        require(
            self.max_throughput_tokens_per_s > 0,
            f"security.max_throughput_tokens_per_s={self.max_throughput_tokens_per_s}: use a positive value",
        )
        require(self.donor_tolerance >= 0, f"security.donor_tolerance={self.donor_tolerance}: use >= 0")
        require(self.donor_loss_margin >= 0, f"security.donor_loss_margin={self.donor_loss_margin}: use >= 0")
        require(self.update_ratio_max >= 1, f"security.update_ratio_max={self.update_ratio_max}: use >= 1")
        require(-1 <= self.cosine_min < 1, f"security.cosine_min={self.cosine_min}: use a value in [-1, 1)")
        require(
            -1 <= self.result_cosine_min < 1,
            f"security.result_cosine_min={self.result_cosine_min}: use a value in [-1, 1)",
        )
        require(self.result_ratio_max >= 1, f"security.result_ratio_max={self.result_ratio_max}: use >= 1")
        require(self.weight_ratio_max >= 1, f"security.weight_ratio_max={self.weight_ratio_max}: use >= 1")
        require(
            self.penalty_half_life > 0,
            f"security.penalty_half_life={self.penalty_half_life}: use a positive value",
        )
        require(
            self.sender_mailbox_payloads >= 1,
            f"security.sender_mailbox_payloads={self.sender_mailbox_payloads}: use >= 1",
        )
        require(
            self.sender_mailbox_messages >= 4,
            f"security.sender_mailbox_messages={self.sender_mailbox_messages}: use >= 4",
        )
        require(
            self.sender_open_streams >= 1,
            f"security.sender_open_streams={self.sender_open_streams}: use >= 1",
        )
        require(
            self.state_serves_per_minute > 0,
            f"security.state_serves_per_minute={self.state_serves_per_minute}: use a positive rate (4 is a joiner's need)",
        )
        require(
            self.state_serves_concurrent >= 1,
            f"security.state_serves_concurrent={self.state_serves_concurrent}: use >= 1",
        )
        require(
            self.stream_read_timeout_s > 0,
            f"security.stream_read_timeout_s={self.stream_read_timeout_s}: use a positive value",
        )
        _peer_ids("security.allow", self.allow)
        _peer_ids("security.owners", self.owners)
        require(
            len(self.revoked) <= MAX_REVOKED,
            f"security.revoked lists {len(self.revoked)} revocations: at most {MAX_REVOKED}",
        )
        for i, text in enumerate(self.revoked):
            require(
                isinstance(text, str) and 0 < len(text.strip()) <= 400,
                f"security.revoked[{i}]: expected the text `p2p-trainer revoke` prints (at most 400 characters)",
            )
        require(
            self.admission != "allow-list" or bool(self.allow),
            'security.admission="allow-list" admits nobody: list the peer ids in security.allow',
        )
        require(
            self.admission != "invitations" or bool(self.owners),
            'security.admission="invitations" needs security.owners: the peer ids of the owner keys',
        )
        require(
            self.admission == "open" or self.defences,
            "a closed swarm (security.admission) needs security.defences = true: they check signatures",
        )

    def admission_definition(self) -> dict[str, object] | None:
        """What every peer of a closed swarm must agree on (in the run definition); None if open."""
        if self.admission == "open":
            return None
        return {"mode": self.admission, "allow": sorted(self.allow), "owners": sorted(self.owners)}
