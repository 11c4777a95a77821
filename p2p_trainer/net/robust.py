"""Robust merging (docs/algorithms.md §10): bounds on contributions and results, robust means, penalties.

An exchanged vector is compared with a *reference*: zero for an update (Δ, a gradient), the vector
this peer held before the round's training for a model (θ against φ, an anchor against the
previous one). A vector's *update* is vector − reference, and this peer's own update on a part is
the scale every other member's values are held to:

- at the part owner, a contribution whose update is more than R times the owner's own (norm), or
  points too far from it (cosine below a floor), is *rejected*: left out of the part like a late
  contribution, named in the result's `left_out` and `rejected`, and its sender penalised;
- at every member, a part owner's result further than R' times the member's own update from the
  member's own values, implying a mean of the others' contributions that the owner should have
  rejected, or (where the member did a full round) pointing away from its update, is discarded
  for the member's own values (`own_parts` > 0), and the owner is penalised.

Rejecting rather than clipping: a clipped liar still moves an honest vector a bounded step in the
direction of its choice every round, and nothing shows it; a rejected one moves nothing and is
reported, and an honest member that exceeds the bound for one round costs one part of one merge.
Clipping remains available as a robust mean (`centred-clip`) for groups of three or more, where
the owner merges several contributions that all passed the bounds.

A penalised peer is left out of this peer's groups (not waited for, not sent to, not merged) while
its penalty lasts; the penalty halves every `penalty_half_life` exchanges, so an honest peer with one bad
round comes back. The groups themselves are still formed from the whole live view: leaving the
peer out of the partition would give this peer member lists (and exchange keys) that its honest
partners, who may not have penalised the same peer, do not share, and nobody would meet.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from p2p_trainer.config.security import RobustMean, SecurityConfig

logger = logging.getLogger(__name__)

WIRE_TOLERANCE = {"f4": 1e-6, "f2": 2e-3, "bf": 8e-3, "i8": 1e-2, "i4": 0.2, "tk": 1e-2}
"""Relative error of values decoded from each codec (exchange/codecs.py): differences below it are
rounding."""


SHORT_ROUND_STRETCH = 2.0
"""A member whose weight is below 1 / this of the other members' mean weight did a short round (a
joiner's or rejoiner's first): a result's own direction says nothing there (`check_result`)."""


STRIKE_HALF_LIVES = 4.0
"""How many times slower than a penalty an offence's strike decays (`Penalties.strikes`)."""


class Penalties:
    """Local, decaying penalties by peer id; thread-safe (the transport's loop and the trainer).

    `clock` counts what the penalty decays with (the owner's exchanges; seconds by default)."""

    def __init__(self, half_life: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.half_life, self.clock = half_life, clock
        self._scores: dict[str, tuple[float, float]] = {}
        self._offences: dict[str, int] = {}
        """Offences by peer over this ledger's life (they do not decay; `forgive` clears them)."""
        self._strikes: dict[str, tuple[float, float]] = {}
        """Offences by peer decaying `STRIKE_HALF_LIVES` times slower than the penalty (`strikes`)."""
        self._peak_strikes: dict[str, float] = {}
        """The most strikes each peer has had at once (they do not decay; `forgive` clears them)."""
        self._listeners: list[Callable[[str, float], None]] = []
        self._lock = threading.Lock()

    def listen(self, listener: Callable[[str, float], None]) -> None:
        """Call `listener(peer, strikes)` after every offence (outside the ledger's lock)."""
        self._listeners.append(listener)

    def strikes(self, peer: str) -> float:
        """The peer's offences, each decaying with a half-life `STRIKE_HALF_LIVES` times the
        penalty's: a repeat offender stands out from an honest peer that crossed a bound once."""
        with self._lock:
            return self._decayed(self._strikes, peer, self.clock(), STRIKE_HALF_LIVES)

    def _decayed(self, scores: dict[str, tuple[float, float]], peer: str, now: float, lives: float) -> float:
        score, since = scores.get(peer, (0.0, now))
        return score * 0.5 ** ((now - since) / (lives * self.half_life))

    def _score(self, peer: str, now: float) -> float:
        return self._decayed(self._scores, peer, now, 1.0)

    def offend(self, peer: str, why: str) -> None:
        now = self.clock()
        with self._lock:
            score = self._score(peer, now) + 1.0
            self._scores[peer] = (score, now)
            self._offences[peer] = self._offences.get(peer, 0) + 1
            strikes = self._decayed(self._strikes, peer, now, STRIKE_HALF_LIVES) + 1.0
            self._strikes[peer] = (strikes, now)
            self._peak_strikes[peer] = max(strikes, self._peak_strikes.get(peer, 0.0))
        logger.warning("peer %s penalised (score %.1f): %s", peer[-8:], score, why)
        for listener in self._listeners:
            listener(peer, strikes)

    def forgive(self, peers: Sequence[str]) -> None:
        """Clear the penalties of `peers` (this peer adopted their state: it was the one that differed)."""
        with self._lock:
            for peer in peers:
                self._scores.pop(peer, None)
                self._offences.pop(peer, None)
                self._strikes.pop(peer, None)
                self._peak_strikes.pop(peer, None)

    def carried(self, min_offences: int, min_strikes: float = math.inf) -> Penalties:
        """A new ledger (same half-life and clock) in which the peers penalised here at least
        `min_offences` times, or that once had `min_strikes` strikes, start with a fresh penalty.
        (A penalised peer is left out, so not checked, until its penalty decays: a liar offends
        again each time it is let back in, but its decaying score never shows more than about one
        offence; and a peer voted out of the groups, `exclusion.py`, is met too rarely to offend
        often.)"""
        now = self.clock()
        out = Penalties(self.half_life, self.clock)
        with self._lock:
            for peer, offences in self._offences.items():
                if offences >= min_offences or self._peak_strikes.get(peer, 0.0) >= min_strikes:
                    out._scores[peer] = (1.0, now)
                    out._offences[peer] = offences
        return out

    def excluded(self, peer: str) -> bool:
        now = self.clock()
        with self._lock:
            if peer not in self._scores:
                return False
            score = self._score(peer, now)
            if score < 0.5:
                del self._scores[peer]
            return score >= 0.5


@dataclass(frozen=True)
class Defence:
    """The §10 checks one exchange applies; absent (None) where defences are off."""

    update_ratio: float
    cosine_min: float
    result_ratio: float
    result_cosine_min: float
    weight_ratio: float
    robust_mean: RobustMean
    penalties: Penalties = field(compare=False)
    weight_floor: float = 1.0
    """One full round's weight for an honest peer (the weight bound's floor, §10)."""
    stretch: bool = True
    """Whether the update bounds stretch with the others' weight over this member's: in a
    round, weights are tokens and a short round's update is shorter. Off in the final agreement,
    whose weights say how recent a model is (an early stopper's 0.01), not how far it moved."""
    result_direction: bool = True
    """Whether a result must point along this member's own update where it did a full round
    (`result_cosine_min`). Off for a re-agreement: its members' states may have drifted apart,
    and the mean then points wherever the drift does."""

    @classmethod
    def of(
        cls,
        cfg: SecurityConfig,
        penalties: Penalties,
        weight_floor: float = 1.0,
        stretch: bool = True,
        result_direction: bool = True,
    ) -> Defence:
        return cls(
            cfg.update_ratio_max,
            cfg.cosine_min,
            cfg.result_ratio_max,
            cfg.result_cosine_min,
            cfg.weight_ratio_max,
            cfg.robust_mean,
            penalties,
            weight_floor,
            stretch,
            result_direction,
        )

    def max_weight(self, own_weight: float) -> float:
        return self.weight_ratio * max(own_weight, self.weight_floor)


@dataclass(frozen=True)
class Scale:
    """This peer's own values on one part and what they are measured against."""

    own: np.ndarray
    """Own values as the wire carries them (so rounding is common to both sides)."""
    reference: np.ndarray | None
    """None: no reference known (the update bounds are not applied); a zero-size array: zero."""
    tolerance: float
    """Absolute slack for rounding on the wire."""

    @classmethod
    def of(cls, own: np.ndarray, reference: np.ndarray | None, wire_format: str) -> Scale:
        ref = None if reference is None else (reference if reference.size else np.zeros_like(own))
        size = float(np.linalg.norm(own)) + (float(np.linalg.norm(ref)) if ref is not None else 0.0)
        return cls(own, ref, WIRE_TOLERANCE.get(wire_format, 1e-6) * size)

    def update(self, values: np.ndarray) -> np.ndarray:
        assert self.reference is not None
        return values.astype(np.float64) - self.reference

    @property
    def own_update(self) -> np.ndarray:
        return self.update(self.own)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b) / (float(np.linalg.norm(a)) * float(np.linalg.norm(b)))


def _bounded(
    update: np.ndarray, own_update: np.ndarray, ratio: float, cosine_min: float, tol: float, what: str
) -> str | None:
    norm, own_norm = float(np.linalg.norm(update)), float(np.linalg.norm(own_update))
    if not math.isfinite(norm) or norm > ratio * own_norm + tol:
        return f"{what} norm {norm:.3g} exceeds {ratio:g} x own {own_norm:.3g}"
    if norm > tol and own_norm > tol and _cosine(update, own_update) < cosine_min:
        return f"{what} cosine {_cosine(update, own_update):.2f} with own update is below {cosine_min:g}"
    return None


def check_contribution(
    values: np.ndarray, scale: Scale, defence: Defence, stretch: float = 1.0
) -> str | None:
    """Why an owner must reject this contribution to its part, or None (§10); `stretch` (>= 1) is
    how many times the owner's own tokens the sender's are (a longer round, a longer update)."""
    if scale.reference is None:
        return None
    return _bounded(
        scale.update(values),
        scale.own_update,
        defence.update_ratio * stretch,
        defence.cosine_min,
        scale.tolerance,
        "update",
    )


def check_result(
    result: np.ndarray,
    scale: Scale,
    defence: Defence,
    stretch: float = 1.0,
    count: int = 2,
    share: float | None = None,
    direction: bool = True,
) -> str | None:
    """Why a member must discard a part owner's result for its own values, or None (§10);
    `stretch` as for `check_contribution`, for the other members the result includes, `count`
    members in all, `share` this member's weight over the result's total (None: 1 / `count`),
    `direction` whether a weighted mean must also point along this member's own update.

    A weighted mean is `share` times this member's own update plus the rest times the mean of the
    others' updates, so a result implies that mean, which must pass the bounds every contribution
    is held to. Where this member's round was as long as the others' (outside a re-agreement) its
    update is a fair part of the mean, which then does not point against it (`result_cosine_min`);
    where it did a few steps of a round the others did whole (a joiner's or rejoiner's first),
    the mean points wherever the others' updates do. A robust mean of three or more cannot be
    unmixed (trimmed, clipped) and may leave the member's own update out, so only its direction
    is checked, at the contributions' floor."""
    if scale.reference is None:
        return None
    own_update = scale.own_update
    distance = result.astype(np.float64) - scale.own
    tol = scale.tolerance
    ratio = defence.result_ratio * stretch
    moved = _bounded(distance, own_update, ratio, -1.0, tol, "distance from own values")
    if moved is not None:
        return moved
    update = scale.update(result)
    robust = defence.robust_mean != "mean" and count >= 3
    if not robust:
        own_share = 1.0 / count if share is None else share
        if not 0.0 <= own_share < 1.0:
            return f"its total weight leaves the other members a share of {1.0 - own_share:.3g}"
        implied = _bounded(
            (update - own_share * own_update) / (1.0 - own_share),
            own_update,
            defence.update_ratio * stretch,
            defence.cosine_min,
            tol / (1.0 - own_share),
            "implied mean of the others' updates",
        )
        if implied is not None or not direction:
            return implied
    floor = min(defence.cosine_min, defence.result_cosine_min) if robust else defence.result_cosine_min
    return _bounded(update, own_update, math.inf, floor, tol, "result update")


def merge(
    own: np.ndarray,
    own_weight: float,
    others: Sequence[tuple[np.ndarray, float]],
    defence: Defence | None,
    scale: Scale | None = None,
) -> tuple[np.ndarray, float]:
    """The owner's merged part and its total weight: the weighted mean (rounded once to float32),
    or the configured robust mean for three or more contributions (float64; §10)."""
    total_w = own_weight + sum(w for _, w in others)
    rule = defence.robust_mean if defence is not None else "mean"
    if rule == "trimmed" and len(others) >= 2:
        stacked = np.sort(np.stack([own, *(v for v, _ in others)]).astype(np.float64), axis=0)
        return stacked[1:-1].mean(axis=0), total_w
    if rule == "centred-clip" and len(others) >= 2 and scale is not None and scale.reference is not None:
        tau = float(np.linalg.norm(scale.own_update)) + scale.tolerance
        centre = own.astype(np.float64)
        acc = np.zeros_like(centre)
        for values, w in others:
            diff = values.astype(np.float64) - centre
            norm = float(np.linalg.norm(diff))
            acc += w * (diff * min(1.0, tau / norm) if norm > 0 else diff)
        return centre + acc / total_w, total_w
    return weighted_part(own, own_weight, others, total_w), total_w


def weighted_part(
    own: np.ndarray, own_weight: float, others: Sequence[tuple[np.ndarray, float]], total_w: float
) -> np.ndarray:
    """Σ_j w_j x_j / W, summed in float64 and rounded once to float32, into one accumulator with
    one scratch array: a part is tens of millions of values for a GPU-sized model, and each pass
    over it (a product, a temporary, a rounding of its own) costs about what the sum does. With
    one weight for all (constant work, the common case) the weight folds into the division:
    Σ_j x_j / (W / w), three passes fewer."""
    rounded = np.empty(own.shape, np.float32)
    if all(w == own_weight for _, w in others):
        acc = own.astype(np.float64)
        for values, _ in others:
            np.add(acc, values, out=acc)
        return np.divide(acc, total_w / own_weight, out=rounded, casting="same_kind")
    acc = np.multiply(own, own_weight, dtype=np.float64)
    scratch = np.empty_like(acc)
    for values, w in others:
        np.multiply(values, w, out=scratch, dtype=np.float64)
        acc += scratch
    return np.divide(acc, total_w, out=rounded, casting="same_kind")


class PartChecks:
    """One exchange's §10 checks at one member: contributions to its own part, results of the others."""

    def __init__(
        self,
        defence: Defence,
        members: list[str],
        me: int,
        key: str,
        data: np.ndarray,
        reference: torch.Tensor | None,
        bounds: list[tuple[int, int]],
        decoded: Callable[[np.ndarray], tuple[str, np.ndarray]],
        weight: float,
    ) -> None:
        """`data` is this member's flat vector, `reference` what it is measured against (None:
        unknown, empty: zero), `decoded` gives a part's wire format and values as sent, `weight`
        this member's own."""
        self.defence, self.members, self.key, self.weight = defence, members, key, weight
        self.data, self.bounds, self.decoded = data, bounds, decoded
        self.reference = (
            None if reference is None else reference.detach().to(torch.float32).reshape(-1).numpy()
        )
        self.mine = self.scale(me)

    def scale(self, j: int) -> Scale:
        a, b = self.bounds[j]
        fmt, own = self.decoded(self.data[a:b])
        ref = self.reference
        return Scale.of(own, None if ref is None else ref[a:b] if ref.size else ref, fmt)

    def _penalised(self, j: int, why: str | None, what: str) -> str | None:
        if why is not None:
            self.defence.penalties.offend(self.members[j], f"{what} in {self.key}: {why}")
        return why

    def _margins(self, what: str, j: int, values: np.ndarray, scale: Scale) -> None:
        """How close to the bounds honest values come: the norm ratio and cosine, at debug level."""
        if logger.isEnabledFor(logging.DEBUG) and scale.reference is not None:
            update, own = scale.update(values), scale.own_update
            moved = values.astype(np.float64) - scale.own
            own_norm = float(np.linalg.norm(own))
            if own_norm > scale.tolerance and float(np.linalg.norm(update)) > scale.tolerance:
                logger.debug(
                    "%s of %s in %s: ratio %.3f distance %.3f cosine %.3f",
                    what,
                    self.members[j][-8:],
                    self.key,
                    float(np.linalg.norm(update)) / own_norm,
                    float(np.linalg.norm(moved)) / own_norm,
                    _cosine(update, own),
                )

    def _stretch(self, weight: float, count: int) -> float:
        """How many times this member's weight the others' (mean) weight is, at least 1: a member
        whose round was short (a joiner's first) holds longer rounds to a longer bound."""
        if not self.defence.stretch:
            return 1.0
        others = (weight - self.weight) / (count - 1) if count > 1 else weight
        return max(1.0, others / self.weight) if self.weight > 0 else 1.0

    def contribution(self, j: int, values: np.ndarray | str, weight: float, count: int = 1) -> str | None:
        """Why member j's contribution (of `weight`) is rejected (given a reason: it was invalid), or None."""
        if isinstance(values, str):
            return self._penalised(j, values, "contribution")
        self._margins("contribution", j, values, self.mine)
        why = check_contribution(values, self.mine, self.defence, self._stretch(weight, count))
        return self._penalised(j, why, "contribution")

    def result(self, j: int, values: np.ndarray | str, weight: float, count: int) -> str | None:
        """Why owner j's result (`count` members' total `weight`) is discarded for own values
        (given a reason: it was invalid), or None."""
        if isinstance(values, str):
            return self._penalised(j, values, "result")
        scale = self.scale(j)
        self._margins("result", j, values, scale)
        # each other member's weight passed an owner's bound, which this member's own bound
        # matches for honest weights: a larger total would stretch every bound below
        most = self.weight + (count - 1) * self.defence.max_weight(self.weight)
        if weight > most * (1.0 + 1e-9):
            return self._penalised(
                j, f"total weight {weight:.6g} exceeds {most:.6g} for {count} members", "result"
            )
        share, stretch = self.weight / weight, self._stretch(weight, count)
        direction = self.defence.result_direction and stretch < SHORT_ROUND_STRETCH
        why = check_result(values, scale, self.defence, stretch, count, share, direction)
        return self._penalised(j, why, "result")
