"""The state server's rate limit: per sender, and over all senders at once."""

from __future__ import annotations

import pytest

from p2p_trainer.config import ConfigError
from p2p_trainer.config.security import SecurityConfig
from p2p_trainer.net.serve_limits import MAX_SENDERS, ServeLimits
from tests.conftest import ManualClock


def test_a_sender_gets_a_burst_then_the_refill_rate() -> None:
    clock = ManualClock(1000.0)
    limits = ServeLimits(per_minute=2, concurrent=10, clock=clock)
    for _ in range(2):
        assert limits.refusal("a", header_only=False) is None
        limits.done()
    why = limits.refusal("a", header_only=False)
    assert why is not None and "2 states per minute" in why and "retry in 30 s" in why
    assert limits.refusal("b", header_only=False) is None  # another sender has its own bucket
    clock.now += 30.0  # half a minute refills one state
    assert limits.refusal("a", header_only=False) is None
    assert limits.refusal("a", header_only=False) is not None


def test_header_only_requests_cost_a_tenth() -> None:
    limits = ServeLimits(per_minute=1, concurrent=1, clock=ManualClock(1000.0))
    for _ in range(10):
        assert limits.refusal("a", header_only=True) is None
    assert limits.refusal("a", header_only=True) is not None


def test_concurrent_full_transfers_are_capped_over_all_senders() -> None:
    limits = ServeLimits(per_minute=10, concurrent=2, clock=ManualClock(1000.0))
    assert limits.refusal("a", header_only=False) is None
    assert limits.refusal("b", header_only=False) is None
    why = limits.refusal("c", header_only=False)
    assert why is not None and why.startswith("busy: 2 state transfers")
    assert limits.refusal("c", header_only=True) is None  # a hash check needs no transfer slot
    limits.done()
    assert limits.refusal("c", header_only=False) is None


def test_the_senders_remembered_are_bounded() -> None:
    limits = ServeLimits(per_minute=1, concurrent=10**6, clock=ManualClock(1000.0))
    for i in range(MAX_SENDERS + 50):
        assert limits.refusal(f"p{i}", header_only=False) is None
    assert len(limits._buckets) == MAX_SENDERS
    assert limits.refusal("p0", header_only=False) is None  # forgotten: starts with a full bucket
    assert limits.refusal(f"p{MAX_SENDERS + 49}", header_only=False) is not None


def test_the_config_refuses_a_limit_that_serves_nobody() -> None:
    with pytest.raises(ConfigError, match=r"security\.state_serves_per_minute=0\.0: use a positive rate"):
        SecurityConfig(state_serves_per_minute=0)
    with pytest.raises(ConfigError, match=r"security\.state_serves_concurrent=0: use >= 1"):
        SecurityConfig(state_serves_concurrent=0)
