"""The [security] section: what a peer checks before it trusts records, messages and contributions.

SECURITY.md states the threat model these checks answer. Every check is on by default; `defences
= false` turns them all off at once, which only the attack tests and benches should do (to show
that an attack is real).
"""

from __future__ import annotations

from dataclasses import dataclass

from p2p_trainer.config.checks import check_fields


@dataclass(frozen=True)
class SecurityConfig:
    """Checks on what other peers send: DHT records, stream messages, contributions and state."""

    defences: bool = True
    """Master switch: false accepts whatever a well-formed record or message says (attack tests)."""

    def __post_init__(self) -> None:
        check_fields(self, "security")
