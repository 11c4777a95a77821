"""What a validly signed heartbeat may claim: bounds in the view, donor choice, rejoin and join."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from nacl.signing import SigningKey

from bench.fuzz.fakes import DictDHT
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.exchange.interface import Failed
from p2p_trainer.lab.adversary.donor import poisoned_state
from p2p_trainer.net import records
from p2p_trainer.net.donor_check import backed_momentum, bounded_momentum, confirmed_download, round_refusal
from p2p_trainer.net.envelope import Signer
from p2p_trainer.net.records import Heartbeat, RunDefinition, RunDefinitionMismatch
from p2p_trainer.net.state_sync import DonorState
from p2p_trainer.net.view_bounds import HeartbeatBounds, ReplayFilter, bound_heartbeats, median_round
from p2p_trainer.run.entry_paths import StateLossCheck, estimated_round, rejoin_target
from p2p_trainer.train.data import load_corpus
from p2p_trainer.train.trainer import Peer
from tests.conftest import tiny_config

pytestmark = pytest.mark.timeout(30)

NOW = 1_000_000.0
BOUNDS = HeartbeatBounds(round_window=100, clock_skew_s=60.0, max_throughput_tokens_per_s=1e9)


def beat(peer: str, rnd: int = 50, **changes: Any) -> Heartbeat:
    return replace(
        Heartbeat(peer, rnd, 1000, 2.0, 5000.0, "0.1.0", NOW - 1.0, round_started=NOW - 5.0), **changes
    )


def bounded(
    beats: list[Heartbeat], own_round: int = 50, replays: ReplayFilter | None = None
) -> list[Heartbeat]:
    return bound_heartbeats(beats, own_round, NOW, BOUNDS, replays or ReplayFilter(forget_after_s=8.0))


def test_a_forged_huge_round_is_ignored_and_never_becomes_the_rejoin_target() -> None:
    honest = [beat("a", 50), beat("b", 51)]
    liar = beat("liar", 10**9)
    assert [b.peer_id for b in bounded([*honest, liar])] == ["a", "b"]
    # with two peers, one of them lying, the lower median is the honest one
    assert median_round([10**9, 50]) == 50 and median_round([0, 0]) is None
    assert [b.peer_id for b in bounded([beat("a", 50), liar], own_round=0)] == ["a"]
    # without the bound the liar's round is what a rejoining peer would head for
    liars = [liar, beat("l2", 10**9), beat("l3", 10**9)]
    assert rejoin_target(40, [b.round for b in [*honest, *liars]], lag_rounds=3) == 10**9
    assert rejoin_target(40, [b.round for b in bounded([*honest, *liars], own_round=40)], 3) == 50


def test_round_starts_and_timestamps_ahead_of_the_clock_are_not_believed() -> None:
    kept = {b.peer_id: b for b in bounded([beat("a"), beat("future", round_started=NOW + 3600)])}
    assert kept["future"].round_started == 0.0 and kept["a"].round_started == NOW - 5.0
    after_stamp = beat("b", timestamp=NOW - 100.0, round_started=NOW - 10.0)  # started after it said so
    assert bounded([after_stamp])[0].round_started == 0.0
    assert bounded([beat("c", timestamp=NOW + 3600)]) == []


def test_absurd_throughputs_are_ignored_and_never_overflow_the_rejoin_estimate() -> None:
    assert bounded([beat("a"), beat("fast", throughput_tokens_per_s=1e300)]) == [beat("a")]
    # an old heartbeat claiming 1e300 tokens/s: int(inf) used to raise OverflowError here
    old = beat("fast", throughput_tokens_per_s=1e308, timestamp=1.0)
    assert estimated_round(old, NOW, tokens_per_round=4096) == old.round
    assert estimated_round(replace(old, throughput_tokens_per_s=1e300), NOW, 4096) == old.round + 10**9
    assert estimated_round(beat("a", throughput_tokens_per_s=1e12), NOW, 1) == 50 + 10**9


def test_a_replayed_older_heartbeat_or_tombstone_is_ignored() -> None:
    replays = ReplayFilter(forget_after_s=8.0)
    newer = beat("a", timestamp=NOW - 1.0)
    assert bounded([newer], replays=replays) == [newer]
    old_tombstone = beat("a", timestamp=NOW - 3.0, leaving=True)
    assert bounded([old_tombstone], replays=replays) == [newer]
    # a peer that publishes again after its real tombstone is back
    tombstone = beat("a", timestamp=NOW - 0.5, leaving=True)
    assert bounded([tombstone], replays=replays) == [tombstone]


def state(rnd: int, scale: float = 1.0, digest: str = "h") -> DonorState:
    return DonorState(anchor=[torch.full((4,), scale)], momentum=[torch.zeros(4)], round=rnd, sha256=digest)


def test_a_joiner_refuses_donor_rounds_past_the_end_or_far_above_the_median() -> None:
    assert round_refusal(10**9, 50, last_round=200, window=100) is not None
    assert round_refusal(200, 50, last_round=200, window=100) is not None
    assert round_refusal(151, 50, last_round=1000, window=100) is not None
    assert round_refusal(60, 50, last_round=200, window=100) is None
    served = {"liar": state(10**9), "a": state(50)}
    got = confirmed_download(
        ["liar", "a"],
        lambda d: served[d],
        lambda d: (served[d].round, served[d].sha256),
        lambda rnd: round_refusal(rnd, 50, 200, 100),
        tolerance=0.05,
    )
    assert not isinstance(got, list) and got[1] == "a"


def test_a_second_donor_confirms_the_state_and_a_poisoned_one_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    served = {"a": state(50, digest="x"), "b": state(50, 1.01, "y"), "poison": state(50, 1e3, "z")}
    headers: list[str] = []

    def header(donor: str) -> tuple[int, str]:
        headers.append(donor)
        return served[donor].round, served[donor].sha256

    def run(order: list[str]) -> tuple[DonorState, str] | list[str]:
        return confirmed_download(order, lambda d: served[d], header, lambda rnd: None, tolerance=0.05)

    got = run(["poison", "a", "b"])
    assert not isinstance(got, list) and got[1] == "a"  # poison disputed by a; a confirmed by b
    assert headers[0] == "a"
    got = run(["a", "poison", "b"])
    assert (
        not isinstance(got, list) and got[1] == "b"
    )  # a disputed by poison; poison refused by b; b confirmed
    assert isinstance(run(["a", "poison"]), list)  # two that disagree and no third: adopt neither
    with caplog.at_level("WARNING"):
        got = run(["a"])
    assert not isinstance(got, list) and "no second donor was available" in caplog.text
    same = {"a": state(50, digest="x"), "b": state(50, digest="x")}
    downloads: list[str] = []

    def download(d: str) -> DonorState | Failed:
        downloads.append(d)
        return same[d]

    got = confirmed_download(["a", "b"], download, lambda d: (50, "x"), lambda rnd: None, 0.05)
    assert not isinstance(got, list) and downloads == ["a"]  # the hash alone confirmed it


def test_a_joiner_takes_no_outer_momentum_larger_than_a_second_donor_backs() -> None:
    """An honest φ with m scaled a thousandfold passes the loss check and the distance of φ; the
    joiner's first outer step would then move φ by hundreds of times its norm."""
    honest_m, poisoned_m = torch.full((4,), 0.01), torch.full((4,), 10.0)

    def with_m(m: torch.Tensor, digest: str, scale: float = 1.0) -> DonorState:
        return replace(state(50, scale, digest), momentum=[m.clone()])

    def run(served: dict[str, DonorState], order: list[str]) -> DonorState:
        got = confirmed_download(
            order,
            lambda d: replace(served[d], momentum=[m.clone() for m in served[d].momentum]),
            lambda d: (served[d].round, served[d].sha256),
            lambda rnd: None,
            tolerance=0.05,
        )
        assert not isinstance(got, list), got
        assert got[1] == order[0]  # φ agrees: the first donor's state is adopted ...
        return got[0]

    # ... with the witness's momentum where the donor's is larger, and its own where it is smaller
    served = {"liar": with_m(poisoned_m, "p"), "a": with_m(honest_m, "x", 1.01)}
    assert torch.equal(run(served, ["liar", "a"]).momentum[0], honest_m)
    assert torch.equal(run(served, ["a", "liar"]).momentum[0], honest_m)
    smaller = {"liar": with_m(-0.5 * honest_m, "p"), "a": with_m(honest_m, "x", 1.01)}
    assert torch.equal(run(smaller, ["a", "liar"]).momentum[0], -0.5 * honest_m)
    # the same hash: the same state, momentum included
    same = {"a": with_m(honest_m, "x"), "b": with_m(honest_m, "x")}
    assert torch.equal(run(same, ["a", "b"]).momentum[0], honest_m)
    # nobody to back it: none
    assert torch.equal(run({"liar": with_m(poisoned_m, "p")}, ["liar"]).momentum[0], torch.zeros(4))


def test_a_momentum_is_taken_only_up_to_the_norm_of_the_one_that_backs_it() -> None:
    honest, big = [torch.full((3,), 0.1)], [torch.full((3,), 50.0)]
    nan, inf = [torch.tensor([0.1, float("nan"), 0.1])], [torch.full((3,), float("inf"))]
    assert backed_momentum(big, honest) is honest and backed_momentum(honest, big) is honest
    assert backed_momentum(nan, honest) is honest and backed_momentum(honest, nan) is honest
    assert backed_momentum(inf, honest) is honest
    none = backed_momentum(nan, inf)
    assert torch.equal(none[0], torch.zeros(3))


def test_a_rejoining_peer_takes_a_donors_momentum_whole_up_to_a_few_times_its_own() -> None:
    own, swarm = [torch.full((3,), 0.1)], [torch.full((3,), 0.12)]
    assert bounded_momentum(swarm, own) is swarm  # the swarm's m as it is, though larger than its own
    cut = bounded_momentum([torch.full((3,), 100.0)], own, ratio=4.0)
    torch.testing.assert_close(cut[0], torch.full((3,), 0.4))  # a liar's: 4 x its own norm, same way
    nan = bounded_momentum([torch.tensor([1.0, float("nan"), 1.0])], own)
    assert torch.equal(nan[0], torch.zeros(3))


def test_a_donor_state_that_fails_its_contents_check_is_refused_even_when_confirmed() -> None:
    # a forger alone in sight, or two that serve the same poison: a plausible round and agreeing
    # hashes do not make a state that was never trained from the run's model
    served = {"f1": state(5, -10.0, "p"), "f2": state(5, -10.0, "p"), "a": state(5, digest="x")}
    checked: list[str] = []

    def contents(got: DonorState, donor: str) -> str | None:
        checked.append(donor)
        return "its loss is too high" if float(got.anchor[0][0]) < 0 else None

    def run(order: list[str]) -> tuple[DonorState, str] | list[str]:
        return confirmed_download(
            order, lambda d: served[d], lambda d: (5, served[d].sha256), lambda rnd: None, 0.05, contents
        )

    refused = run(["f1"])
    assert isinstance(refused, list) and "its loss is too high" in refused[0]
    assert isinstance(run(["f1", "f2"]), list)  # f2 would confirm f1's hash: both refused anyway
    got = run(["f1", "f2", "a"])
    assert not isinstance(got, list) and got[1] == "a"
    assert checked == ["f1", "f1", "f2", "f1", "f2", "a"]


def test_a_joiner_refuses_a_state_that_predicts_its_validation_data_worse_than_its_own() -> None:
    cfg = tiny_config("diloco", rounds=4)
    corpus = load_corpus(cfg.data, cfg.model.seq_len)
    trained = Peer(cfg, InProcessSwarm(1, cfg.seed).exchange(0), corpus, "p0")
    trained.train(2)
    joiner = Peer(cfg, InProcessSwarm(1, cfg.seed).exchange(0), corpus, "p1")
    check = StateLossCheck(joiner, margin=0.25)
    honest = DonorState(
        anchor=[a.clone() for a in trained.state.anchor],
        momentum=[m.clone() for m in trained.state.momentum],
        round=trained.state.round,
    )
    poison = poisoned_state(cfg, 2)
    assert check(honest, "honest") is None
    why = check(DonorState(anchor=poison.anchor, momentum=poison.momentum, round=2), "forger")
    assert why is not None and "security.donor_loss_margin" in why
    assert check.refused == {"forger"}
    # the check leaves the joiner's own weights as they were
    assert all(torch.equal(p, a) for p, a in zip(joiner.params, joiner.state.anchor, strict=True))


SIGNERS = [Signer(SigningKey(bytes([40 + i]) * 32)) for i in range(4)]
OURS = RunDefinition({"method": "factored", "seed": 0})
OTHER = RunDefinition({"method": "diloco", "seed": 0})


def live(dht: DictDHT, signer: Signer) -> None:
    hb = Heartbeat(signer.peer_id, 1, 0, None, 0.0, "0.1.0", records.now())
    records.publish_heartbeat(dht, "run", hb, 30, signer)


def publish_definition(dht: DictDHT, signer: Signer, definition: RunDefinition) -> None:
    """Store a definition without the publisher's own check (a forger skips it)."""
    key, expiration = records.run_definition_key("run"), records.now() + 30
    dht.store(
        key, signer.seal(key, signer.peer_id, expiration, definition.encode()), expiration, signer.peer_id
    )


def test_a_forged_run_definition_does_not_lock_out_joiners(caplog: pytest.LogCaptureFixture) -> None:
    honest, forger, joiner, late = SIGNERS
    dht = DictDHT()
    records.check_run_definition(dht, "run", OURS, 30, honest)
    publish_definition(dht, forger, OTHER)
    for signer in (honest, forger):
        live(dht, signer)
    with caplog.at_level("INFO", logger=records.__name__):
        records.check_run_definition(dht, "run", OURS, 30, joiner)
    assert "1 peer(s) of run 'run' publish another run definition; joining" in caplog.text
    assert set(records.read_definitions(dht, "run")) == {honest.peer_id, forger.peer_id, joiner.peer_id}
    # a swarm whose live peers all publish another definition refuses, listing the fields
    theirs = DictDHT()
    publish_definition(theirs, forger, OTHER)
    records.check_run_definition(theirs, "run", OURS, 30, late)  # not live: its definition does not count
    live(theirs, forger)
    with pytest.raises(RunDefinitionMismatch, match=r"method: ours='factored', swarm's='diloco'"):
        records.check_run_definition(theirs, "run", OURS, 30, joiner)
    # with the defences off, any well-formed definition counts, live or not
    stale = DictDHT()
    publish_definition(stale, forger, OTHER)
    with pytest.raises(RunDefinitionMismatch):
        records.check_run_definition(stale, "run", OURS, 30, joiner, verify=False)


def test_with_defences_off_forged_records_are_read_as_today() -> None:
    victim, forger = SIGNERS[0], SIGNERS[1]
    dht, key = DictDHT(), records.heartbeat_key("run")
    forged = Heartbeat(victim.peer_id, 10**9, 0, None, 1e300, "0.1.0", records.now(), leaving=True)
    expiration = records.now() + 30
    dht.store(key, forger.seal(key, victim.peer_id, expiration, forged.encode()), expiration, victim.peer_id)
    assert records.read_heartbeats(dht, "run") == []  # checked: the forger does not own that subkey
    assert [b for b, _ in records.read_heartbeats(dht, "run", verify=False)] == [forged]


class FakeNode(DictDHT):
    """The parts of NetNode a SwarmView uses."""

    def __init__(self, signer: Signer) -> None:
        super().__init__()
        self.signer, self.peer_id = signer, signer.peer_id

    def bootstrap_ids(self) -> list[str]:
        return []

    def ping_peers(self, peer_ids: list[str], timeout_s: float = 10.0) -> int:
        return 0


@pytest.mark.parametrize("defences", [True, False])
def test_the_view_hides_a_signed_but_implausible_heartbeat_only_with_defences(defences: bool) -> None:
    from p2p_trainer.config import SecurityConfig
    from p2p_trainer.net.swarm_view import SwarmView

    me, honest, liar = SIGNERS[:3]
    node = FakeNode(me)
    for signer, rnd, throughput in ((honest, 50, 5000.0), (liar, 10**9, 1e300)):
        hb = Heartbeat(signer.peer_id, rnd, 0, None, throughput, "0.1.0", records.now())
        records.publish_heartbeat(node, "run", hb, 30, signer)
    view = SwarmView(node, "run", period_s=60.0, ttl_s=8.0, security=SecurityConfig(defences=defences))  # type: ignore[arg-type]
    try:
        seen = {h.peer_id for h in view.heartbeats()}
        assert (liar.peer_id in seen) is not defences
        assert {me.peer_id, honest.peer_id} <= seen
    finally:
        view.close()


def test_a_peer_heard_from_stays_out_of_the_view_while_its_heartbeat_is_refused() -> None:
    # at a swarm's start no peer has trained yet, so the median cannot judge a forged round; the
    # run's last round can, the same way on every peer, and a send to the forger (it was drawn
    # into a group before) does not bring it back
    from p2p_trainer.config import SecurityConfig
    from p2p_trainer.net.swarm_view import SwarmView

    me, honest, liar = SIGNERS[:3]
    node = FakeNode(me)
    for signer, rnd in ((honest, 0), (liar, 10**9)):
        hb = Heartbeat(signer.peer_id, rnd, 0, None, 5000.0, "0.1.0", records.now())
        records.publish_heartbeat(node, "run", hb, 30, signer)
    views = {
        last: SwarmView(node, "run", 60.0, 8.0, SecurityConfig(), last_round=last)  # type: ignore[arg-type]
        for last in (None, 30)
    }
    try:
        for view in views.values():
            view.hear_from(lambda _s: {liar.peer_id, honest.peer_id})
        assert liar.peer_id in views[None].live_peers()  # the median alone lets it through at round 0
        assert views[30].live_peers() == sorted([me.peer_id, honest.peer_id])
    finally:
        for view in views.values():
            view.close()


def test_a_round_past_the_runs_last_is_refused_whatever_the_median() -> None:
    last = replace(BOUNDS, last_round=200)
    joiners = [beat("a", 0, round_started=0.0), beat("b", 0, round_started=0.0)]
    for beats, own in (([*joiners, beat("liar", 201)], 0), ([beat("a", 150), beat("liar", 201)], 150)):
        kept = bound_heartbeats(beats, own, NOW, last, ReplayFilter(8.0))
        assert "liar" not in {b.peer_id for b in kept} and len(kept) == len(beats) - 1
    finishing = bound_heartbeats([beat("a", 200)], 199, NOW, last, ReplayFilter(8.0))
    assert [b.round for b in finishing] == [200]  # a peer in its last round is honest


def test_at_a_swarms_start_a_forged_round_below_the_end_is_outside_the_window() -> None:
    # every honest peer trains round 0 (its start is known); the forger claims round 150 of 200
    training = beat("a", 0, round_started=NOW - 5.0)
    liar = beat("liar", 150, round_started=NOW - 5.0)
    assert [b.peer_id for b in bounded([training, liar], own_round=0)] == ["a"]  # a joiner's view
    own = bound_heartbeats([liar], 0, NOW, BOUNDS, ReplayFilter(8.0), own_started=NOW - 5.0)
    assert own == []  # the honest peer alone with the forger, training round 0
    assert [b.peer_id for b in bounded([beat("a", 2), liar], own_round=2)] == ["a"]
    # joiners (round 0, no start) still do not drag a running swarm's median down
    joiners = [beat(f"j{i}", 0, round_started=0.0) for i in range(3)]
    assert len(bounded([*joiners, beat("a", 500)], own_round=0)) == 4
    # and a round within the window of the training peers still passes
    assert len(bounded([training, beat("b", 90)], own_round=0)) == 2


def test_this_peers_own_heartbeat_does_not_count_twice_in_the_median() -> None:
    # a peer that fell 130 rounds behind two honest peers: its round is one of three, not two of
    # four, so the others' rounds are the median and their heartbeats stay (it can rejoin them)
    beats = [beat("me", 126), beat("a", 257), beat("b", 258)]
    kept = bound_heartbeats(beats, 126, NOW, BOUNDS, ReplayFilter(forget_after_s=8.0), NOW - 5.0, "me")
    assert [b.peer_id for b in kept] == ["a", "b", "me"]
    counted_twice = bound_heartbeats(beats, 126, NOW, BOUNDS, ReplayFilter(forget_after_s=8.0), NOW - 5.0)
    assert [b.peer_id for b in counted_twice] == ["me"]
    # a liar is still one voice: two honest peers and this one keep the median honest
    liar = [beat("me", 50), beat("a", 50), beat("liar", 10**9)]
    kept = bound_heartbeats(liar, 50, NOW, BOUNDS, ReplayFilter(forget_after_s=8.0), NOW - 5.0, "me")
    assert [b.peer_id for b in kept] == ["a", "me"]


@pytest.mark.parametrize("stopped", [True, False])
def test_a_peer_stopped_for_its_time_bound_judges_no_round_by_its_own(stopped: bool) -> None:
    """net/entry.py: the last peer still training trains alone at full speed, far past the round
    where the others stopped; neither a stopped peer's heartbeat nor the own round of a view in its
    last round (or stopped there) may make its heartbeat look implausible, or the final
    agreement's member lists differ."""
    from p2p_trainer.config import SecurityConfig
    from p2p_trainer.net.swarm_view import SwarmView

    me, other_stopped, trainer = SIGNERS[:3]
    node = FakeNode(me)
    now = records.now()
    for signer, rnd, leaves in ((other_stopped, 200, 201), (trainer, 450, 0)):
        hb = Heartbeat(signer.peer_id, rnd, 0, None, 5000.0, "0.1.0", now, round_started=now - 1)
        records.publish_heartbeat(node, "run", replace(hb, leaves_round=leaves), 30, signer)
    view = SwarmView(node, "run", period_s=60.0, ttl_s=8.0, security=SecurityConfig(round_window=100))  # type: ignore[arg-type]
    try:
        view.enter_round(299)
        if stopped:
            view.leave_groups_at(300)
        view._refresh()
        seen = {h.peer_id for h in view.heartbeats()}
        # stopped: the median is the trainer's own round; training at 299, this peer's round is
        # the lower median of 299 and 450, and 450 is over 100 rounds past it
        assert (trainer.peer_id in seen) is stopped
        assert other_stopped.peer_id in seen
    finally:
        view.close()
