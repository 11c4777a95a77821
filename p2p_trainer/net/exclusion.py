"""Agreed exclusion: the swarm's views leave a peer out of the groups when two others vote it out.

A penalty (`robust.py`, docs/algorithms.md §10) is this peer's own: it stops sending to the liar
and merging its values, but the groups are still drawn with the liar in them, because a partition
without it would give this peer member lists its partners do not share. So an honest peer drawn
with a liar merges with nobody on that part, and honest members that penalised the liar at
different moments end a round with different values (one took the liar's part result, one did
not), drift apart, and start failing each other's bounds.

So a peer whose offences repeat (two within about four penalty half-lives: one noisy update
that crosses a bound is not enough) is also *voted out*: this peer's heartbeat names it, with the
first round the vote covers and the first it no longer covers. The first is named ahead, as a late
joiner's entry round is (`entry.py`): far enough that every view has read the heartbeat before that
round's exchanges, so every view leaves the peer out of the same rounds, the voted peer's own view
included. A peer is out of a round's groups when `VOTES` or more other peers' heartbeats vote it
out for that round, not counting the votes of peers that are out themselves: one liar alone cannot
vote an honest peer out, and a voted-out liar's votes stop counting once it is out. (A liar that
only votes is never voted out: with one honest peer's mistaken vote beside its own, it can keep an
honest peer out for that vote's span.)

A vote lasts `SPAN_ROUNDS` rounds, doubling with every new vote for the same peer (a liar let
back in offends again at once); an offence while a vote runs, or before it starts, extends it to
its span past a round named ahead, or adds a range there. Changing a vote only ever changes rounds that are still named
ahead, and an ended vote stays published for as many rounds as it was named ahead, while other
views may still be in its last rounds. A ballot holds at most `MAX_EXCLUDES` ranges: a full one
casts no new vote rather than drop one in force.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable

from p2p_trainer.net.records import MAX_EXCLUDES, MAX_STEPS, Heartbeat

logger = logging.getLogger(__name__)

VOTES = 2
"""Votes from distinct other peers that leave a peer out of a round's groups: one liar's never do."""
SPAN_ROUNDS = 8
"""Rounds a first vote covers; each later vote for the same peer covers twice as many."""
MAX_SPAN_ROUNDS = 1024
"""Longest a vote lasts, however often its peer offended."""
STRIKES = 1.5
"""Decaying offence count (`Penalties.strikes`) at which a penalised peer is also voted out: a
second offence within about four penalty half-lives of the first."""

Vote = tuple[str, int, int]
"""(peer id, first round covered, first round not covered)."""


def voted_out(beats: Iterable[Heartbeat], round: int, own: Iterable[Vote] = (), me: str = "") -> set[str]:
    """Peers that `VOTES` or more other peers vote out of `round`'s groups, counting the votes in
    `beats` and this peer's own (`own`, under `me`: its current ballot, not the older copy of its
    heartbeat read back). Votes of peers that are out themselves by the others' votes do not count."""
    ballots: dict[str, list[Vote]] = {b.peer_id: list(b.excludes) for b in beats if b.peer_id != me}
    if me:
        ballots[me] = list(own)

    def count(voters: set[str]) -> set[str]:
        tally: dict[str, int] = {}
        for voter in voters:
            named = {peer for peer, first, end in ballots[voter] if first <= round < end and peer != voter}
            for peer in named:
                tally[peer] = tally.get(peer, 0) + 1
        return {peer for peer, n in tally.items() if n >= VOTES}

    out = count(set(ballots))
    return count(set(ballots) - out) if out else out


class Ballot:
    """This peer's votes; thread-safe (the transport's loop casts them, the view publishes them).

    A peer's votes are ranges of rounds. A change never touches a round before the `first` it is
    asked for (a round every view reads the change before): a new offence extends a range that
    reaches `first`, or adds a range from `first`; `withdraw` cuts ranges at `first`."""

    def __init__(self) -> None:
        self._votes: dict[str, list[Vote]] = {}
        self._cast: dict[str, int] = {}
        """Separate votes cast per peer over the run: each new one lasts twice as long."""
        self._lock = threading.Lock()

    def vote(self, peer: str, first: int) -> Vote | None:
        """Vote `peer` out from round `first` on; the range now covering `first`, or None where
        the ballot is full (`MAX_EXCLUDES` ranges: dropping a published one would change rounds
        that are not ahead). A range that reaches `first` is extended to a span past it;
        otherwise a new range starts at `first`, as long as the last one while one is still
        published, twice as long where none is."""
        with self._lock:
            ranges = self._votes.get(peer, [])
            reaching = [v for v in ranges if v[2] >= first]
            cast = self._cast.get(peer, 0) + (0 if ranges else 1)  # a new vote where none is published
            span = min(MAX_SPAN_ROUNDS, SPAN_ROUNDS << min(max(cast - 1, 0), 20))
            if reaching:
                old = max(reaching, key=lambda v: v[2])
                vote = (peer, old[1], min(MAX_STEPS - 1, max(old[2], first + span)))
                ranges[ranges.index(old)] = vote
            elif sum(len(held) for held in self._votes.values()) >= MAX_EXCLUDES:
                vote = None
            else:
                vote = (peer, first, min(MAX_STEPS - 1, first + span))
                self._votes[peer] = [*ranges, vote]
                self._cast[peer] = cast
        if vote is None:
            logger.warning("peer %s not voted out: this peer's ballot is full", peer[-8:])
        else:
            logger.warning(
                "peer %s voted out of the groups of rounds %d..%d", peer[-8:], vote[1], vote[2] - 1
            )
        return vote

    def withdraw(self, peers: Iterable[str], first: int) -> None:
        """Take back the votes against `peers` from round `first` on (this peer adopted their state:
        it was the one that differed)."""
        with self._lock:
            for peer in peers:
                kept = [(p, a, min(b, first)) for p, a, b in self._votes.get(peer, []) if a < first]
                if kept:
                    self._votes[peer] = kept
                else:
                    self._votes.pop(peer, None)

    def votes(self, since: int) -> tuple[Vote, ...]:
        """What this peer publishes: its ranges that end after round `since` (the caller keeps ended
        ones published while other views may still be in them); older ones are dropped."""
        with self._lock:
            for peer in list(self._votes):
                self._votes[peer] = [v for v in self._votes[peer] if v[2] > since]
                if not self._votes[peer]:
                    del self._votes[peer]
            return tuple(sorted(v for ranges in self._votes.values() for v in ranges))


def rounds_ahead(period_s: float, round_s: float, periods: float) -> int | None:
    """Rounds that pass in `periods` heartbeat periods at `round_s` per round, plus one (the round
    under way); None while the round time is unknown or absurd (then no vote is cast: the views
    could not all read it in time)."""
    if not round_s > 0 or not math.isfinite(round_s):
        return None
    return min(MAX_SPAN_ROUNDS, math.ceil(periods * period_s / round_s) + 1)
