"""Decoupled-DiLoCo-style learners: independent timelines plus a syncer with quorum and grace window.

Learners never wait for each other. After each round of H inner steps a learner sends its update to
the syncer and keeps stepping; it only stalls if the round trip to the syncer takes longer than its
overlap budget `grace_overlap_steps` steps. The syncer (docs/algorithms.md §4) merges once `quorum` learners
have a pending contribution, then waits a grace window

    grace = clamp(gamma * (tau * t_step - t_quorum - t_sync), 0, grace_max_s)

where t_quorum is an EMA of the time from a merge's first pending contribution to its quorum and
t_sync an EMA of the learner-syncer exchange time (our reading: the fast learners' overlap budget
left after waiting for the quorum). Learners arriving after the window are merged next time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from p2p_trainer.lab.sim import latency
from p2p_trainer.lab.sim.events import FloatArray
from p2p_trainer.lab.sim.sampled import SampledSwarm
from p2p_trainer.lab.sim.timing import MethodResult, RoundState, method_result, quorum_size

EMA_DECAY = 0.9
"""Weight of the past in the syncer's moving averages."""


@dataclass(frozen=True)
class GraceWindow:
    """The adaptive grace window's parameters (docs/algorithms.md §4)."""

    gamma: float
    overlap_s: float
    """tau * t_step: how long learners can keep stepping while a merge completes."""
    max_s: float

    def seconds(self, t_quorum_s: float, t_sync_s: float) -> float:
        return float(np.clip(self.gamma * (self.overlap_s - t_quorum_s - t_sync_s), 0.0, self.max_s))


@dataclass(frozen=True)
class SyncerTrace:
    """One entry per merge."""

    close_s: FloatArray
    """When the merge stopped accepting contributions (quorum time + grace)."""
    contributors: FloatArray
    """Learners whose update was in the merge."""
    grace_s: FloatArray


NextArrivals = Callable[[float], FloatArray]
"""Given the last close time, each learner's first arrival strictly after it (inf if none)."""


def arrivals_from_matrix(arrivals_s: FloatArray) -> NextArrivals:
    """A `NextArrivals` over known arrivals (shape rounds x learners, each column increasing)."""
    num_rounds, num_learners = arrivals_s.shape
    ptr = np.zeros(num_learners, dtype=np.int64)
    cols = np.arange(num_learners)

    def next_after(close_s: float) -> FloatArray:
        while True:
            nxt = arrivals_s[np.minimum(ptr, num_rounds - 1), cols]
            nxt[ptr >= num_rounds] = np.inf
            behind = nxt <= close_s
            if not behind.any():
                return nxt
            ptr[behind] += 1

    return next_after


@dataclass
class _LearnerClocks:
    """Learner timelines simulated on demand: a learner's next round is computed only when the
    syncer needs its next arrival, so memory stays O(learners) whatever the number of rounds."""

    rounds: RoundState
    sync_s: FloatArray
    stall_s: FloatArray
    start_s: FloatArray
    arrival_s: FloatArray

    def next_after(self, close_s: float) -> FloatArray:
        h = self.rounds.sw.scenario.horizon_s
        while True:
            idx = np.flatnonzero((self.arrival_s <= close_s) & (self.start_s < h))
            if len(idx) == 0:
                break
            finish = self.rounds.compute(self.start_s[idx], idx)
            self.arrival_s[idx] = finish + self.sync_s[idx]
            self.start_s[idx] = finish + self.stall_s[idx]
        return np.where(self.arrival_s > close_s, self.arrival_s, np.inf)

    def run_out(self) -> None:
        """Compute the learners' remaining rounds up to the horizon (their work counts, merged or not)."""
        h = self.rounds.sw.scenario.horizon_s
        while (idx := np.flatnonzero(self.start_s < h)).size:
            finish = self.rounds.compute(self.start_s[idx], idx)
            self.start_s[idx] = finish + self.stall_s[idx]


def run_syncer(
    next_after: NextArrivals, quorum: int, grace: GraceWindow, sync_s: float, horizon_s: float
) -> SyncerTrace:
    """Run the syncer's merges until the quorum is not reached within the horizon."""
    close, ema_q, ema_sync = 0.0, None, sync_s
    closes: list[float] = []
    counts: list[float] = []
    graces: list[float] = []
    while True:
        nxt = next_after(close)
        t_q = float(np.partition(nxt, quorum - 1)[quorum - 1])
        if not t_q <= horizon_s:
            break
        dq = t_q - float(nxt.min())
        ema_q = dq if ema_q is None else EMA_DECAY * ema_q + (1 - EMA_DECAY) * dq
        g = grace.seconds(ema_q, ema_sync)
        close = t_q + g
        closes.append(close)
        counts.append(float(np.sum(nxt <= close)))
        graces.append(g)
    return SyncerTrace(np.array(closes), np.array(counts), np.array(graces))


def decoupled(sw: SampledSwarm) -> MethodResult:
    s = sw.scenario
    r = RoundState.start(sw)
    sync_s = s.exchange_overhead_s + latency.group_average_s(
        2, s.exchange_bytes, sw.bandwidth_Bps, sw.alpha_s
    )
    stall_s = np.maximum(0.0, sync_s - s.grace_overlap_steps * s.step_s * sw.speed)
    clocks = _LearnerClocks(r, sync_s, stall_s, np.zeros(s.num_peers), np.full(s.num_peers, -1.0))
    grace = GraceWindow(s.grace_gamma, s.grace_overlap_steps * s.step_s, s.grace_max_s)
    trace = run_syncer(clocks.next_after, quorum_size(s), grace, float(sync_s.mean()), s.horizon_s)
    clocks.run_out()
    opened = np.concatenate(([0.0], trace.close_s[:-1]))
    for start, took in zip(opened.tolist(), (trace.close_s - opened).tolist(), strict=True):
        r.ledger.add_round(start, np.array([took]))
    extra = {
        "quorum": float(quorum_size(s)),
        "mean_contributors": float(trace.contributors.mean()) if len(trace.contributors) else 0.0,
        "mean_grace_s": float(trace.grace_s.mean()) if len(trace.grace_s) else 0.0,
        "stall_s_per_round": float(stall_s.mean()),
    }
    nbytes = latency.group_bytes_per_peer(2, s.exchange_bytes)
    return method_result("decoupled", r.ledger, r.uptime(), nbytes, **extra)
