"""Bounds on what a validly signed heartbeat may claim, relative to this peer's own state.

A signature says who wrote a heartbeat, not that it is true. Before the view hands heartbeats to
its consumers (groups, round alignment, donor choice, rejoin), it drops or corrects claims no
honest peer could make:

- a round past the run's last round (`last_round`): no honest peer of this run claims one, and
  unlike the median below this bound is the same on every peer from its very first read, so a
  forger's heartbeat cannot be in some honest views and not in others (they would draw different
  groups and every exchange of the round would fail);
- a round more than `round_window` above the median round of the live peers (this one's own
  included): a forged huge round would make its forger every joiner's donor and send rejoining
  peers after it. Peers at round 0 count once they train it (a round start): at a swarm's very
  start every honest peer is there, and leaving them out would make a forger's round its own
  median. Peers at round 0 without a start are joining and stay out, so that joiners do not drag
  a running swarm's median down;
- a timestamp, or a round start, more than `clock_skew_s` ahead of this peer's clock, or a round
  start after the heartbeat's own timestamp: the round start is then treated as unknown, so it
  cannot make aligned peers skip steps;
- a throughput above `max_throughput_tokens_per_s`;
- a heartbeat older than the newest one seen from the same peer (a replay), which also keeps a
  replayed tombstone from evicting a peer that has published since.

Everything dropped is counted in `envelope.READ_DROPS` ("implausible", "replay").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from p2p_trainer.net.entry import has_left
from p2p_trainer.net.envelope import READ_DROPS
from p2p_trainer.net.records import Heartbeat


@dataclass(frozen=True)
class HeartbeatBounds:
    """The limits `bound_heartbeats` applies (from the run's [security] section)."""

    round_window: int = 100
    """Rounds above the live peers' median round that a heartbeat may claim."""
    clock_skew_s: float = 60.0
    """How far ahead of this peer's clock a heartbeat's timestamp or round start may be."""
    max_throughput_tokens_per_s: float = 1e9
    """Highest throughput a heartbeat may claim."""
    last_round: int | None = None
    """The run's number of rounds: a heartbeat may claim at most this round (None: no such bound)."""


def median_round(rounds: Sequence[int]) -> int | None:
    """The lower median of the rounds above 0 (peers still at 0 are joining), or None if none are.

    The lower one, so that with two peers a single liar claiming a huge round is not the median.
    """
    started = sorted(r for r in rounds if r > 0)
    return started[(len(started) - 1) // 2] if started else None


def plausible(beat: Heartbeat, now: float, bounds: HeartbeatBounds) -> Heartbeat | None:
    """`beat` with an implausible round start cleared, or None if it claims what no peer could."""
    throughput = beat.throughput_tokens_per_s
    if bounds.last_round is not None and beat.round > bounds.last_round:
        READ_DROPS.count(
            "implausible", f"heartbeat of {beat.peer_id[-8:]} claims round {beat.round} past the run's last"
        )
        return None
    if not math.isfinite(throughput) or throughput > bounds.max_throughput_tokens_per_s:
        READ_DROPS.count("implausible", f"heartbeat of {beat.peer_id[-8:]} claims {throughput:.3g} tokens/s")
        return None
    if beat.timestamp > now + bounds.clock_skew_s:
        READ_DROPS.count("implausible", f"heartbeat of {beat.peer_id[-8:]} is stamped in the future")
        return None
    latest_start = min(now, beat.timestamp) + bounds.clock_skew_s
    if beat.round_started > latest_start:
        READ_DROPS.count("implausible", f"heartbeat of {beat.peer_id[-8:]} starts its round in the future")
        return dataclasses.replace(beat, round_started=0.0)
    return beat


def training_rounds(
    beats: Sequence[Heartbeat], own_round: int, own_started: float, self_id: str = ""
) -> list[int]:
    """The rounds the window's median is taken over: every peer past round 0 or training it (its
    round start is known), this one's own included once (from its state, not from its own heartbeat
    among `beats`, which is older); joiners (round 0, no start) are left out."""
    rounds = [
        b.round
        for b in beats
        if not b.leaving
        and b.peer_id != self_id
        and (b.round > 0 or b.round_started > 0)
        and not has_left(b, b.round)  # stopped for its time bound: its round stays where it was
    ]
    if own_round > 0 or own_started > 0:
        rounds.append(own_round)
    return rounds


def within_round_window(
    beats: list[Heartbeat], own_round: int, window: int, own_started: float = 0.0, self_id: str = ""
) -> list[Heartbeat]:
    """The heartbeats whose round is at most `window` above the lower median of the training peers'
    rounds (`training_rounds`; `own_started`: this peer's start of `own_round`, 0 if not training)."""
    counted = sorted(training_rounds(beats, own_round, own_started, self_id))
    if not counted:
        return beats
    median = counted[(len(counted) - 1) // 2]
    kept = []
    for beat in beats:
        if beat.round > median + window:
            READ_DROPS.count(
                "implausible", f"heartbeat of {beat.peer_id[-8:]} claims round {beat.round} (median {median})"
            )
            continue
        kept.append(beat)
    return kept


class ReplayFilter:
    """Remembers the newest heartbeat seen from each peer; older ones read later are replays."""

    def __init__(self, forget_after_s: float) -> None:
        self.forget_after_s = forget_after_s
        self._newest: dict[str, Heartbeat] = {}

    def newest(self, beats: list[Heartbeat], now: float) -> list[Heartbeat]:
        """For each peer, the newest of its heartbeat in `beats` and the newest seen before (if that
        is still recent); peers whose newest heartbeat is older than `forget_after_s` are forgotten."""
        out = []
        for beat in beats:
            seen = self._newest.get(beat.peer_id)
            recent = seen is not None and seen.timestamp >= now - self.forget_after_s
            if seen is not None and recent and beat.timestamp < seen.timestamp:
                READ_DROPS.count("replay", f"heartbeat of {beat.peer_id[-8:]} is older than one seen before")
                out.append(seen)
                continue
            self._newest[beat.peer_id] = beat
            out.append(beat)
        for peer in [p for p, b in self._newest.items() if b.timestamp < now - self.forget_after_s]:
            del self._newest[peer]
        return out


def bound_heartbeats(
    beats: list[Heartbeat],
    own_round: int,
    now: float,
    bounds: HeartbeatBounds,
    replays: ReplayFilter,
    own_started: float = 0.0,
    self_id: str = "",
) -> list[Heartbeat]:
    """The heartbeats a consumer may trust (see the module's docstring), sorted by peer id;
    `own_started`: when this peer began `own_round` (0 while it is still joining); `self_id`: this
    peer, whose own heartbeat among `beats` does not count in the median a second time."""
    fresh = replays.newest(beats, now)
    kept = [b for b in (plausible(beat, now, bounds) for beat in fresh) if b is not None]
    window = within_round_window(kept, own_round, bounds.round_window, own_started, self_id)
    return sorted(window, key=lambda b: b.peer_id)
