"""Round alignment for non-blocking methods (`outer.align_rounds`).

Factored gossip has no barrier: Mix1 groups are keyed on the round, so two peers meet only if they
start the same round within Mix1's grace window. Without a barrier, round starts drift apart (a
slower step here, a longer Mix2 there) until pairs stop meeting and most Mix1 exchanges fail
(bench/RESULTS.md, "round alignment and Mix1's wait", has the WAN bench's counts). Overlapped
DiLoCo (the default run) has no barrier either: its group's background all-reduce finishes only
after its last member has started it, so it is aligned too (docs/algorithms.md §1).

At the start of each round a peer looks up when the other peers started the same round, from the
heartbeats' (round, round_started), and if the earliest of them started before it by more than an
inner step, it leaves out that many inner steps (at most H − 1) so its next round
starts with theirs. Nobody waits, so compute stays busy; the late peer's contribution is worth
fewer tokens and token weighting (§5) counts it so.

A round start is a claim in another peer's heartbeat. With the security defences on (`robust`):

- a start more than `WINDOW_ROUNDS` of this peer's round times from its own start is ignored: an
  honest peer that began the same round that much earlier is stalled in it (or its next round's
  heartbeat says so), and one that began that much later is a round behind;
- the peer aligns on the lower median of the starts it kept and its own, so with three or more
  peers one liar moves the target at most to the next honest start;
- with one other start only (the median is then that peer's claim alone), the steps left out are
  capped at `UNCONFIRMED_FRACTION` of H: an honest pair still closes a drift within a few rounds,
  a liar costs at most that share of each round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from p2p_trainer.net.records import Heartbeat

WINDOW_ROUNDS = 2.0
"""How many of this peer's round times another peer's start may lie from its own and still count."""
UNCONFIRMED_FRACTION = 0.25
"""Share of H one other peer's start may make this peer leave out when no third start backs it."""


def steps_late(
    my_round: int,
    my_start: float,
    beats: Sequence[Heartbeat],
    self_id: str,
    round_s: float,
    step_s: float,
    num_inner_steps: int,
    robust: bool = False,
) -> int:
    """Inner steps this peer is late by, against the earliest start of `my_round` among the others
    (with `robust`, the lower median of the starts in the window and its own; see the module).

    Peers in the same round say exactly when they started it. A peer already a round ahead started
    this one about `round_s` (this peer's round time) before its current one. A peer that shows the
    previous round is behind, or its heartbeat is older than its start of this round: it is left
    out rather than extrapolated, since a long blocking round (Mix2) would make a forward estimate
    too early and have this peer skip steps for nothing. Peers further away are rejoin's business.
    Never more than H − 1.
    """
    if step_s <= 0 or round_s <= 0 or num_inner_steps <= 1:
        return 0
    starts = [
        b.round_started - (b.round - my_round) * round_s
        for b in beats
        if b.peer_id != self_id
        and not b.leaving
        and b.round_started > 0
        and b.round in (my_round, my_round + 1)
    ]
    if not starts:
        return 0
    cap = num_inner_steps - 1
    if robust:
        window_s = WINDOW_ROUNDS * round_s
        starts = [s for s in starts if abs(my_start - s) <= window_s]
        if not starts:
            return 0
        if len(starts) == 1:
            cap = min(cap, max(1, int(UNCONFIRMED_FRACTION * num_inner_steps)))
        ordered = sorted([my_start, *starts])
        target = ordered[(len(ordered) - 1) // 2]
    else:
        target = min(starts)
    late_s = my_start - target
    if not math.isfinite(late_s) or late_s < step_s:
        return 0
    return min(cap, int(late_s / step_s))


class RoundAligner:
    """Keeps this peer's round-time estimate and applies `steps_late` before each round."""

    def __init__(self, self_id: str, num_inner_steps: int, decay: float = 0.8, robust: bool = False) -> None:
        self.self_id, self.h, self.decay, self.robust = self_id, num_inner_steps, decay, robust
        self.round_s: float | None = None

    def observe(self, wall_s: float) -> None:
        """A finished round's wall time."""
        self.round_s = (
            wall_s if self.round_s is None else self.decay * self.round_s + (1 - self.decay) * wall_s
        )

    def steps_to_skip(
        self, my_round: int, my_start: float, beats: Sequence[Heartbeat], step_s: float | None
    ) -> int:
        if self.round_s is None or not step_s:
            return 0
        return steps_late(my_round, my_start, beats, self.self_id, self.round_s, step_s, self.h, self.robust)
