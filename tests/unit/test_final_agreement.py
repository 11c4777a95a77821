"""The final agreement: every peer that takes part ends with the plain mean of the anchors; one that
cannot meet the others keeps its own model; method independent never takes part."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import cast

import pytest
import torch

from p2p_trainer.config import ExchangeConfig, RunConfig
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.exchange.interface import ALL
from p2p_trainer.net.network_exchange import NetworkExchange
from p2p_trainer.net.records import Heartbeat
from p2p_trainer.net.robust import Penalties
from p2p_trainer.net.transport import Transport
from p2p_trainer.round_log import ExchangeRecord
from p2p_trainer.run.final_agreement import (
    EARLY_WEIGHT,
    FINAL_TAG,
    POLL_S,
    agree,
    final_request,
    final_weight,
    keep_the_better,
    training_on,
    wait_for_the_others,
    wants_final_agreement,
)
from p2p_trainer.train.data import load_corpus
from p2p_trainer.train.trainer import Peer
from tests.conftest import tiny_config
from tests.unit.fake_exchanges import LoopTransport


def _peers(cfg: RunConfig, n: int, mid_round: bool = True) -> list[Peer]:
    """n peers whose anchors differ (peer i's is shifted by i) and whose θ is a step past φ
    (`mid_round`) or equal to it (at a round's end)."""
    swarm = InProcessSwarm(n, cfg.seed)
    corpus = load_corpus(cfg.data, cfg.model.seq_len)
    peers = [Peer(cfg, swarm.exchange(i), corpus, peer_key=f"peer{i}") for i in range(n)]
    for i, peer in enumerate(peers):
        peer.state.anchor = [a + 0.1 * i for a in peer.state.anchor]
        with torch.no_grad():
            for p, a in zip(peer.params, peer.state.anchor, strict=True):
                p.copy_(a + 0.01 if mid_round else a)
    return peers


def _agree_all(peers: list[Peer], cfg: RunConfig) -> list[ExchangeRecord]:
    records: list[ExchangeRecord | None] = [None] * len(peers)

    def run(i: int) -> None:
        records[i] = agree(peers[i], final_request(cfg), lambda: False)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(peers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(r is not None for r in records)
    return [r for r in records if r is not None]


def _beat(peer: str, rnd: int, leaves: int = 0) -> Heartbeat:
    return dataclasses.replace(Heartbeat(peer, rnd, 0, None, 0.0, "0.1.0", 0.0), leaves_round=leaves)


def test_the_peers_training_on_are_those_short_of_their_last_round() -> None:
    last = 100_000
    beats = [
        _beat("me", 299),
        _beat("b", 310),  # no stop named
        _beat("c", 310, leaves=320),  # a stop named, not there yet
        _beat("d", 319, leaves=320),  # in its last round
        _beat("e", last - 1),  # in the run's last round
    ]
    assert training_on(beats, "me", last) == ["b", "c"]


def test_a_peer_that_stopped_while_others_trained_on_counts_little_in_the_final_mean() -> None:
    assert final_weight(0.0, stale_s=8.0) == 1.0
    assert final_weight(7.9, stale_s=8.0) == 1.0  # stopped with the others, give or take a view's lag
    assert final_weight(8.0, stale_s=8.0) == EARLY_WEIGHT
    # it waits for the others to stop, and for no longer than its limit
    views = iter([[_beat("b", 310)], [_beat("b", 310)], [_beat("b", 319, leaves=320)]])
    t0 = time.monotonic()
    assert wait_for_the_others(lambda: next(views), "me", 100_000, 30.0, lambda: False) < 5.0
    assert time.monotonic() - t0 >= 2 * POLL_S
    waited = wait_for_the_others(lambda: [_beat("b", 310)], "me", 100_000, 0.5, lambda: False)
    assert 0.5 <= waited < 2.0
    assert wait_for_the_others(lambda: [_beat("b", 310)], "me", 100_000, 30.0, lambda: True) < 1.0


def test_the_final_mean_weights_each_peer_as_it_asks() -> None:
    cfg = tiny_config("diloco", rounds=2)
    peers = _peers(cfg, 3)
    weights = [EARLY_WEIGHT, 1.0, 1.0]
    anchors = [[a.clone() for a in p.state.anchor] for p in peers]
    records: list[ExchangeRecord | None] = [None] * 3

    def run(i: int) -> None:
        records[i] = agree(peers[i], final_request(cfg, weight=weights[i]), lambda: False)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(r is not None and r.ok for r in records), records
    total = sum(weights)
    for k, mine in enumerate(peers[0].state.anchor):
        expected = sum(w * a[k] for w, a in zip(weights, anchors, strict=True)) / total
        torch.testing.assert_close(mine, expected, atol=1e-6, rtol=1e-5)
        # the early peer's older model barely moves the others' (peer i's anchor is shifted by i)
        assert (mine - (anchors[1][k] + anchors[2][k]) / 2).abs().max() < 0.01
        for p in peers[1:]:
            torch.testing.assert_close(p.state.anchor[k], mine)


def test_on_for_communicating_methods_off_for_independent() -> None:
    for method in ("diloco", "noloco", "factored", "data-parallel"):
        assert wants_final_agreement(tiny_config(method, rounds=2)), method
    assert not wants_final_agreement(tiny_config("independent", rounds=2))
    off = dataclasses.replace(tiny_config("diloco", rounds=2), exchange=ExchangeConfig(final_agreement=False))
    assert not wants_final_agreement(off)


def test_the_request_meets_on_the_configured_rounds_with_everyone_in_float32() -> None:
    cfg = tiny_config("factored", rounds=7, wire_dtype="float16", final_wait_s=12.0)
    req = final_request(cfg)
    assert (req.tag, req.round, req.group_size) == (FINAL_TAG, 7, ALL)
    assert req.quorum_fraction == 1.0 and req.weight == 1.0
    assert req.codec.name == req.results.name == "float32"
    assert req.quorum_wait_s == 12.0 and req.timeout_s == 12.0 + cfg.exchange.timeout_s


def test_every_peer_ends_with_the_mean_of_the_anchors() -> None:
    cfg = tiny_config("diloco", rounds=3)
    peers = _peers(cfg, 3)
    before = [list(p.state.anchor) for p in peers]
    offsets = [
        [p.detach() - a for p, a in zip(peer.params, peer.state.anchor, strict=True)] for peer in peers
    ]
    mean = [torch.stack(ts).mean(0) for ts in zip(*before, strict=True)]
    records = _agree_all(peers, cfg)
    assert all(r.ok and r.merged and r.group_size == 3 and r.tag == FINAL_TAG for r in records)
    for peer, offset in zip(peers, offsets, strict=True):
        for a, m in zip(peer.state.anchor, mean, strict=True):
            torch.testing.assert_close(a, m)
        # θ moved with φ: the steps since the last round are kept
        for p, a, o in zip(peer.params, peer.state.anchor, offset, strict=True):
            torch.testing.assert_close(p.detach() - a, o, atol=1e-6, rtol=0)
    assert not torch.equal(before[0][0], before[1][0])  # the test averaged different models


def test_at_a_rounds_end_the_model_is_exactly_the_consensus() -> None:
    cfg = tiny_config("noloco", rounds=3)
    peers = _peers(cfg, 2, mid_round=False)
    _agree_all(peers, cfg)
    for peer in peers:
        assert all(torch.equal(p.detach(), a) for p, a in zip(peer.params, peer.state.anchor, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(peers[0].state.anchor, peers[1].state.anchor, strict=True))


def test_a_peer_that_meets_no_one_keeps_its_own_model() -> None:
    cfg = tiny_config("diloco", rounds=3, final_wait_s=0.5, timeout_s=1.0)
    peer = _peers(cfg, 2)[1]  # peer0 never comes
    anchor, params = list(peer.state.anchor), [p.detach().clone() for p in peer.params]
    t0 = time.monotonic()
    record = agree(peer, final_request(cfg), lambda: False)
    assert time.monotonic() - t0 < 5.0, "the wait is bounded"
    assert not record.ok and record.reason
    assert all(torch.equal(a, b) for a, b in zip(peer.state.anchor, anchor, strict=True))
    assert all(torch.equal(p, q) for p, q in zip(peer.params, params, strict=True))


def test_a_stop_request_ends_the_wait() -> None:
    cfg = tiny_config("diloco", rounds=3, final_wait_s=60.0)
    peer = _peers(cfg, 2)[0]
    anchor = list(peer.state.anchor)
    t0 = time.monotonic()
    record = agree(peer, final_request(cfg), lambda: time.monotonic() - t0 > 0.3)
    assert time.monotonic() - t0 < 5.0 and not record.ok and "stop" in record.reason
    assert all(torch.equal(a, b) for a, b in zip(peer.state.anchor, anchor, strict=True))


def test_final_wait_must_be_positive() -> None:
    from p2p_trainer.config import ConfigError

    with pytest.raises(ConfigError, match="final_wait_s"):
        ExchangeConfig(final_wait_s=0.0)


def test_the_final_exchange_bounds_models_against_the_seeds_and_refuses_a_reversed_one() -> None:
    from p2p_trainer.config import SecurityConfig
    from p2p_trainer.net.robust import Defence, Penalties, Scale, check_contribution, check_result
    from p2p_trainer.train.model import build_model

    cfg = tiny_config("factored", rounds=3)
    req = final_request(cfg)
    seed = [p.detach() for p in build_model(cfg.model, cfg.seed).parameters() if p.requires_grad]
    assert req.reference is not None and len(req.reference) == len(seed)
    assert all(torch.equal(r, s) for r, s in zip(req.reference, seed, strict=True))
    flat_seed = torch.cat([s.reshape(-1) for s in seed]).numpy()
    rng = torch.Generator().manual_seed(0)
    progress = 0.05 * torch.randn(flat_seed.size, generator=rng).numpy()
    own = flat_seed + progress  # this peer's whole run
    honest = flat_seed + 1.3 * progress + 0.02 * torch.randn(flat_seed.size, generator=rng).numpy()
    defence = Defence.of(SecurityConfig(), Penalties(6.0))
    scale = Scale.of(own.astype("float32"), flat_seed, "f4")
    assert check_contribution(honest, scale, defence) is None  # a peer that ran a few rounds longer
    assert check_contribution(-10.0 * honest, scale, defence) is not None  # the flip attack's model
    assert check_contribution(1e3 * honest, scale, defence) is not None
    mean_with_liar = (own + honest - 10.0 * honest) / 3
    assert check_result(mean_with_liar, scale, defence) is not None  # a poisoned owner's result
    assert check_result((own + honest) / 2, scale, defence) is None


def test_an_average_worse_than_the_own_model_is_not_kept() -> None:
    cfg = tiny_config("diloco", rounds=2)
    peer = _peers(cfg, 1, mid_round=False)[0]
    own = [a.clone() for a in peer.state.anchor]
    g = torch.Generator().manual_seed(0)
    drifted = [a + 0.5 * torch.randn(a.shape, generator=g) for a in own]  # far from the own model
    with torch.no_grad():  # as `agree` leaves a peer at a round's end: θ = φ = the average
        for p, d in zip(peer.params, drifted, strict=True):
            p.copy_(d)
    peer.state.anchor = [d.clone() for d in drifted]
    own_loss, mean_loss, kept = keep_the_better(peer, own, 0.02)
    assert kept and own_loss is not None and mean_loss is not None and mean_loss > 1.02 * own_loss
    for a, p, o in zip(peer.state.anchor, peer.params, own, strict=True):
        torch.testing.assert_close(a, o, rtol=0, atol=0)
        torch.testing.assert_close(p.detach(), o, rtol=0, atol=0)
    # an average no worse than the own model (within the bound), or no bound at all: kept
    peer.state.anchor = [d.clone() for d in drifted]
    assert keep_the_better(peer, own, float("inf"))[2] is False
    assert all(torch.equal(a, d) for a, d in zip(peer.state.anchor, drifted, strict=True))
    peer.state.anchor = [o + 1e-6 for o in own]
    assert keep_the_better(peer, own, 0.02)[2] is False


def test_survivors_of_a_peer_that_died_during_the_agreement_meet_again_and_end_with_their_mean(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """peer3 is in every view when the agreement starts but never sends (it died); once it leaves
    the views the survivors' first meeting ends with its part kept as their own values, not the
    consensus. They meet again without it and end with the exact mean of the three."""
    cfg = tiny_config("diloco", rounds=3, final_wait_s=10.0, timeout_s=5.0)
    ids = [f"peer{i}" for i in range(4)]
    dead: set[str] = set()
    net: dict[str, LoopTransport] = {}
    corpus = load_corpus(cfg.data, cfg.model.seq_len)
    peers = []
    for i, me in enumerate(ids[:3]):
        net[me] = LoopTransport(me, net, loop)
        exchange = NetworkExchange(
            cast(Transport, net[me]), lambda: [p for p in ids if p not in dead], "run", cfg.seed
        )
        peer = Peer(cfg, exchange, corpus, peer_key=me)
        # updates from the seed alike in direction and size, as honest peers' are (§10 bounds)
        peer.state.anchor = [a + 0.01 * (i + 1) for a in peer.state.anchor]
        peers.append(peer)
    mean = [torch.stack(ts).mean(0) for ts in zip(*[p.state.anchor for p in peers], strict=True)]
    records: list[ExchangeRecord | None] = [None] * 3

    def run(i: int) -> None:
        records[i] = agree(peers[i], final_request(cfg), lambda: False, retry_pause_s=0.2)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(1.0)
    dead.add("peer3")  # its heartbeat expired
    for t in threads:
        t.join(timeout=60)
    assert all(r is not None and r.ok and r.group_size == 3 and r.own_parts == 0 for r in records), records
    assert time.monotonic() - t0 < 8.0, "the survivors did not wait out the whole final_wait_s"
    for peer in peers:
        for a, m in zip(peer.state.anchor, mean, strict=True):
            torch.testing.assert_close(a, m)


def test_a_later_meeting_replaces_the_kept_result_only_with_a_whole_merge_with_others() -> None:
    from p2p_trainer.exchange.interface import Failed, Ok
    from p2p_trainer.run.final_agreement import _better

    partial = Ok([torch.zeros(2)], group_size=1, total_weight=3.0, own_parts=1, left_out=("c",))
    whole = Ok([torch.zeros(2)], group_size=2, total_weight=2.0)
    alone = Ok([torch.zeros(2)], group_size=1, total_weight=1.0)  # the others finished and left
    assert _better(whole, partial) and _better(whole, Failed("x"))
    assert not _better(alone, partial), "a peer left alone would throw its merge away"
    assert not _better(partial, partial) and not _better(Failed("late"), partial)
    assert _better(partial, Failed("views differed"))


def test_a_peer_penalised_in_the_rounds_still_meets_the_others_in_the_final_agreement(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """peer0 penalised peer1 in the rounds (an honest but noisy update can cross a bound once).
    In the rounds that leaves peer1 out of peer0's groups for a while; in the final agreement it
    would leave the result short of one model on every peer. All three end on the exact mean."""
    cfg = tiny_config("diloco", rounds=3, final_wait_s=10.0, timeout_s=5.0)
    ids = [f"peer{i}" for i in range(3)]
    net: dict[str, LoopTransport] = {}
    corpus = load_corpus(cfg.data, cfg.model.seq_len)
    peers, exchanges = [], []
    for i, me in enumerate(ids):
        net[me] = LoopTransport(me, net, loop)
        exchange = NetworkExchange(cast(Transport, net[me]), lambda: list(ids), "run", cfg.seed)
        assert exchange.security.defences
        peer = Peer(cfg, exchange, corpus, peer_key=me)
        peer.state.anchor = [a + 0.01 * (i + 1) for a in peer.state.anchor]
        peers.append(peer)
        exchanges.append(exchange)
    exchanges[0].penalties.offend("peer1", "update cosine -0.81 < -0.8 in a round")
    assert exchanges[0].penalties.excluded("peer1")
    mean = [torch.stack(ts).mean(0) for ts in zip(*[p.state.anchor for p in peers], strict=True)]
    records: list[ExchangeRecord | None] = [None] * 3

    def run(i: int) -> None:
        records[i] = agree(peers[i], final_request(cfg), lambda: False, retry_pause_s=0.2)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(r is not None and r.ok and r.group_size == 3 and r.own_parts == 0 for r in records), records
    for peer in peers:
        for a, m in zip(peer.state.anchor, mean, strict=True):
            torch.testing.assert_close(a, m)
    assert exchanges[0].penalties.excluded("peer1"), "the rounds' penalty is kept for the rounds"


def test_the_final_agreement_leaves_out_the_rounds_repeat_offenders_only(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """One penalty is what an honest peer's noisy update can earn; a liar offends each time its
    penalty has decayed and it is back in a group, though its score never shows more than one."""
    clock = [0.0]
    net: dict[str, LoopTransport] = {}
    net["me"] = LoopTransport("me", net, loop)
    exchange = NetworkExchange(cast(Transport, net["me"]), lambda: ["me"], "run", 0)
    exchange.penalties = Penalties(6.0, lambda: clock[0])
    exchange.penalties.offend("noisy", "update cosine -0.81 < -0.8")
    for _ in range(3):  # let back in once its penalty fell below one half: offends again
        while exchange.penalties.excluded("liar"):
            clock[0] += 1.0
        exchange.penalties.offend("liar", "update norm 1e3 x own")
    clock[0] += 20.0
    assert not exchange.penalties.excluded("liar"), "its score decayed, as in the rounds"
    final = exchange.final_penalties
    assert final.excluded("liar") and not final.excluded("noisy")
    assert exchange.final_penalties is final  # one ledger for every meeting of the final
    final.offend("fresh", "its final model reversed")
    assert final.excluded("fresh") and not exchange.penalties.excluded("fresh")
