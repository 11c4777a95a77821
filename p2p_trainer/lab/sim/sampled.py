"""The sampled swarm shared by every method, and the ledger that turns compute into metrics.

Goodput (docs/algorithms.md §8) = useful work / work the hardware could have done, both in nominal
chip-seconds: a peer with step-time factor f does 1/f of nominal work per second, so its capacity
over the horizon is chips * horizon_s / f. Useful work is work that reaches the model, on chips
not in repair. Hence goodput <= 1 whatever the speeds, and a fast peer waiting for a slow one
lowers it. Compute utilisation = chip-seconds spent in steps / (num_chips * horizon_s). Work after
`horizon_s` is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from p2p_trainer.lab.sim.events import (
    FailureEvents,
    FloatArray,
    IntArray,
    Pauses,
    Repairs,
    derived_rng,
    sample_failures,
)
from p2p_trainer.lab.sim.scenario import Scenario

NUM_BINS = 96
"""Time bins for the over-time series (15 minutes each over a day)."""


@dataclass(frozen=True)
class SampledSwarm:
    """Failures, per-peer speeds and links, sampled once from the scenario's seed."""

    scenario: Scenario
    failures: FailureEvents
    speed: FloatArray
    """Per-peer step-time factor (1 = nominal, 1.2 = 20% slower)."""
    bandwidth_Bps: FloatArray
    alpha_s: FloatArray

    @classmethod
    def sample(cls, s: Scenario) -> SampledSwarm:
        failures = sample_failures(
            s.num_chips, s.mtbi_chip_s, s.horizon_s, s.chips_per_slice, s.repair_s, s.seed
        )
        n = s.num_peers
        speed = np.exp(derived_rng(s.seed, 1).normal(0.0, s.straggler_sigma, n))
        bandwidth = (
            s.link_efficiency
            * s.bandwidth_gbps
            * 1e9
            / 8.0
            * np.exp(derived_rng(s.seed, 2).normal(0.0, s.bandwidth_sigma, n))
        )
        alpha = s.latency_ms * 1e-3 * np.exp(derived_rng(s.seed, 3).normal(0.0, s.latency_sigma, n))
        return cls(s, failures, speed, bandwidth, alpha)

    @property
    def capacity_chip_s(self) -> float:
        """Nominal work the hardware could do over the horizon at its own speeds."""
        s = self.scenario
        return float(s.chips_per_peer * s.horizon_s * np.sum(1.0 / self.speed))

    def peer_of_failure(self) -> IntArray:
        return self.failures.chip // self.scenario.chips_per_peer

    def lost_work_s(self, upto_s: float) -> FloatArray:
        """Work lost per failure: uniform in [0, upto_s) (time since the last step or checkpoint)."""
        return derived_rng(self.scenario.seed, 4).uniform(0.0, upto_s, len(self.failures))

    def peer_pauses(self) -> Pauses:
        """Each peer stops for `reconfig_s` (plus its in-flight step) when one of its slices fails."""
        s = self.scenario
        return Pauses.from_failures(
            self.peer_of_failure(),
            self.failures.time_s,
            self.lost_work_s(s.step_s),
            s.reconfig_s,
            s.num_peers,
        )

    def peer_repairs(self) -> Repairs:
        s = self.scenario
        chips = min(s.chips_per_slice, s.chips_per_peer)
        return Repairs(self.peer_of_failure(), self.failures.time_s, s.repair_s, chips, s.num_peers)


@dataclass
class Ledger:
    """Accumulates per-peer compute of one method into goodput, utilisation and a time series."""

    swarm: SampledSwarm
    pauses: Pauses
    repairs: Repairs
    useful_chip_s: float = 0.0
    compute_chip_s: float = 0.0
    series_chip_s: FloatArray | None = None
    """Useful chip-seconds per time bin, if set directly; else derived from the spread accumulators."""
    _spread: FloatArray = field(default_factory=lambda: np.zeros((4, NUM_BINS + 1)))
    round_sum_s: float = 0.0
    round_count: int = 0
    outer_rounds: int = 0
    round_trace: list[tuple[float, float]] = field(default_factory=list)
    """(start time, mean duration) of each outer round, for the over-time plot."""

    def add_round(self, start_s: float, durations_s: FloatArray) -> None:
        """One outer round; `durations_s` per peer (or one value for a global round)."""
        if len(durations_s) == 0:
            return
        self.round_sum_s += float(durations_s.sum())
        self.round_count += len(durations_s)
        self.outer_rounds += 1
        self.round_trace.append((start_s, float(durations_s.mean())))

    def add_compute(
        self,
        peers: IntArray,
        start_s: FloatArray,
        finish_s: FloatArray,
        work_s: FloatArray,
        useful_share: float = 1.0,
    ) -> None:
        """Peers ran `work_s` of steps from `start_s`, finishing at `finish_s` (pauses included);
        `useful_share` of it was training (the rest: a background exchange's CPU slowing the steps)."""
        s = self.swarm.scenario
        h = s.horizon_s
        cut = np.minimum(finish_s, h)
        done = np.minimum(
            work_s,
            self.pauses.running_until(peers, cut) - self.pauses.running_until(peers, np.minimum(start_s, h)),
        )
        done = np.maximum(done, 0.0)
        live = self.repairs.live_fraction(peers, start_s, np.maximum(cut, start_s + 1e-9), s.chips_per_peer)
        useful = useful_share * done / self.swarm.speed[peers] * live * s.chips_per_peer
        self.useful_chip_s += float(useful.sum())
        self.compute_chip_s += float(done.sum()) * s.chips_per_peer
        self._spread_over_time(start_s, np.maximum(cut, start_s + 1e-9), useful)

    def _spread_over_time(self, a_s: FloatArray, b_s: FloatArray, amount: FloatArray) -> None:
        """Spread each amount uniformly over [a, b]: W(x) = Σ r (min(x, b) - a)+ with r = amount/(b - a),
        kept as per-edge sums of r and r*a (starts) and r and r*b (ends), so the cost is O(peers)."""
        width = self.swarm.scenario.horizon_s / NUM_BINS
        rate = amount / (b_s - a_s)
        # index of the first bin edge >= x (edges are k * width)
        ia = np.clip(np.ceil(a_s / width), 0, NUM_BINS + 1).astype(np.int64)
        ib = np.clip(np.ceil(b_s / width), 0, NUM_BINS + 1).astype(np.int64)
        for row, (idx, w) in enumerate(((ia, rate), (ia, rate * a_s), (ib, rate), (ib, rate * b_s))):
            self._spread[row] += np.bincount(idx, weights=w, minlength=NUM_BINS + 2)[: NUM_BINS + 1]

    def totals(self) -> dict[str, float]:
        s = self.swarm.scenario
        return {
            "goodput": self.useful_chip_s / self.swarm.capacity_chip_s,
            "utilisation": self.compute_chip_s / (s.num_chips * s.horizon_s),
            "mean_round_s": self.round_sum_s / self.round_count if self.round_count else float("nan"),
            "rounds": float(self.outer_rounds),
        }

    def series_goodput(self) -> FloatArray:
        s = self.swarm.scenario
        per_bin = self.series_chip_s
        if per_bin is None:
            edges = np.linspace(0.0, s.horizon_s, NUM_BINS + 1)
            c = np.cumsum(self._spread, axis=1)  # sums over entries with a (or b) <= edge
            work = (c[0] * edges - c[1]) - (c[2] * edges - c[3])
            per_bin = np.diff(work)
        return per_bin / (self.swarm.capacity_chip_s / NUM_BINS)
