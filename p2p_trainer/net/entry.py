"""When a late joiner enters the swarm's groups.

Groups are drawn from the whole live list (docs/algorithms.md §2.1), so two peers whose views differ
by one member draw different groups for the round and none of their exchanges meet. A newcomer's
heartbeat reaches the other views one by one, each at its next refresh: for up to a couple of
heartbeat periods some views count it and some do not. Where rounds are shorter than that (fast
steps, small H) every exchange of those rounds fails for the whole swarm, each waits out its grace
window, the peers fall out of step, and the newcomer is blamed for the lag.

So the newcomer names, in its heartbeat, the first round whose groups may count it: the first
round whose exchange starts at least `ENTRY_PERIODS` heartbeat periods from now. Every peer,
the newcomer included, leaves it out of the groups of earlier rounds, and a view that has not yet
read the heartbeat leaves it out anyway, so all views agree on every round. From the moment
it sees a donor until its download names the real entry, it names the run's last round, which no
group reaches (`run/entry_paths.py` `late_join`): round 0 alone is not read as joining by a view in
its first periods of training, nor from a heartbeat older than two periods. Where rounds are
long, that is the round it adopted: nothing changes. Until then the newcomer trains on alone; its
exchanges of those rounds fail with the reason, so DiLoCo's anchor, which it then updates alone,
asks for a re-agreement at its first exchange with the others (§1).

Where three or more rounds pass before the entry, training alone through them is of no use: by
the entry the newcomer's state would be that many rounds behind the swarm's, and the others'
contributions would fail its bounds (§10). It waits instead, without training, until half of the
others' heartbeats show the swarm near its entry round (a heartbeat is read up to two view periods
after its peer was there), then asks a donor which round it serves until that is the entry round
(`run/entry_paths.py` `await_entry`: within the time the swarm should take to get there, and
falling back to the heartbeats where no donor says so), downloads the swarm's state again and
enters with it, in time for that round's exchange.

A peer that rejoins (`Rejoin`) names no entry round: every view already counts it, by its earlier
heartbeat, and a later entry would take it out of some views before others (one cut off for longer
than the heartbeat TTL has dropped out of the views, and is not covered).

A peer whose time bound (`--minutes`) is near leaves the groups the same way (`TimeBound`): from
`ENTRY_PERIODS` heartbeat periods before the bound, it names in its heartbeat the first round whose
exchange starts at the bound or later, takes part in the rounds before it and stops there. Stopping
at the bound itself, unannounced, left it in every view until it left the swarm: each of its
partners waited out a grace window in every round meanwhile, and DiLoCo's all-reduce, which counts
every peer, merged only in part. Announcing the stop at the moment it happens made the views
disagree while they read it (docs/algorithms.md §2.1).

The round time is measured from the others' heartbeats as they are read (`RoundPace`): the
rounds each peer began against when it began them, the median over peers (a heartbeat's
throughput says only how long its peer's last round took, one noisy round; the donor's step time
is one peer's claim).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from p2p_trainer.net.records import Heartbeat

ENTRY_PERIODS = 2.5
"""Heartbeat periods between adopting a state and the first exchange that counts the peer: its
heartbeat is published at once (one DHT store), every other view reads it at its next refresh
(up to a period later), and half a period is left for slow stores and reads."""
REFRESH_AFTER_ROUNDS = 3
"""Rounds before the entry from which a newcomer waits and downloads the swarm's state again as it
enters (see the module). One or two rounds alone cost what a failed exchange costs anyway."""
MAX_WAIT_S = 60.0
"""Longest a newcomer waits for the swarm to reach its entry round before it downloads anyway."""
PACE_WINDOW_S = 30.0
"""How far back round starts count for the swarm's round time: recent enough to follow a change of
pace, long enough to span several heartbeat periods (the last two count whatever their age)."""
MAX_ENTRY_ROUNDS = 256
"""Most rounds a newcomer names between the round it adopted and its entry. Round times come from
other peers' claims; claims of absurdly short rounds must not keep it out for the rest of the run."""


def entry_round(adopted: int, remaining_s: float, round_s: float, entry_s: float) -> int:
    """The first round whose groups may count a peer that adopted round `adopted`, whose exchange
    starts in `remaining_s`, with rounds of about `round_s` after it: the first round whose exchange
    starts `entry_s` or more from now (at most `MAX_ENTRY_ROUNDS` later than `adopted`)."""
    if not remaining_s < entry_s:  # NaN too: no basis for a wait
        return adopted
    if not round_s > 0 or not math.isfinite(round_s):
        return adopted + 1
    rounds = math.ceil((entry_s - remaining_s) / round_s - 1e-9)
    return adopted + min(MAX_ENTRY_ROUNDS, max(1, rounds))


class Planned(Protocol):
    """A peer's named entry and leave rounds (its heartbeat, or this peer's own status)."""

    @property
    def enters_round(self) -> int: ...

    @property
    def leaves_round(self) -> int: ...


def in_groups(peer: Planned, round: int) -> bool:
    """Whether `round`'s groups count `peer`: from its entry round on, and before its leave round
    where it named one."""
    return peer.enters_round <= round and not (peer.leaves_round and round >= peer.leaves_round)


def has_left(peer: Planned, round: int) -> bool:
    """Whether a peer whose heartbeat (or status) says round `round` is in its last round or has
    stopped at its leave round (a stopped peer's heartbeat keeps the last round it began): not a
    partner to catch up with, a donor to adopt from, nor a vote on where the swarm is."""
    return bool(peer.leaves_round) and round + 1 >= peer.leaves_round


@dataclass
class TimeBound:
    """A time bound met by leaving the groups at a round named ahead (see the module)."""

    deadline: float
    """time.monotonic() of the bound; inf for none."""
    notice_s: float
    """How long before the bound the leave round is named: as long as a newcomer's entry takes."""
    leaves: int | None = None
    """The round named (None: none yet)."""

    def leave_round(self, now: float, round: int, remaining_s: float, round_s: float) -> int | None:
        """The round to name now, once `notice_s` or less is left before the bound, or None:
        the first whose exchange starts at the bound or later (`entry_round`), from round `round`,
        whose exchange starts in `remaining_s`, with rounds of about `round_s` after it. Once
        `notice_s` past the bound (rounds ran slower than the pace said), the round it is in."""
        if now >= self.deadline + self.notice_s and (self.leaves is None or round < self.leaves):
            self.leaves = round  # late: the views read it one by one, but the peer stops now
            return round
        if self.leaves is not None or now < self.deadline - self.notice_s:
            return None
        self.leaves = entry_round(round, remaining_s, round_s, self.deadline - now)
        return self.leaves

    def over(self, round: int) -> bool:
        """Whether a peer in round `round` stops now: at its leave round, whose exchanges it
        takes no part in (`leave_round` names one late where the rounds ran slow)."""
        return self.leaves is not None and round >= self.leaves


@dataclass(frozen=True)
class GroupEntry:
    """A newcomer's way into the groups: it adopted round `adopted`, rounds last about `round_s`,
    and the groups count it from round `enters` on."""

    adopted: int
    enters: int
    round_s: float

    @staticmethod
    def plan(adopted: int, remaining_s: float, round_s: float, entry_s: float) -> GroupEntry:
        """The entry of a peer that adopted round `adopted` just now (see `entry_round`)."""
        if not round_s > 0 or not math.isfinite(round_s):
            round_s = 0.0
        return GroupEntry(adopted, entry_round(adopted, remaining_s, round_s, entry_s), round_s)

    @property
    def refreshes(self) -> bool:
        """Whether the newcomer waits for the swarm and downloads its state again (see the module)."""
        return self.enters - self.adopted >= REFRESH_AFTER_ROUNDS

    def heartbeat_round(self, period_s: float) -> int:
        """The round half of the others' heartbeats must show before the newcomer asks a donor which
        round it serves (`await_state_round`). A heartbeat read is up to two view periods behind
        its peer (published once a period, read once a period), so waiting for the heartbeats to
        show the entry round itself let the swarm reach it first, and the groups of that round
        waited out their windows for the newcomer. Never before the round after the adopted one."""
        if not self.round_s > 0:
            return self.enters
        lag = math.ceil(2 * period_s / self.round_s - 1e-9)
        return max(self.adopted + 1, self.enters - lag)

    def wait_limit_s(self, entry_s: float) -> float:
        """The longest wait for the swarm to reach the entry round: three times the planned time,
        and never more than `MAX_WAIT_S` (a swarm that stalls meanwhile is met as it is)."""
        planned = entry_s + (self.enters - self.adopted) * self.round_s
        return min(MAX_WAIT_S, 3 * planned)


class RoundPace:
    """Each other peer's recent (round, round start) pairs, from the heartbeats a view reads."""

    def __init__(self, window_s: float = PACE_WINDOW_S) -> None:
        self.window_s = window_s
        self._starts: dict[str, deque[tuple[int, float]]] = {}
        self._lock = threading.Lock()  # noted by the view's thread, read by the training thread

    def saw(self, beats: Iterable[Heartbeat]) -> None:
        """Note the rounds and round starts in `beats`; peers not among them are forgotten."""
        with self._lock:
            self._note(beats)

    def _note(self, beats: Iterable[Heartbeat]) -> None:
        seen = {}
        for b in beats:
            starts = self._starts.get(b.peer_id, deque())
            # the same round again (a heartbeat between a round's end and the next one's start,
            # where the start is stamped twice) says nothing new
            if b.round_started > 0 and (not starts or b.round != starts[-1][0]):
                if starts and (b.round < starts[-1][0] or b.round_started <= starts[-1][1]):
                    starts.clear()  # a rejoin or a restart: its earlier rounds say nothing of its pace
                starts.append((b.round, b.round_started))
            # the last two starts always: rounds longer than the window are measured too
            while len(starts) > 2 and starts[-1][1] - starts[0][1] > self.window_s:
                starts.popleft()
            seen[b.peer_id] = starts
        self._starts = seen

    def round_s(self, self_id: str) -> float:
        """The median over the other peers of (their latest start − their earliest) ÷ the rounds in
        between; 0 where no peer has shown two rounds yet."""
        with self._lock:
            paces = sorted(
                (s[-1][1] - s[0][1]) / (s[-1][0] - s[0][0])
                for peer, s in self._starts.items()
                if peer != self_id and len(s) >= 2
            )
        return paces[len(paces) // 2] if paces else 0.0
