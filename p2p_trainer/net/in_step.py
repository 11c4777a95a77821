"""Which live peers are out of step: so far ahead of this peer that they cannot share its round.

Groups are keyed on the round (docs/algorithms.md §2.1), so a peer in another round cannot take part
in this round's exchange. A group that counts it anyway waits out its quorum window and merges in
part or not at all. A peer that fell behind (a late joiner whose first rounds failed, a peer back
from a stall) is in that position for every exchange: it waits on groups no one else is in, each
wait puts it further behind, and it drags every peer it is drawn with into the same waits.

A heartbeat says which round its peer was in at its timestamp. This peer remembers when it entered
each of its recent rounds, and compares the two rounds at that same instant, so a heartbeat's age
does not matter (rounds can be much shorter than a heartbeat period): only the two peers' pace
does. A peer more than `LAG_ROUNDS` rounds ahead at that instant is out of step. Hosts' clocks
differ a little; the comparison allows `SKEW_S` either way.

Only a peer that sees at least half of the others ahead leaves them out: that is the peer that fell
behind. A minority ahead is left in. Two peers in the same round entered it at slightly different
instants, so a heartbeat stamped between the two (a liar can aim for that) could read as out of
step to one and in step to the other; the groups are drawn from the whole list, so one such
disagreement would put every group of the round on different keys.

Only peers ahead are left out. The peer that fell behind sees everyone ahead, so it trains alone,
without waits, and `Rejoin` (`run/entry_paths.py`) brings it to the swarm's state within a few
rounds. The others cannot do the same to it: a peer whose heartbeat shows it behind may already
have jumped to the swarm's round (a rejoin), and leaving it out until its next heartbeat is read
would fail its first exchanges and put it behind again. (A late joiner names the round from which
groups count it, `entry.py`, and every view applies that instead.) After such a jump this
peer's earlier rounds say nothing about its pace, so its history starts again; a heartbeat older
than the history is never held against its peer.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from p2p_trainer.net.records import Heartbeat

LAG_ROUNDS = 2
"""Rounds another peer may be ahead at one instant and still be drawn into this peer's groups: one
for the round a peer is finishing while the other starts the next, one for the heartbeat's own
granularity (it reports the round in progress)."""
SKEW_S = 0.25
"""Clock difference between hosts that the comparison allows. NTP keeps hosts far closer; a host
whose clock is off by more than this and two rounds looks out of step (to the others only as one of
a minority, which is left in)."""
KEEP_ROUNDS = 512
"""Round starts remembered: heartbeats are at most a TTL old, far fewer rounds than this unless
rounds are milliseconds long, and then an older heartbeat is simply not judged."""


class RoundHistory:
    """When this peer entered each of its recent rounds (consecutive rounds only)."""

    def __init__(self, keep: int = KEEP_ROUNDS) -> None:
        self._keep = keep
        self._rounds: list[int] = []
        self._starts: list[float] = []

    def entered(self, round: int, at: float) -> None:
        """This peer is in `round` from time `at` on. A round that is not the next one (a late
        join, a rejoin, a resume) restarts the history."""
        if self._rounds and round == self._rounds[-1]:
            return
        if self._rounds and (round != self._rounds[-1] + 1 or at < self._starts[-1]):
            self._rounds.clear()
            self._starts.clear()
        self._rounds.append(round)
        self._starts.append(at)
        if len(self._rounds) > self._keep:
            del self._rounds[: -self._keep]
            del self._starts[: -self._keep]

    def round_at(self, t: float) -> int | None:
        """The round this peer was in at time `t`; None before the history's start."""
        i = bisect.bisect_right(self._starts, t)
        return self._rounds[i - 1] if i > 0 else None


def out_of_step(
    beats: Sequence[Heartbeat],
    history: RoundHistory,
    self_id: str,
    lag_rounds: int = LAG_ROUNDS,
    skew_s: float = SKEW_S,
) -> set[str]:
    """Peers whose heartbeat puts them more than `lag_rounds` rounds ahead of this peer's round at
    the heartbeat's time (give or take `skew_s`), if they are at least half of the others; none
    otherwise (see the module)."""
    out, others = set(), 0
    for b in beats:
        if b.peer_id == self_id:
            continue
        others += 1
        mine = history.round_at(b.timestamp + skew_s)
        if mine is not None and b.round > mine + lag_rounds:
            out.add(b.peer_id)
    return out if 2 * len(out) >= others else set()
