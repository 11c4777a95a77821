"""Round alignment (outer.align_rounds): how many inner steps a late peer leaves out."""

from __future__ import annotations

from dataclasses import replace

import msgpack
import pytest
from nacl.signing import SigningKey

from bench.fuzz.fakes import DictDHT
from p2p_trainer.config import OuterConfig
from p2p_trainer.net import records
from p2p_trainer.net.align import RoundAligner, steps_late
from p2p_trainer.net.envelope import Signer
from p2p_trainer.net.records import Heartbeat, RecordError
from p2p_trainer.net.view_bounds import HeartbeatBounds, ReplayFilter, bound_heartbeats

ME = "12D3KooWme"


def beat(peer: str, rnd: int, started: float, leaving: bool = False) -> Heartbeat:
    return Heartbeat(peer, rnd, 0, None, 0.0, "0.1.0", started + 1.0, leaving=leaving, round_started=started)


def late(beats: list[Heartbeat], my_start: float = 100.0, my_round: int = 7) -> int:
    # round 5 s, step 0.5 s, H = 10
    return steps_late(my_round, my_start, beats, ME, round_s=5.0, step_s=0.5, num_inner_steps=10)


def test_a_peer_behind_the_earliest_start_of_its_round_leaves_out_the_steps_it_is_late_by() -> None:
    assert late([beat("a", 7, 98.9), beat("b", 7, 99.8)]) == 2  # 1.1 s behind a: 2 whole steps
    assert late([beat("a", 7, 99.8)]) == 0  # less than a step: nothing to gain
    assert late([beat("a", 7, 101.0)]) == 0  # the others are behind: they catch up, not us


def test_a_peer_a_round_ahead_is_extrapolated_one_behind_is_not() -> None:
    assert late([beat("a", 8, 103.0)]) == 4  # started 8 at 103, so 7 at about 98: 2 s late
    # behind, or its heartbeat predates its start of round 7: no guess (a long Mix2 round would
    # make one too early)
    assert late([beat("a", 6, 94.0)]) == 0
    assert late([beat("a", 9, 50.0), beat("b", 3, 50.0)]) == 0  # rejoin's business


def test_never_a_whole_round_and_not_for_self_leavers_or_unknown_starts() -> None:
    assert late([beat("a", 7, 80.0)]) == 9  # at most H - 1
    assert late([beat(ME, 7, 90.0), beat("a", 7, 90.0, leaving=True), beat("b", 7, 0.0)]) == 0
    assert steps_late(7, 100.0, [beat("a", 7, 90.0)], ME, round_s=5.0, step_s=0.0, num_inner_steps=10) == 0


def test_aligner_waits_for_a_round_time_estimate() -> None:
    aligner = RoundAligner(ME, num_inner_steps=10)
    beats = [beat("a", 7, 98.0)]
    assert aligner.steps_to_skip(7, 100.0, beats, step_s=0.5) == 0  # no round seen yet
    aligner.observe(5.0)
    assert aligner.steps_to_skip(7, 100.0, beats, step_s=0.5) == 4
    assert aligner.steps_to_skip(7, 100.0, beats, step_s=None) == 0


def test_round_started_travels_in_heartbeats_and_is_validated() -> None:
    b = beat("a", 7, 98.5)
    assert Heartbeat.decode(b.encode()).round_started == 98.5
    old = msgpack.unpackb(b.encode())
    del old["round_started"]  # a peer of an earlier version
    assert Heartbeat.decode(msgpack.packb(old)).round_started == 0.0
    with pytest.raises(RecordError, match="round_started"):
        Heartbeat.decode(replace(b, round_started=float("nan")).encode())


def test_alignment_is_on_for_factored_only_by_default() -> None:
    assert OuterConfig.for_method("factored").align_rounds
    assert not OuterConfig.for_method("noloco").align_rounds
    assert not OuterConfig.for_method("factored", align_rounds=False).align_rounds


def test_with_defences_one_peer_claiming_an_early_start_is_not_followed() -> None:
    honest = [beat("a", 7, 99.9), beat("b", 7, 99.8)]
    liar = beat("liar", 7, 1.0)  # claims it started long ago: everyone would skip H - 1 steps
    assert late([*honest, liar]) == 9
    robust = steps_late(
        7, 100.0, [*honest, liar], ME, round_s=5.0, step_s=0.5, num_inner_steps=10, robust=True
    )
    assert robust == 0
    # two peers that did start earlier are followed as before
    both = [beat("a", 7, 98.9), beat("b", 7, 98.9), beat("c", 7, 99.9)]
    assert steps_late(7, 100.0, both, ME, round_s=5.0, step_s=0.5, num_inner_steps=10, robust=True) == 2


def _read_back(beats: list[tuple[Signer, Heartbeat]], now: float) -> list[Heartbeat]:
    """`beats` signed, stored, read back and bounded as a view with the defences on sees them."""
    dht = DictDHT()
    for signer, hb in beats:
        records.publish_heartbeat(dht, "run", hb, 30, signer)
    read = [b for b, _ in records.read_heartbeats(dht, "run")]
    return bound_heartbeats(read, 7, now, HeartbeatBounds(), ReplayFilter(forget_after_s=30.0), now - 1)


def _signed(signer: Signer, rnd: int, started: float) -> tuple[Signer, Heartbeat]:
    return signer, replace(beat(signer.peer_id, rnd, started), timestamp=records.now())


SIGNERS = [Signer(SigningKey(bytes([60 + i]) * 32)) for i in range(4)]


def test_a_far_past_start_signed_by_one_peer_among_honest_ones_is_not_followed() -> None:
    now = records.now()
    me, a, b, liar = SIGNERS
    aligner = RoundAligner(me.peer_id, num_inner_steps=10, robust=True)
    aligner.observe(5.0)
    honest = [_signed(a, 7, now - 1.1), _signed(b, 7, now - 0.9)]
    assert aligner.steps_to_skip(7, now, _read_back(honest, now), step_s=0.5) == 1
    for past_s in (3600.0, 10.5):  # an hour ago; just outside two round times
        seen = _read_back([*honest, _signed(liar, 7, now - past_s)], now)
        assert liar.peer_id in {h.peer_id for h in seen}  # signed and admitted: only its claim is bounded
        assert aligner.steps_to_skip(7, now, seen, step_s=0.5) == 1
    # inside the window it moves the median one place: to the earliest honest start, no further
    seen = _read_back([*honest, _signed(liar, 7, now - 9.0)], now)
    assert aligner.steps_to_skip(7, now, seen, step_s=0.5) == 2
    # a claim a round ahead is extrapolated back before it is judged: the same
    seen = _read_back([*honest, _signed(liar, 8, now - 3600.0)], now)
    assert aligner.steps_to_skip(7, now, seen, step_s=0.5) == 1


def test_alone_a_far_past_start_moves_a_peer_a_bounded_amount() -> None:
    now = records.now()
    me, liar = SIGNERS[0], SIGNERS[3]
    aligner = RoundAligner(me.peer_id, num_inner_steps=10, robust=True)
    aligner.observe(5.0)
    far = _read_back([_signed(liar, 7, now - 3600.0)], now)
    assert aligner.steps_to_skip(7, now, far, step_s=0.5) == 0  # outside the window: ignored
    near = _read_back([_signed(liar, 7, now - 9.9)], now)
    assert aligner.steps_to_skip(7, now, near, step_s=0.5) == 2  # a quarter of H, not H - 1
    assert RoundAligner(me.peer_id, 10).steps_to_skip(7, now, near, step_s=0.5) == 0  # no round time yet
    unbounded = RoundAligner(me.peer_id, num_inner_steps=10)
    unbounded.observe(5.0)
    assert unbounded.steps_to_skip(7, now, far, step_s=0.5) == 9  # defences off: as before


def test_an_honest_pair_still_closes_its_drift() -> None:
    # the other peer started 3 s (6 steps) earlier: capped at 2 steps a round, closed in 3 rounds
    assert steps_late(7, 100.0, [beat("a", 7, 97.0)], ME, 5.0, 0.5, 10, robust=True) == 2
    assert steps_late(7, 100.0, [beat("a", 7, 99.0)], ME, 5.0, 0.5, 10, robust=True) == 2
    assert steps_late(7, 100.0, [beat("a", 7, 99.5)], ME, 5.0, 0.5, 10, robust=True) == 1
