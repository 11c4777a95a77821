"""Agreed exclusion (`net/exclusion.py`, docs/algorithms.md §10): votes, ballots and strikes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from p2p_trainer.net import records
from p2p_trainer.net.exclusion import MAX_SPAN_ROUNDS, SPAN_ROUNDS, Ballot, rounds_ahead, voted_out
from p2p_trainer.net.records import Heartbeat, RecordError
from p2p_trainer.net.robust import Penalties

A, B, C, D, LIAR = ("12D3KooWAaaa", "12D3KooWBbbb", "12D3KooWCccc", "12D3KooWDddd", "12D3KooWLiar")


def beat(peer: str, *votes: tuple[str, int, int]) -> Heartbeat:
    return Heartbeat(peer, 10, 0, None, 0.0, "0.1.0", 1.0, excludes=tuple(votes))


def test_one_vote_is_not_enough_and_two_are() -> None:
    beats = [beat(A, (LIAR, 5, 13)), beat(B), beat(C), beat(LIAR)]
    assert voted_out(beats, 6) == set()
    beats[1] = beat(B, (LIAR, 7, 15))
    assert voted_out(beats, 6) == set()  # B's vote covers round 7 on
    assert voted_out(beats, 7) == voted_out(beats, 12) == {LIAR}
    assert voted_out(beats, 13) == set()  # A's vote ended: one left


def test_a_peer_cannot_vote_itself_out_and_its_repeated_name_counts_once() -> None:
    beats = [beat(A, (A, 0, 9), (B, 0, 9), (B, 0, 9)), beat(B), beat(C)]
    assert voted_out(beats, 3) == set()


def test_a_voted_out_liars_votes_do_not_count() -> None:
    """The liar and one honest peer that penalised C once are two votes against C; the liar is out
    by the honest peers' votes, so C is not."""
    beats = [
        beat(A, (LIAR, 0, 20), (C, 0, 20)),
        beat(B, (LIAR, 0, 20)),
        beat(C, (LIAR, 0, 20)),
        beat(LIAR, (A, 0, 20), (B, 0, 20), (C, 0, 20)),
    ]
    assert voted_out(beats, 4) == {LIAR}


def test_this_peers_own_votes_are_its_ballot_not_its_heartbeat_read_back() -> None:
    beats = [beat(A, (LIAR, 0, 20)), beat(B, (LIAR, 0, 20)), beat(LIAR)]  # B's read-back copy
    assert voted_out(beats, 4, own=(), me=B) == set()
    assert voted_out([beat(A, (LIAR, 0, 20)), beat(LIAR)], 4, own=[(LIAR, 0, 20)], me=B) == {LIAR}


def test_a_ballot_never_changes_a_round_before_the_one_it_is_asked_for() -> None:
    ballot = Ballot()
    assert ballot.vote(LIAR, 10) == (LIAR, 10, 10 + SPAN_ROUNDS)
    # an offence while the vote is ahead or running: the start stays, the end moves out by its span
    assert ballot.vote(LIAR, 14) == (LIAR, 10, 14 + SPAN_ROUNDS)
    assert ballot.vote(LIAR, 11) == (LIAR, 10, 14 + SPAN_ROUNDS)  # never shortened
    # named ahead past the vote's end (at round 15, say): rounds 15..21 stay covered, the gap
    # before the new range stays open, and the new range is as long as the last
    assert ballot.vote(LIAR, 30) == (LIAR, 30, 30 + SPAN_ROUNDS)
    assert ballot.votes(15) == ((LIAR, 10, 14 + SPAN_ROUNDS), (LIAR, 30, 30 + SPAN_ROUNDS))
    assert voted_out([beat(A, (LIAR, 0, 99)), beat(LIAR)], 15, ballot.votes(15), me=B) == {LIAR}
    assert voted_out([beat(A, (LIAR, 0, 99)), beat(LIAR)], 25, ballot.votes(15), me=B) == set()
    assert ballot.votes(14 + SPAN_ROUNDS) == ((LIAR, 30, 30 + SPAN_ROUNDS),)  # the first ended
    assert ballot.votes(30 + SPAN_ROUNDS) == ()  # over: no longer published
    # a new vote once none is published lasts twice as long, and the next twice that
    assert ballot.vote(LIAR, 100) == (LIAR, 100, 100 + 2 * SPAN_ROUNDS)
    assert ballot.votes(100 + 2 * SPAN_ROUNDS) == ()
    assert ballot.vote(LIAR, 200) == (LIAR, 200, 200 + 4 * SPAN_ROUNDS)
    spans = []
    for i in range(1, 30):  # each vote over before the next: doubling, up to the bound
        ballot.votes(i * 10**4)
        last = ballot.vote(A, i * 10**4)
        assert last is not None
        spans.append(last[2] - last[1])
    assert (
        spans[:3] == [SPAN_ROUNDS, 2 * SPAN_ROUNDS, 4 * SPAN_ROUNDS]
        and max(spans) == spans[-1] == MAX_SPAN_ROUNDS
    )


def test_a_full_ballot_casts_no_new_vote_and_keeps_those_in_force() -> None:
    ballot = Ballot()
    peers = [f"12D3KooW{'abcdefghijk'[i]}" for i in range(records.MAX_EXCLUDES + 1)]
    for i, peer in enumerate(peers[:-1]):
        assert ballot.vote(peer, i) is not None
    assert ballot.vote(peers[-1], 3) is None
    assert {v[0] for v in ballot.votes(0)} == set(peers[:-1])
    assert ballot.vote(peers[0], 5) == (peers[0], 0, 5 + SPAN_ROUNDS)  # extending one still works


def test_a_withdrawn_vote_is_cut_at_the_round_named_ahead() -> None:
    ballot = Ballot()
    ballot.vote(LIAR, 10)
    ballot.vote(A, 40)
    ballot.withdraw([LIAR, A], 15)
    assert ballot.votes(0) == ((LIAR, 10, 15),)  # A's vote had not started: gone


def test_rounds_ahead_cover_the_heartbeats_lag() -> None:
    assert rounds_ahead(2.0, 0.5, 2.5) == 11  # 5 s of 0.5 s rounds, and the round under way
    assert rounds_ahead(2.0, 60.0, 2.5) == 2
    assert rounds_ahead(2.0, 0.0, 2.5) is None and rounds_ahead(2.0, float("nan"), 2.5) is None
    assert rounds_ahead(2.0, 1e-9, 2.5) == MAX_SPAN_ROUNDS


def test_strikes_single_out_a_repeat_offender() -> None:
    clock = [0.0]
    ledger = Penalties(6.0, lambda: clock[0])
    heard: list[tuple[str, float]] = []
    ledger.listen(lambda peer, strikes: heard.append((peer, strikes)))
    ledger.offend(A, "once")
    clock[0] = 90.0  # 15 half-lives of the penalty, nearly 4 of the strikes
    ledger.offend(A, "long after")
    ledger.offend(LIAR, "first")
    clock[0] = 100.0
    ledger.offend(LIAR, "ten exchanges later")
    assert [p for p, _ in heard] == [A, A, LIAR, LIAR]
    assert heard[0][1] == 1.0 and heard[1][1] < 1.1
    assert heard[3][1] == pytest.approx(1.0 + 0.5 ** (10 / 24))
    ledger.forgive([LIAR])
    assert ledger.strikes(LIAR) == 0.0


def test_votes_round_trip_and_bad_ones_are_refused() -> None:
    votes = ((LIAR, 3, 11), (A, 0, records.MAX_STEPS - 1))
    assert Heartbeat.decode(beat(B, *votes).encode()).excludes == votes
    assert "excludes" not in records.unpack(beat(B).encode())  # no votes: no field
    fields = records.unpack(beat(B).encode())
    for bad in (
        [[LIAR, 5, 5]],
        [[LIAR, 6, 5]],
        [[LIAR, -1, 5]],
        [[LIAR, 0, records.MAX_STEPS]],
        [[LIAR, True, 5]],
        [[LIAR, 0.0, 5]],
        [["not base58 0OIl", 0, 5]],
        [[LIAR, 0]],
        [LIAR],
        LIAR,
        [[LIAR, 0, 5]] * (records.MAX_EXCLUDES + 1),
    ):
        with pytest.raises(RecordError, match="excludes"):
            Heartbeat.decode(records.pack({**fields, "excludes": bad}))


def test_the_largest_heartbeat_with_votes_fits_a_record() -> None:
    big = replace(
        beat(
            B, *[(f"12D3KooW{'x' * 44}", records.MAX_STEPS - 3, records.MAX_STEPS - 2)] * records.MAX_EXCLUDES
        ),
        suspects=(f"12D3KooW{'y' * 44}",) * records.MAX_SUSPECTS,
        invitation="i" * records.MAX_INVITATION_CHARS,
        software_version="v" * 128,
        data_address="1" * 60,
    )
    assert len(big.encode()) < records.MAX_RECORD_BYTES


def test_a_peer_struck_enough_for_a_vote_is_left_out_of_the_final_agreement_too() -> None:
    """Voted out, a liar is met too rarely to reach the final agreement's three offences; its
    strikes carry it into the final ledger instead. One offence carries nobody."""
    clock = [0.0]
    ledger = Penalties(6.0, lambda: clock[0])
    ledger.offend(LIAR, "first")
    clock[0] = 8.0
    ledger.offend(LIAR, "second, within four half-lives")
    ledger.offend(A, "a noisy round")
    clock[0] = 200.0  # both penalties long decayed
    assert not ledger.excluded(LIAR) and not ledger.excluded(A)
    final = ledger.carried(3, 1.5)
    assert final.excluded(LIAR) and not final.excluded(A)
    assert not ledger.carried(3).excluded(LIAR)  # by offences alone it would be in
