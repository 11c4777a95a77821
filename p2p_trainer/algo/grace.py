"""Quorum and adaptive grace window (docs/algorithms.md §4), as pure functions and a small EMA tracker.

A blocking exchange proceeds once `quorum_size` members of its group (itself included) have
contributed, then waits at most `grace_window_s` for the rest:

    grace = clamp(γ · (τ · t_step − t_quorum − t_sync), min, max)

`t_step`, `t_quorum` and `t_sync` are exponential moving averages of the inner step time, the time
an exchange took to reach its quorum and the time it took from there to its result; τ is how many
inner steps of waiting one accepts. The floor `min` is ours (not in the paper): a window of 0 s
would leave out a peer that is merely a network round-trip behind.

That formula bounds how long one waits for a straggler, but on a slow link even a punctual member
needs its start skew plus a part's transfer time to arrive, which can exceed it. So the window is
also at least what was observed: `margin · t_arrive − t_quorum`, where `t_arrive` is the median,
over recent exchanges, of the time from an exchange's start to the last contribution that
arrived, late ones included.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field


def quorum_size(group_size: int, quorum_fraction: float) -> int:
    """K: members (self included) that must contribute before the grace window starts; 1 ≤ K ≤ n."""
    return min(group_size, max(1, math.ceil(quorum_fraction * group_size - 1e-9)))


def grace_window_s(
    t_step_s: float,
    t_quorum_s: float,
    t_sync_s: float,
    overlap_steps: float,
    gamma: float,
    min_s: float,
    max_s: float,
) -> float:
    """`clamp(γ · (τ · t_step − t_quorum − t_sync), min_s, max_s)`; non-finite inputs give `max_s`."""
    raw = gamma * (overlap_steps * t_step_s - t_quorum_s - t_sync_s)
    if not math.isfinite(raw):
        return max_s
    return min(max_s, max(min_s, raw))


ARRIVAL_SAMPLES = 9
"""Recent exchanges whose arrival times set `t_arrive` (their median)."""


def ema(previous: float | None, sample: float, decay: float) -> float:
    """Exponential moving average; the first sample starts it."""
    return sample if previous is None else decay * previous + (1.0 - decay) * sample


@dataclass
class GraceTracker:
    """EMAs of step, quorum and sync times that set the next grace window.

    The trainer reports step times, the methods report each blocking exchange's quorum and sync
    times. Until a step and an exchange have been timed, the window is `max_s`: nothing is known
    yet, and the first round also absorbs the peers' start-up skew.
    """

    overlap_steps: float
    gamma: float
    min_s: float
    max_s: float
    margin: float = 1.25
    decay: float = 0.9
    t_step_s: float | None = None
    t_quorum_s: float = 0.0
    t_sync_s: float = 0.0
    t_arrive_s: float = 0.0
    _arrivals: list[float] = field(default_factory=list)
    _seen_exchange: bool = False

    def observe_step(self, seconds: float) -> None:
        if math.isfinite(seconds) and seconds >= 0:
            self.t_step_s = ema(self.t_step_s, seconds, self.decay)

    def observe_exchange(self, quorum_s: float, sync_s: float) -> None:
        if not (math.isfinite(quorum_s) and math.isfinite(sync_s)):
            return
        first = not self._seen_exchange
        self.t_quorum_s = ema(None if first else self.t_quorum_s, max(0.0, quorum_s), self.decay)
        self.t_sync_s = ema(None if first else self.t_sync_s, max(0.0, sync_s), self.decay)
        self._seen_exchange = True

    def observe_arrivals(self, arrival_s: float) -> None:
        """When the last contribution of an exchange arrived, counted from its start (0: unknown).

        Only real arrivals count (the network backend times late ones after the window): a
        member that never comes, e.g. one with another view of the group, says nothing about how
        long to wait. `t_arrive` is the median of the last `ARRIVAL_SAMPLES`: a member that was
        late because its own previous exchange waited (stragglers propagate through gossip
        groups) moves it only if that becomes the rule, not once.
        """
        if not math.isfinite(arrival_s) or arrival_s <= 0:
            return
        self._arrivals = [*self._arrivals[-(ARRIVAL_SAMPLES - 1) :], arrival_s]
        self.t_arrive_s = statistics.median(self._arrivals)

    def observe_failure(self) -> None:
        """An exchange failed with nothing timed: the start-up window (`max_s`) has been spent.

        Without this a peer whose first exchanges all fail (its partners do not see it yet, e.g.
        right after a restart) would wait `max_s` in every one of them.
        """
        self._seen_exchange = True

    def window_s(self) -> float:
        if self.t_step_s is None or not self._seen_exchange:
            return self.max_s
        budget = grace_window_s(
            self.t_step_s,
            self.t_quorum_s,
            self.t_sync_s,
            self.overlap_steps,
            self.gamma,
            self.min_s,
            self.max_s,
        )
        observed = self.margin * self.t_arrive_s - self.t_quorum_s
        return min(self.max_s, max(budget, observed))

    def result_wait_s(self) -> float:
        """How long, after its own part is averaged, a member waits for the other parts' results.

        The owners finish their own grace windows at about the same time; the results then need
        one transfer, which takes about `t_sync`. Three times that, at least 1 s, at most `max_s`.
        """
        return min(self.max_s, max(1.0, 3.0 * self.t_sync_s))
