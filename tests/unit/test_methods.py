"""Method strategies over the in-process backend: each exchange happened and moved members to the mean."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import cast

import torch

from p2p_trainer.algo import outer
from p2p_trainer.algo.groups import group_seed, partition
from p2p_trainer.algo.methods import DiLoCo, OuterState, RoundReport, build_method, grace_tracker
from p2p_trainer.config import ExchangeConfig, OuterConfig
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.exchange.interface import ALL, ExchangeRequest, ExchangeResult, Failed, Ok, PendingExchange
from tests.unit.fake_exchanges import Finished


def _peers(n: int, seed: int = 0) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]]]:
    g = torch.Generator().manual_seed(seed)
    start = [torch.randn(4, 3, generator=g), torch.randn(5, generator=g)]
    fast = [[s + 0.1 * torch.randn(s.shape, generator=g) for s in start] for _ in range(n)]
    anchors = [[s.clone() for s in start] for _ in range(n)]
    return anchors, fast


def _end_rounds(
    cfg: OuterConfig, anchors: list[list[torch.Tensor]], fast: list[list[torch.Tensor]]
) -> tuple[list[OuterState], list[RoundReport]]:
    n = len(anchors)
    swarm = InProcessSwarm(n, seed=0)
    states = [
        OuterState(anchor=[a.clone() for a in anchors[i]], momentum=[torch.zeros_like(a) for a in anchors[i]])
        for i in range(n)
    ]
    reports = [RoundReport(0) for _ in range(n)]
    params = [[f.clone() for f in fast[i]] for i in range(n)]

    def work(i: int) -> None:
        method = build_method(cfg, swarm.exchange(i))
        method.begin_round(states[i], 1.0)
        method.end_round(params[i], states[i], 1.0, reports[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for i in range(n):  # θ ← φ after every outer step
        for p, a in zip(params[i], states[i].anchor, strict=True):
            torch.testing.assert_close(p, a)
    return states, reports


def test_diloco_round_matches_the_equations_and_peers_agree() -> None:
    anchors, fast = _peers(3)
    cfg = OuterConfig.for_method("diloco")
    states, reports = _end_rounds(cfg, anchors, fast)
    mean_delta = outer.weighted_mean([outer.pseudo_grad(anchors[0], f) for f in fast], [1.0] * 3)
    expected, _ = outer.nesterov_outer_step(
        anchors[0], [torch.zeros_like(a) for a in anchors[0]], mean_delta, 0.7, 0.9
    )
    for s, r in zip(states, reports, strict=True):
        assert r.exchanges[0].ok and r.exchanges[0].group_size == 3 and r.exchanges[0].bytes_sent > 0
        for a, e in zip(s.anchor, expected, strict=True):
            torch.testing.assert_close(a, e)


def test_noloco_pairs_move_to_their_group_mean() -> None:
    anchors, fast = _peers(4, seed=1)
    cfg = OuterConfig.for_method("noloco")
    states, reports = _end_rounds(cfg, anchors, fast)
    names = [f"peer{i}" for i in range(4)]
    for group in partition(names, 2, group_seed(0, "noloco", 0)):
        idx = [names.index(n) for n in group]
        mean_fast = outer.weighted_mean([fast[i] for i in idx], [1.0] * len(idx))
        for i in idx:
            assert reports[i].exchanges[0].ok and reports[i].exchanges[0].group_size == 2
            expect, _ = outer.noloco_shortcut_step(
                anchors[i], [torch.zeros_like(a) for a in anchors[i]], mean_fast, 0.7, 0.5
            )
            for a, e in zip(states[i].anchor, expect, strict=True):
                torch.testing.assert_close(a, e)


def test_noloco_general_gamma_exchanges_anchors_too() -> None:
    anchors, fast = _peers(2, seed=2)
    anchors[1] = [a + 1.0 for a in anchors[1]]
    cfg = OuterConfig.for_method("noloco", gamma=0.3)
    states, _ = _end_rounds(cfg, anchors, fast)
    descent = outer.weighted_mean(
        [[f - a for f, a in zip(fast[i], anchors[i], strict=True)] for i in range(2)], [1.0, 1.0]
    )
    mean_phi = outer.weighted_mean(anchors, [1.0, 1.0])
    expect, _ = outer.noloco_outer_step(
        anchors[0], [torch.zeros_like(a) for a in anchors[0]], descent, mean_phi, 0.7, 0.5, 0.3
    )
    for a, e in zip(states[0].anchor, expect, strict=True):
        torch.testing.assert_close(a, e)


def test_factored_mixes_anchors_and_pseudo_gradients() -> None:
    anchors, fast = _peers(2, seed=3)
    anchors[1] = [a + 0.5 for a in anchors[1]]
    cfg = OuterConfig.for_method("factored")
    states, reports = _end_rounds(cfg, anchors, fast)
    tags = {e.tag: e for e in reports[0].exchanges}
    assert tags["mix1"].ok and tags["mix2"].ok
    mixed_phi = outer.weighted_mean(anchors, [1.0, 1.0])
    mixed_delta = outer.weighted_mean([outer.pseudo_grad(anchors[i], fast[i]) for i in range(2)], [1.0, 1.0])
    expect, _ = outer.nesterov_outer_step(
        mixed_phi, [torch.zeros_like(a) for a in mixed_phi], mixed_delta, cfg.outer_lr, cfg.outer_momentum
    )
    for s in states:
        for a, e in zip(s.anchor, expect, strict=True):
            torch.testing.assert_close(a, e)


def test_failed_exchange_keeps_own_update() -> None:
    # Only peer 0 of a 2-peer swarm shows up: the exchange times out and the peer's own Δ is used.
    anchors, fast = _peers(2, seed=4)
    swarm = InProcessSwarm(2, seed=0)
    cfg = OuterConfig.for_method("diloco")
    state = OuterState(
        anchor=[a.clone() for a in anchors[0]], momentum=[torch.zeros_like(a) for a in anchors[0]]
    )
    report = RoundReport(0)
    params = [f.clone() for f in fast[0]]
    build_method(cfg, swarm.exchange(0), xcfg=ExchangeConfig(timeout_s=0.2)).end_round(
        params, state, 1.0, report
    )
    assert not report.exchanges[0].ok and "timed out" in report.exchanges[0].reason
    own = outer.pseudo_grad(anchors[0], fast[0])
    expect, _ = outer.nesterov_outer_step(
        anchors[0], [torch.zeros_like(a) for a in anchors[0]], own, 0.7, 0.9
    )
    for a, e in zip(state.anchor, expect, strict=True):
        torch.testing.assert_close(a, e)
    assert state.round == 1


class _Recorder:
    """An exchange that records requests and averages with nobody (enough to see the windows)."""

    def __init__(self) -> None:
        self.requests: list[ExchangeRequest] = []

    def start(self, tensors: Sequence[torch.Tensor], request: ExchangeRequest) -> Finished:
        self.requests.append(request)
        return Finished(tensors)

    def average(self, tensors: Sequence[torch.Tensor], request: ExchangeRequest) -> Ok:
        self.requests.append(request)
        return Ok(list(tensors), group_size=2, total_weight=2.0, quorum_s=0.1, sync_s=8.0)  # a long Mix2

    def num_live_peers(self) -> int:
        return 2

    def close(self) -> None:
        pass


def test_mix1_waits_for_its_partner_all_round_even_after_a_long_mix2_shrank_the_grace_window() -> None:
    cfg = OuterConfig.for_method("factored", num_inner_steps=10, mix2_every=1)
    xcfg = ExchangeConfig(grace_min_s=1.0, grace_max_s=5.0, mix1_grace_s=2.0)
    rec = _Recorder()
    timing = grace_tracker(xcfg)
    method = build_method(cfg, rec, timing, xcfg)
    anchors, fast = _peers(1)
    state = OuterState(anchor=anchors[0], momentum=[torch.zeros_like(a) for a in anchors[0]])
    for _ in range(2):
        timing.observe_step(0.5)
        method.begin_round(state, 1.0)
        method.end_round([f.clone() for f in fast[0]], state, 1.0, RoundReport(state.round))
    mix1 = [r for r in rec.requests if r.tag == "mix1"]
    mix2 = [r for r in rec.requests if r.tag == "mix2"]
    assert mix2[-1].grace_s == 1.0  # the blocking window after an 8 s sync: grace_min_s
    assert mix1[-1].grace_s == 10 * 0.5 + 2.0  # H steps plus Mix1's grace
    assert mix1[-1].result_wait_s >= mix1[-1].grace_s


def test_diloco_reagrees_drifted_anchors_in_the_background() -> None:
    anchors, fast = _peers(3)
    for i, a in enumerate(anchors):  # anchors that drifted apart, e.g. after a partial exchange
        a[0] += 0.05 * (i + 1)
    deltas = [outer.pseudo_grad(anchors[i], fast[i]) for i in range(3)]
    mean_delta = outer.weighted_mean(deltas, [1.0] * 3)
    zeros = [torch.zeros_like(a) for a in anchors[0]]
    mean_anchor = outer.weighted_mean(anchors, [1.0] * 3)
    expected, _ = outer.nesterov_outer_step(mean_anchor, zeros, mean_delta, 0.7, 0.9)
    states, reports = _end_rounds(OuterConfig.for_method("diloco", reagree_every=1), anchors, fast)
    for s, r in zip(states, reports, strict=True):
        assert [e.tag for e in r.exchanges] == ["outer", "reagree"] and all(e.ok for e in r.exchanges)
        for got, want in zip(s.anchor, expected, strict=True):
            torch.testing.assert_close(got, want)
    # without it the anchors stay apart by what they drifted
    states, reports = _end_rounds(OuterConfig.for_method("diloco", reagree_every=0), anchors, fast)
    assert [e.tag for e in reports[0].exchanges] == ["outer"]
    assert not torch.allclose(states[0].anchor[0], states[2].anchor[0])


class _Scripted:
    """An exchange whose blocking results are scripted per tag; background ones echo the inputs."""

    def __init__(self, outcomes: dict[str, list[ExchangeResult]]) -> None:
        self.outcomes = outcomes
        self.started: list[tuple[str, int]] = []
        self.divergent: set[tuple[str, bool]] = set()

    def average(self, tensors: Sequence[torch.Tensor], request: ExchangeRequest) -> ExchangeResult:
        self.divergent.add((request.tag, request.divergent))
        return self.outcomes[request.tag].pop(0)

    def start(self, tensors: Sequence[torch.Tensor], request: ExchangeRequest) -> PendingExchange:
        self.started.append((request.tag, request.round))
        self.divergent.add((request.tag, request.divergent))
        done = InProcessSwarm(1, seed=0).exchange(0)
        return done.start(tensors, dataclasses.replace(request, group_size=ALL))

    def num_live_peers(self) -> int:
        return 2

    def close(self) -> None:
        pass


def test_diloco_reagrees_in_the_round_after_a_partial_exchange_until_one_succeeds() -> None:
    params = [torch.zeros(4)]
    partial = Ok([torch.zeros(4)], group_size=2, total_weight=2.0, own_parts=1, left_out=("dead",))
    full = Ok([torch.zeros(4)], group_size=2, total_weight=2.0)
    ex = _Scripted({"outer": [full, partial, Failed("views differ"), full, full]})
    method = build_method(OuterConfig.for_method("diloco", reagree_every=0), ex)
    state = OuterState.from_params(params)
    for _ in range(5):
        method.begin_round(state, 1.0)
        method.end_round(params, state, 1.0, RoundReport(state.round))
    # round 1 merged in part, round 2 failed: rounds 2 and 3 re-agree; round 3's succeeds
    assert ex.started == [("reagree", 2), ("reagree", 3)]
    # states that drifted apart are not held to one round's direction (§10); the Δ are
    assert ex.divergent == {("outer", False), ("reagree", True)}


def _diloco_rounds(
    cfg: OuterConfig,
    anchors: list[list[torch.Tensor]],
    rounds: int,
    meddle: Callable[[int, int, OuterState], None] = lambda _i, _rnd, _state: None,
    diverged: frozenset[int] = frozenset(),
) -> list[list[list[str]]]:
    """`rounds` DiLoCo rounds of in-process peers from these anchors (θ moved by a little noise
    each round); the exchange tags of each peer's rounds. `meddle(peer, round, state)` runs
    after each round's start; the peers in `diverged` start as if an exchange of theirs had not
    merged fully."""
    n = len(anchors)
    swarm = InProcessSwarm(n, seed=0)
    methods = [build_method(cfg, swarm.exchange(i)) for i in range(n)]
    for i in diverged:
        cast(DiLoCo, methods[i])._diverged = True
    states = [
        OuterState(anchor=[a.clone() for a in anchors[i]], momentum=[torch.zeros_like(a) for a in anchors[i]])
        for i in range(n)
    ]
    tags: list[list[list[str]]] = [[] for _ in range(n)]

    def work(i: int, rnd: int) -> None:
        g = torch.Generator().manual_seed(100 * rnd + i)
        methods[i].begin_round(states[i], 1.0)
        meddle(i, rnd, states[i])
        params = [a + 0.01 * torch.randn(a.shape, generator=g) for a in states[i].anchor]
        report = RoundReport(rnd)
        methods[i].end_round(params, states[i], 1.0, report)
        tags[i].append([e.tag for e in report.exchanges])

    for rnd in range(rounds):
        threads = [threading.Thread(target=work, args=(i, rnd)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    for s in states[1:]:
        for got, want in zip(s.anchor + s.momentum, states[0].anchor + states[0].momentum, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    return tags


def test_diloco_skips_a_periodic_reagreement_when_every_members_state_was_equal() -> None:
    cfg = OuterConfig.for_method("diloco", reagree_every=2)
    anchors, _ = _peers(3)
    tags = _diloco_rounds(cfg, anchors, 4)
    # rounds 1 and 3 are due; round 0's and 2's exchanges showed equal (φ, m) everywhere
    assert all(t == [["outer"]] * 4 for t in tags), tags


def test_streaming_diloco_skips_a_periodic_reagreement_its_fragments_vouch_for() -> None:
    # P = 2, overlapped: each fragment exchange lands a round late; rounds 3 and 7 are due, and
    # the fragment exchanges that landed before each carried equal digests of (φ_p, m_p)
    cfg = OuterConfig.for_method("diloco", reagree_every=4, fragments=2)
    anchors, _ = _peers(3)
    tags = _diloco_rounds(cfg, anchors, 8)
    assert all(t == [[]] + [["fragment"]] * 7 for t in tags), tags


def test_streaming_diloco_reagrees_when_a_fragment_differs_and_skips_once_agreed() -> None:
    cfg = OuterConfig.for_method("diloco", reagree_every=4, fragments=2)
    anchors, _ = _peers(3)
    anchors[2][1] += 1e-3  # one peer's second fragment differs
    tags = _diloco_rounds(cfg, anchors, 8)
    want: list[list[str]] = [[]] + [["fragment"]] * 2 + [["reagree", "fragment"]] + [["fragment"]] * 4
    assert all(t == want for t in tags), tags


def test_streaming_diloco_hashes_a_fragment_replaced_after_its_round_began() -> None:
    # the digest of round 4's fragment (tensor 0) is taken behind the inner steps; a state that
    # one peer adopts meanwhile (a new anchor list) must be hashed as it is at the round's end,
    # or the peers would vouch for a fragment that differs and skip round 7's re-agreement
    # (round 3's is skipped: nothing differs before round 4)
    cfg = OuterConfig.for_method("diloco", reagree_every=4, fragments=2)
    anchors, _ = _peers(3)

    def adopt(i: int, rnd: int, state: OuterState) -> None:
        if i == 2 and rnd == 4:
            state.anchor = [a + 1e-3 if k == 0 else a.clone() for k, a in enumerate(state.anchor)]

    tags = _diloco_rounds(cfg, anchors, 8, adopt)
    want: list[list[str]] = [[]] + [["fragment"]] * 6 + [["reagree", "fragment"]]
    assert all(t == want for t in tags), tags


def test_diloco_reagrees_when_the_digests_show_a_drift_and_skips_once_it_is_gone() -> None:
    cfg = OuterConfig.for_method("diloco", reagree_every=2)
    anchors, _ = _peers(3)
    anchors[2][0] += 1e-3  # one peer's φ differs: its Δ still averages in full
    tags = _diloco_rounds(cfg, anchors, 4)
    assert all(t == [["outer"], ["outer", "reagree"], ["outer"], ["outer"]] for t in tags), tags


def test_a_diverged_peer_asks_and_the_others_join_its_reagreement_the_next_round() -> None:
    """peer0 diverged (a partial exchange during a link cut), the others did not (one rejoined by
    download): its own re-agreement cannot complete without them, so it asks with its Δ, and they
    join the next round's. Without periodic re-agreements nothing else would ever fix it."""
    cfg = OuterConfig.for_method("diloco", reagree_every=0)
    anchors, _ = _peers(3)
    anchors[0][0] += 1e-3
    tags = _diloco_rounds(cfg, anchors, 4, diverged=frozenset({0}))
    # round 0: peer0 re-agrees alone and fails; round 1: everyone; round 2: peer0 asked again
    # in round 1 (its re-agreement was still in flight) but the others joined one a round ago
    assert tags[0] == [["outer", "reagree"], ["outer", "reagree"], ["outer"], ["outer"]], tags
    assert tags[1] == tags[2] == [["outer"], ["outer", "reagree"], ["outer"], ["outer"]], tags


def test_gradient_averaging_weighs_steps_equally_and_bounds_weights_at_one() -> None:
    """Data-parallel gradients count once per step: a weight of 1 against a floor of a round's
    tokens would let a member claim thousands of times its weight and stretch every bound (§10)."""
    seen: list[ExchangeRequest] = []
    full = Ok([torch.zeros(4)], group_size=2, total_weight=2.0)

    class Recording(_Scripted):
        def average(self, tensors: Sequence[torch.Tensor], request: ExchangeRequest) -> ExchangeResult:
            seen.append(request)
            return full

    methods = {
        name: build_method(OuterConfig.for_method(name), Recording({}), round_tokens=4096.0)
        for name in ("data-parallel", "diloco")
    }
    methods["data-parallel"].sync_gradients([torch.zeros(4)], 0, RoundReport(0))
    methods["diloco"].end_round(
        [torch.zeros(4)], OuterState.from_params([torch.zeros(4)]), 4096.0, RoundReport(0)
    )
    assert [(r.tag, r.weight, r.weight_floor) for r in seen] == [
        ("grad", 1.0, 1.0),
        ("outer", 4096.0, 4096.0),
    ]
