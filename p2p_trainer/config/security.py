"""The [security] section: what a peer checks before it trusts records, messages and contributions.

SECURITY.md states the threat model these checks answer. Every check is on by default; `defences
= false` turns them all off at once, which only the attack tests and benches should do (to show
that an attack is real).
"""

from __future__ import annotations

from dataclasses import dataclass

from p2p_trainer.config.checks import check_fields, require


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

    def __post_init__(self) -> None:
        check_fields(self, "security")
        require(self.round_window >= 1, f"security.round_window={self.round_window}: use >= 1")
        require(self.clock_skew_s > 0, f"security.clock_skew_s={self.clock_skew_s}: use a positive value")
        require(
            self.max_throughput_tokens_per_s > 0,
            f"security.max_throughput_tokens_per_s={self.max_throughput_tokens_per_s}: use a positive value",
        )
        require(self.donor_tolerance >= 0, f"security.donor_tolerance={self.donor_tolerance}: use >= 0")
