"""Vectorised failure/repair event model.

Chip interruptions are a Poisson process of rate `num_chips / mtbi_chip_s` over the horizon: the
count is drawn once, times are uniform, chips uniform (numpy, no per-chip loop, so 10^6 chips cost
as much as 10). An interruption takes its slice (`chips_per_slice` chips) out for `repair_s`; an
interruption of a slice already in repair is dropped (its chips are not running).

Two per-unit structures are built from the events; a *unit* is a set of chips that stops together
(the whole job for data-parallel, one peer for the DiLoCo family):

- `Pauses`: the union of the unit's stopped intervals, each `[t_fail - lost_s, t_fail + pause_s)`.
  The lost work before the failure (the in-flight step, or the work since the last checkpoint) is
  folded in as time rewound. A failure while its unit is already stopped is absorbed by the
  ongoing pause and does not extend it (the restart or re-formation health-checks and swaps every
  slice that failed before it completes); `absorbed_mask` applies this.
- `Repairs`: the chips of a unit that are in repair at each time (capacity removed for `repair_s`).

All queries take arrays of (unit, time) and are answered with `searchsorted` over flat,
unit-ordered arrays (CSR layout), never a loop over units.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


def derived_rng(seed: int, *stream: int) -> np.random.Generator:
    """An independent generator for (seed, stream...): failures, speeds, links, groups per round."""
    return np.random.default_rng(np.random.SeedSequence([seed, *stream]))


@dataclass(frozen=True)
class FailureEvents:
    """Chip interruptions sorted by time."""

    time_s: FloatArray
    chip: IntArray
    repair_s: float
    chips_per_slice: int

    @property
    def slice_id(self) -> IntArray:
        return self.chip // self.chips_per_slice

    def __len__(self) -> int:
        return len(self.time_s)


def sample_failures(
    num_chips: int, mtbi_chip_s: float, horizon_s: float, chips_per_slice: int, repair_s: float, seed: int
) -> FailureEvents:
    """Poisson chip interruptions over [0, horizon_s), minus those that hit a slice already in repair."""
    rng = derived_rng(seed, 0)
    count = rng.poisson(num_chips * horizon_s / mtbi_chip_s)
    time_s = rng.uniform(0.0, horizon_s, count)
    chip = rng.integers(0, num_chips, count, dtype=np.int64)
    # Drop an interruption of a slice that is still in repair from an earlier (kept) one.
    keep = np.flatnonzero(~absorbed_mask(chip // chips_per_slice, time_s, repair_s))
    keep = keep[np.argsort(time_s[keep], kind="stable")]
    return FailureEvents(time_s[keep], chip[keep], float(repair_s), chips_per_slice)


def absorbed_mask(unit: IntArray, fail_s: FloatArray, pause_s: float) -> NDArray[np.bool_]:
    """True for failures that hit their unit during a pause started by an earlier kept failure.

    Whether a failure is kept depends on the previous *kept* one, a sequential rule; only failures
    closer than `pause_s` to their predecessor are ambiguous, and only those are walked in Python
    (a few per thousand failures at realistic rates), so the cost stays O(failures) in numpy.
    """
    order = np.lexsort((fail_s, unit))
    u, t = unit[order], fail_s[order]
    close = np.zeros(len(t), dtype=bool)
    close[1:] = (u[1:] == u[:-1]) & (t[1:] - t[:-1] < pause_s)
    absorbed = np.zeros(len(t), dtype=bool)
    pause_end = -np.inf
    for i in np.flatnonzero(close | np.append(close[1:], False)).tolist():
        if i > 0 and u[i] == u[i - 1] and t[i] < pause_end:
            absorbed[i] = True
        else:
            pause_end = t[i] + pause_s
    out = np.zeros(len(t), dtype=bool)
    out[order] = absorbed
    return out


def _unit_keys(unit: IntArray, t: FloatArray, stride: float) -> FloatArray:
    """Flatten (unit, time) into one sortable key. Times are clipped to [-0.5, stride/2): every
    stored time lies in [0, stride/2 - 1], so clipping never changes which stored keys are below."""
    return unit.astype(np.float64) * stride + np.clip(t, -0.5, 0.5 * stride)


class Pauses:
    """Per-unit union of stopped intervals, with running-time queries."""

    def __init__(self, unit: IntArray, start_s: FloatArray, end_s: FloatArray, num_units: int) -> None:
        self.num_units = num_units
        self.stride = 2.0 * float(max(np.max(end_s, initial=0.0), 1.0)) + 4.0
        start_s = np.clip(start_s, 0.0, None)
        order = np.lexsort((start_s, unit))
        u, s, e = unit[order], start_s[order], end_s[order]
        ks, ke = _unit_keys(u, s, self.stride), _unit_keys(u, e, self.stride)
        reach = np.maximum.accumulate(ke) if len(ke) else ke
        new = np.ones(len(ks), dtype=bool)
        new[1:] = ks[1:] > reach[:-1]
        first = np.flatnonzero(new)
        last = np.append(first[1:] - 1, len(ks) - 1) if len(first) else first
        self.unit = u[first]
        self.start_s = s[first]
        self.end_s = reach[last] - self.unit * self.stride if len(first) else s[first]
        length = self.end_s - self.start_s
        self.ptr = np.searchsorted(self.unit, np.arange(num_units + 1)).astype(np.int64)
        csum = np.concatenate(([0.0], np.cumsum(length)))
        self.down_before = csum[:-1] - csum[self.ptr[self.unit]]
        self.down_through = self.down_before + length
        self.affected = self.ptr[1:] > self.ptr[:-1]
        """Per unit: has at least one pause."""
        self._start_keys = _unit_keys(self.unit, self.start_s, self.stride)
        self._run_keys = _unit_keys(self.unit, self.start_s - self.down_before, self.stride)

    @classmethod
    def from_failures(
        cls, unit: IntArray, fail_s: FloatArray, lost_s: FloatArray, pause_s: float, num_units: int
    ) -> Pauses:
        """Pauses `[t - lost, t + pause_s)` for the failures not absorbed by an ongoing pause."""
        keep = ~absorbed_mask(unit, fail_s, pause_s)
        return cls(unit[keep], fail_s[keep] - lost_s[keep], fail_s[keep] + pause_s, num_units)

    def downtime_until(self, unit: IntArray, t: FloatArray) -> FloatArray:
        """Seconds in [0, t) during which `unit` was stopped."""
        out = np.zeros(len(t))
        sel = self.affected[unit]  # most units never fail: only search for those that did
        if sel.any():
            out[sel] = self._downtime(unit[sel], t[sel])
        return out

    def _downtime(self, unit: IntArray, t: FloatArray) -> FloatArray:
        idx = np.searchsorted(self._start_keys, _unit_keys(unit, t, self.stride), side="right") - 1
        has = idx >= self.ptr[unit]
        k = np.where(has, idx, 0)
        inside = np.minimum(t, self.end_s[k]) - self.start_s[k]
        return np.where(has, self.down_before[k] + inside, 0.0)

    def running_until(self, unit: IntArray, t: FloatArray) -> FloatArray:
        """Seconds in [0, t) during which `unit` was running."""
        return t - self.downtime_until(unit, t)

    def finish_time(self, unit: IntArray, start_s: FloatArray, work_s: FloatArray) -> FloatArray:
        """When `unit`, starting at `start_s`, has run `work_s` seconds (pauses stretch it)."""
        target = self.running_until(unit, start_s) + work_s
        sel = self.affected[unit]
        if not sel.any():
            return target
        u, tg = unit[sel], target[sel]
        idx = np.searchsorted(self._run_keys, _unit_keys(u, tg, self.stride), side="left") - 1
        has = idx >= self.ptr[u]
        out = target.copy()
        out[sel] = tg + np.where(has, self.down_through[np.where(has, idx, 0)], 0.0)
        return out

    def all_down_s(self, horizon_s: float) -> float:
        """Seconds of [0, horizon_s) during which every unit was stopped at once (a global outage)."""
        s = np.clip(self.start_s, 0.0, horizon_s)
        e = np.clip(self.end_s, 0.0, horizon_s)
        times = np.concatenate((s, e))
        delta = np.concatenate((np.ones(len(s)), -np.ones(len(e))))
        order = np.lexsort((delta, times))  # ends before starts at equal times
        times, count = times[order], np.cumsum(delta[order])
        if len(times) < 2:
            return 0.0
        spans = np.diff(times)
        return float(np.sum(spans[count[:-1] >= self.num_units]))


class Repairs:
    """Chips of each unit in repair: each failure removes `chips_per_slice` chips for `repair_s`."""

    def __init__(
        self, unit: IntArray, fail_s: FloatArray, repair_s: float, chips: int, num_units: int
    ) -> None:
        self.repair_s = repair_s
        self.chips = chips
        order = np.lexsort((fail_s, unit))
        self.unit, self.start_s = unit[order], fail_s[order]
        self.stride = 2.0 * float(max(np.max(fail_s, initial=0.0) + repair_s, 1.0)) + 4.0
        self.ptr = np.searchsorted(self.unit, np.arange(num_units + 1)).astype(np.int64)
        self.affected = self.ptr[1:] > self.ptr[:-1]
        self._keys = _unit_keys(self.unit, self.start_s, self.stride)
        self._csum = np.concatenate(([0.0], np.cumsum(self.start_s)))

    def _sum_since(self, unit: IntArray, t: FloatArray, shift_s: float) -> FloatArray:
        """Σ over the unit's failures with start + shift <= t of (t - start - shift)."""
        idx = np.searchsorted(self._keys, _unit_keys(unit, t - shift_s, self.stride), side="right")
        lo = self.ptr[unit]
        n = np.maximum(idx - lo, 0)
        return n * (t - shift_s) - (self._csum[np.maximum(idx, lo)] - self._csum[lo])

    def down_chip_s_until(self, unit: IntArray, t: FloatArray) -> FloatArray:
        """Chip-seconds of capacity in repair within [0, t) for `unit`."""
        out = np.zeros(len(t))
        sel = self.affected[unit]
        if sel.any():
            u, ts = unit[sel], t[sel]
            out[sel] = self.chips * (self._sum_since(u, ts, 0.0) - self._sum_since(u, ts, self.repair_s))
        return out

    def live_fraction(self, unit: IntArray, a_s: FloatArray, b_s: FloatArray, unit_chips: int) -> FloatArray:
        """Mean fraction of the unit's chips not in repair over [a_s, b_s]."""
        span = np.maximum(b_s - a_s, 1e-12)
        down = self.down_chip_s_until(unit, b_s) - self.down_chip_s_until(unit, a_s)
        return np.clip(1.0 - down / (unit_chips * span), 0.0, 1.0)
