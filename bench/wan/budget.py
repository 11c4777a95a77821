"""The head-to-head's pure pieces: the shared clock, budget-exact snapshots, rates, seeds, spreads.

Every peer of a run is judged on one clock: `t0` is the moment the whole swarm was training (the
latest first-round start of its peers) and the budget ends at `t0 + budget_s` for all of them. A
peer's snapshots and round records carry its own monotonic time; `clock_offset` turns them into
Unix time. A method's φ changes only at the end of a round and every round end is snapshotted,
so the last snapshot at or before a time *is* the peer's model at that time.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from p2p_trainer.round_log import RoundRecord


class Timed(Protocol):
    @property
    def time_s(self) -> float: ...


T = TypeVar("T", bound=Timed)


def clock_offset(rounds: Sequence[RoundRecord]) -> float | None:
    """Unix time minus the peer's own `time_s` (median over its round records); None without any."""
    if not rounds:
        return None
    return statistics.median(r.unix_time - r.time_s for r in rounds)


def training_start_unix(rounds: Sequence[RoundRecord]) -> float | None:
    """When the peer started its first round (its end less its wall time)."""
    return rounds[0].unix_time - rounds[0].wall_s if rounds else None


def swarm_t0(starts: Sequence[float | None]) -> float | None:
    """The moment every peer was training: the latest of their first-round starts (None if one has none)."""
    if not starts or any(s is None for s in starts):
        return None
    return max(s for s in starts if s is not None)


def snapshot_at(snaps: Sequence[T], offset: float, t_unix: float) -> T | None:
    """The last of a peer's snapshots (sorted by time) taken at or before `t_unix`."""
    best = None
    for s in snaps:
        if offset + s.time_s <= t_unix:
            best = s
    return best


def eval_times(budget_s: float, points: int) -> list[float]:
    """Seconds after t0 at which every arm is evaluated: evenly spaced, the last one the budget."""
    n = max(1, points)
    return [budget_s * (k + 1) / n for k in range(n)]


def rate(rounds: Sequence[RoundRecord], offset: float, t_lo: float, t_hi: float, key: str) -> float | None:
    """`key` ("tokens" or "step") per second over the whole rounds that ended in [t_lo, t_hi] (Unix):
    from the end of the first to the end of the last, so start-up and a cut round stay out."""
    inside = [r for r in rounds if t_lo <= offset + r.time_s <= t_hi]
    if len(inside) < 2:
        return None
    a, b = inside[0], inside[-1]
    dt = b.time_s - a.time_s
    return (getattr(b, key) - getattr(a, key)) / dt if dt > 0 else None


def fraction_of_ideal(
    l_independent: float | None, l_swarm: float | None, l_ideal: float | None
) -> float | None:
    """(L_independent − L_swarm) / (L_independent − L_ideal): 0 = no better than training alone,
    1 = as good as exact data-parallel training for the same steps. None when undefined (no gap)."""
    if l_independent is None or l_swarm is None or l_ideal is None:
        return None
    gap = l_independent - l_ideal
    if not gap > 1e-9:
        return None
    return (l_independent - l_swarm) / gap


@dataclass(frozen=True)
class Spread:
    median: float
    lo: float
    hi: float
    n: int

    def fmt(self, spec: str = ".3f") -> str:
        if self.n == 1:
            return format(self.median, spec)
        return f"{self.median:{spec}} ({self.lo:{spec}}–{self.hi:{spec}})"


def spread(values: Sequence[float | None]) -> Spread | None:
    """Median with min and max over the known values (None and NaN left out)."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return None
    return Spread(statistics.median(vals), min(vals), max(vals), len(vals))


def fmt_spread(values: Sequence[float | None], spec: str = ".3f") -> str:
    s = spread(values)
    return "-" if s is None else s.fmt(spec)


def split_seeds(
    tuning: Sequence[int], report: Sequence[int], min_report: int = 3
) -> tuple[list[int], list[int]]:
    """Tuning and report seeds, checked: disjoint, and at least `min_report` report seeds."""
    overlap = sorted(set(tuning) & set(report))
    if overlap:
        raise ValueError(f"seeds {overlap} are both tuning and report seeds: configs would be picked on them")
    if len(set(report)) < min_report:
        raise ValueError(f"{len(set(report))} report seed(s): at least {min_report} are needed")
    return list(dict.fromkeys(tuning)), list(dict.fromkeys(report))


def pick_best(losses: Mapping[str, Sequence[float | None]]) -> str | None:
    """The candidate with the lowest median loss (on the tuning seeds); ties go to the first listed."""
    best, best_loss = None, math.inf
    for name, vals in losses.items():
        s = spread(vals)
        if s is not None and s.median < best_loss:
            best, best_loss = name, s.median
    return best


def interleaved(arms: Sequence[str], seed_index: int) -> list[str]:
    """The arms in run order for the n-th seed: reversed every other seed, so machine drift hits all alike."""
    return list(arms) if seed_index % 2 == 0 else list(arms)[::-1]
