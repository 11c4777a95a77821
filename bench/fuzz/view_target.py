"""The swarm view itself (`SwarmView`) and the groups drawn from it, over DHT heartbeat records
sealed by the right key or not, with any field a decoder lets through, tombstones, suspect reports
and peers heard from on streams.

What must hold for any such records: the view neither raises nor stops; it holds only this peer,
peers with a validly signed heartbeat and peers heard from; a validly signed tombstone takes its
peer out; while at most one identity lies, every honest peer (a fresh heartbeat at this peer's
round) stays in the view, whatever the liar's records claim or report; and every group drawn
from the view holds this peer and only peers of the view, in groups of the configured size.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from hypothesis import strategies as st

from bench.fuzz.fakes import DictDHT, _store
from bench.fuzz.inputs import _PEERS, _flips, _heartbeats, _peer_index
from p2p_trainer.algo.groups import group_of, partition
from p2p_trainer.config import SecurityConfig
from p2p_trainer.exchange.interface import ALL
from p2p_trainer.net import records
from p2p_trainer.net.dht import NetNode
from p2p_trainer.net.swarm_view import SwarmView

_RUN = "fuzz"
# a suspect report counts 1.5 periods (30 s) after its suspect's newest heartbeat: far longer than
# one case takes, however loaded the machine, and shorter than the clock skew (60 s) a heartbeat
# stamped ahead may claim
_PERIOD_S = 20.0
_TTL_S = 60.0


class _DHTNode(DictDHT):
    """The part of a DHT node the view uses, over a dict: `_PEERS[0]` is this peer."""

    peer_id = _PEERS[0].peer_id
    signer = _PEERS[0]

    def bootstrap_ids(self) -> list[str]:
        return []

    def ping_peers(self, targets: list[str], timeout_s: float) -> int:
        return 0


def _honest(owner: int, own_round: int) -> records.Heartbeat:
    """What a live honest peer in this peer's round publishes."""
    now = records.now()
    return records.Heartbeat(
        _PEERS[owner].peer_id, own_round, 1000, 2.5, 100.0, "0.1.0", now, round_started=now - 1
    )


def _near(
    owner: int,
    own_round: int,
    rounds: int,
    ago_s: float,
    started_s: float,
    leaving: bool,
    suspects: list[int],
    votes: list[tuple[int, int, int]] = [],  # noqa: B006 (never changed)
) -> records.Heartbeat:
    """A heartbeat a liar could publish under its own key: `rounds` from this peer's round, stamped
    `ago_s` before now, its round started `started_s` before that, reporting `_PEERS[suspects]` dead
    and voting `_PEERS[i]` out from `first` rounds after this peer's round for `span` rounds (`votes`)."""
    stamp = records.now() - ago_s
    excludes = tuple(
        (_PEERS[i].peer_id, max(0, own_round + first), max(0, own_round + first) + span)
        for i, first, span in votes
    )
    beat = records.Heartbeat(
        _PEERS[owner].peer_id,
        max(0, own_round + rounds),
        0,
        None,
        1.0,
        "0.1.0",
        stamp,
        leaving,
        max(0.0, stamp - started_s),
        tuple(_PEERS[i].peer_id for i in suspects),
    )
    return dataclasses.replace(beat, excludes=excludes[: records.MAX_EXCLUDES])


Beat = tuple[int, int, list[int], Any]
"""(owner, sealer, flips, what): sealed by `owner`'s own key if `sealer` is None; `what` is
"absent" for no record, None for an honest heartbeat of `owner`, a heartbeat from `_heartbeats()`
(under the owner's id or not) with extra suspects among `_PEERS`, or the arguments of `_near`."""


def fuzz_swarm_view(beats: list[Beat], heard_idx: list[int], own_round: int, seed: int) -> None:
    node = _DHTNode()
    last: dict[int, bool] = {}  # owner: whether its record is an honest heartbeat it sealed
    for owner, sealer, flips, what in beats:
        if what == "absent":
            continue
        if what is None:
            beat = _honest(owner, own_round)
        elif isinstance(what[0], records.Heartbeat):
            fuzzed, as_owner, suspects = what
            peer_id = _PEERS[owner].peer_id if as_owner else fuzzed.peer_id
            named = tuple(_PEERS[i].peer_id for i in suspects)
            beat = dataclasses.replace(fuzzed, peer_id=peer_id, suspects=(named + fuzzed.suspects)[:4])
        else:
            beat = _near(owner, own_round, *what)
        sealer = owner if sealer is None else sealer
        valid = _store(node, records.heartbeat_key(_RUN), owner, sealer, beat.encode(), flips)
        last[owner] = valid and what is None
    me = _PEERS[0].peer_id
    # what the decoder lets through (fuzzed on its own): the view's input
    read = {b.peer_id: b for b, _ in records.read_heartbeats(node, _RUN) if b.peer_id != me}
    heard = {_PEERS[i].peer_id for i in heard_idx if i}
    view = SwarmView(cast(NetNode, node), _RUN, _PERIOD_S, _TTL_S, SecurityConfig(), last_round=10**6)
    try:
        view.hear_from(lambda _s: heard)
        view.enter_round(own_round)
        view._refresh()
        live = view.live_peers()
        ahead = view.out_of_step()
        view.reported_dead()
        outside = view.outside_groups(own_round)
        voted = view.voted_out(own_round)
    finally:
        view.close()
    assert set(live) <= set(read) | heard | {me}, (live, set(read), heard)
    assert ahead <= set(read), ahead
    for peer, beat in read.items():
        assert not beat.leaving or peer not in live, "a validly signed tombstone left its peer in view"
    honest = {_PEERS[o].peer_id for o, ok in last.items() if ok and o != 0}
    if len(set(read) - honest) <= 1:  # at most one identity lies
        assert honest <= set(live), (honest, live, set(read))
        # honest heartbeats here vote for nobody: one liar's votes never reach two (`exclusion.py`)
        assert not honest & (voted | outside), (honest, voted, outside)
    members = sorted(set(live) | {me})
    for size in (2, 3, ALL):
        _, group = group_of(me, members, size, seed)
        assert me in group and set(group) <= set(members), (group, members)
        groups = partition(members, size, seed)
        assert sorted(p for g in groups for p in g) == members, groups
        if size != ALL and len(members) > size:
            assert all(2 <= len(g) <= size + 1 for g in groups), groups


def _fuzzed() -> st.SearchStrategy[Any]:
    # offsets near the bounds (a period, the clock skew, a record's life) as often as any other
    edges = [
        0.0,
        1.0,
        5.0,
        29.0,
        31.0,
        59.0,
        61.0,
        599.0,
        601.0,
        -1.0,
        -10.0,
        -29.0,
        -31.0,
        -59.0,
        -61.0,
        -601.0,
    ]
    seconds = st.sampled_from(edges) | st.floats(-2000.0, 2000.0)
    near = st.tuples(
        st.sampled_from([0, 1, -1, 100, 101, -100, -101])
        | st.integers(-300, 300)
        | st.integers(-(10**6), 10**6),
        seconds,
        seconds,
        st.booleans(),
        st.just([1, 2, 3]) | st.lists(_peer_index, max_size=3),
        st.lists(st.tuples(_peer_index, st.integers(-5, 5), st.integers(1, 20)), max_size=4),
    )
    return near | near | st.tuples(_heartbeats(), st.booleans(), st.lists(_peer_index, max_size=3))


def _beats() -> st.SearchStrategy[list[Beat]]:
    """Records of any peers stored first (forgeries, records later replaced), then one record, or
    none, for each of the three other peers: their last records are what the view reads."""
    # weighted towards records that reach the view: sealed by their owner, intact
    what = st.just("absent") | st.none() | _fuzzed()
    sealers = st.none() | st.none() | _peer_index
    flips: st.SearchStrategy[list[int]] = st.just([]) | st.just([]) | _flips
    earlier = st.lists(st.tuples(_peer_index, sealers, flips, what), max_size=3)
    last = st.tuples(*(st.tuples(st.just(owner), sealers, flips, what) for owner in (1, 2, 3)))
    return st.tuples(earlier, last).map(lambda t: [*t[0], *t[1]])


SWARM_VIEW = (
    fuzz_swarm_view,
    (
        _beats(),
        st.lists(_peer_index, max_size=3),
        st.sampled_from([0, 1, 5, 150]) | st.integers(min_value=0, max_value=10**6),
        st.integers(min_value=0, max_value=2**63),
    ),
)
"""The target and its strategies, for `bench.fuzz.TARGETS`."""
