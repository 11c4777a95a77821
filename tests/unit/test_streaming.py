"""Streaming DiLoCo (outer.fragments): one fragment per round, optionally behind the next round."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from p2p_trainer.algo.methods import NoLoCo, OuterState, RoundReport, build_method
from p2p_trainer.algo.streaming import StreamingDiLoCo, split_fragments
from p2p_trainer.config import ConfigError, ExchangeConfig, OuterConfig, RunConfig
from p2p_trainer.exchange.interface import ExchangeRequest, ExchangeResult, Failed, Ok
from p2p_trainer.run.threads import run_inprocess
from tests.conftest import tiny_config


def test_fragments_are_contiguous_balanced_and_cover_every_tensor() -> None:
    sizes = [100, 10, 10, 50, 50, 10, 70]
    fragments = split_fragments(sizes, 3)
    assert [i for f in fragments for i in f] == list(range(len(sizes)))
    assert all(f for f in fragments) and len(fragments) == 3
    totals = [sum(sizes[i] for i in f) for f in fragments]
    assert max(totals) <= 2 * min(totals), totals
    assert split_fragments([1, 1, 1], 3) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="exceeds the model's 3 parameter tensors"):
        split_fragments([1, 1, 1], 4)


def test_fragments_are_for_diloco_and_part_of_the_run_definition() -> None:
    with pytest.raises(ConfigError, match="applies to method diloco only"):
        OuterConfig.for_method("factored", fragments=2)
    base = RunConfig(outer=OuterConfig.for_method("diloco"))
    streaming = dataclasses.replace(base, outer=OuterConfig.for_method("diloco", fragments=4))
    assert streaming.run_definition()["fragments"] == 4 and "fragments" not in base.run_definition()


class _Partner:
    """A partner whose Δ is always zero (the mean is half of ours), finishing at once."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, int, int, list[int]]] = []

    def _mean(self, tensors: list[torch.Tensor], request: ExchangeRequest) -> Ok:
        self.requests.append((request.tag, request.round, request.gossip_step, [t.numel() for t in tensors]))
        return Ok([t / 2 for t in tensors], group_size=2, total_weight=2.0)

    def average(self, tensors: list[torch.Tensor], request: ExchangeRequest) -> ExchangeResult:
        return self._mean(tensors, request)

    def start(self, tensors: list[torch.Tensor], request: ExchangeRequest) -> object:
        res = self._mean([t.clone() for t in tensors], request)

        class Done:
            def done(self) -> bool:
                return True

            def result(self, timeout_s: float) -> ExchangeResult:
                return res

        return Done()

    def num_live_peers(self) -> int:
        return 2

    def close(self) -> None:
        return None


def _method(overlap: bool) -> tuple[StreamingDiLoCo, _Partner]:
    cfg = OuterConfig.for_method(
        "diloco", fragments=2, fragment_overlap=overlap, outer_lr=1.0, outer_momentum=0.0, reagree_every=0
    )
    partner = _Partner()
    method = build_method(cfg, partner, xcfg=ExchangeConfig())  # type: ignore[arg-type]
    assert isinstance(method, StreamingDiLoCo)
    return method, partner


def _train(params: list[torch.Tensor], by: float) -> None:
    with torch.no_grad():
        for p in params:
            p -= by


def test_without_overlap_each_round_steps_one_fragment_and_keeps_the_others_local() -> None:
    method, partner = _method(overlap=False)
    params = [torch.zeros(6), torch.zeros(6)]
    state = OuterState.from_params(params)
    method.begin_round(state, 1.0)
    _train(params, 1.0)  # Δ = 1 everywhere
    method.end_round(params, state, 1.0, RoundReport(0))
    assert partner.requests == [("fragment", 0, 0, [6])]
    # α = 1, β = 0: fragment 0's anchor moves by the mean Δ (1/2); θ_0 ← φ_0; fragment 1 untouched
    assert torch.equal(state.anchor[0], torch.full((6,), -0.5)) and torch.equal(params[0], state.anchor[0])
    assert torch.equal(state.anchor[1], torch.zeros(6)) and torch.equal(params[1], torch.full((6,), -1.0))
    method.begin_round(state, 1.0)
    _train(params, 1.0)
    method.end_round(params, state, 1.0, RoundReport(1))
    assert partner.requests[1] == ("fragment", 1, 1, [6])
    # fragment 1 had two rounds of local progress: Δ_1 = 2, mean 1
    assert torch.equal(state.anchor[1], torch.full((6,), -1.0)) and torch.equal(params[1], state.anchor[1])
    assert torch.equal(params[0], torch.full((6,), -1.5)) and state.round == 2


def test_with_overlap_the_step_lands_a_round_later_and_keeps_the_steps_made_meanwhile() -> None:
    method, partner = _method(overlap=True)
    params = [torch.zeros(6), torch.zeros(6)]
    state = OuterState.from_params(params)
    method.begin_round(state, 1.0)
    _train(params, 1.0)
    method.end_round(params, state, 1.0, RoundReport(0))
    # started, not landed: anchors unchanged, θ keeps training
    assert torch.equal(state.anchor[0], torch.zeros(6)) and torch.equal(params[0], torch.full((6,), -1.0))
    method.begin_round(state, 1.0)
    _train(params, 1.0)
    method.end_round(params, state, 1.0, RoundReport(1))
    # fragment 0 landed: φ_0 = 0 − 1/2; θ_0 = φ_0 + (θ_0 now − θ_0 at the start) = −0.5 − 1
    assert torch.equal(state.anchor[0], torch.full((6,), -0.5))
    assert torch.equal(params[0], torch.full((6,), -1.5))
    # fragment 1 was sent at the end of round 1 (Δ_1 = 2) and lands next round
    assert partner.requests[1] == ("fragment", 1, 1, [6])
    assert torch.equal(state.anchor[1], torch.zeros(6)) and torch.equal(params[1], torch.full((6,), -2.0))


class _SlowPartner(_Partner):
    """Its exchanges finish `delay_s` after they start: later than the round plus mix1_grace_s."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.waits: list[float] = []

    def start(self, tensors: list[torch.Tensor], request: ExchangeRequest) -> object:
        res, ready_at, waits = (
            self._mean([t.clone() for t in tensors], request),
            time.monotonic() + self.delay_s,
            self.waits,
        )

        class Slow:
            def done(self) -> bool:
                return time.monotonic() >= ready_at

            def result(self, timeout_s: float) -> ExchangeResult:
                waits.append(timeout_s)
                left = ready_at - time.monotonic()
                if left > timeout_s:
                    time.sleep(timeout_s)
                    return Failed(f"not finished within {timeout_s:.1f} s")
                time.sleep(max(0.0, left))
                return res

        return Slow()


def test_an_overlapped_exchange_slower_than_the_round_is_waited_for_not_given_up() -> None:
    cfg = OuterConfig.for_method("diloco", overlap=True, outer_lr=1.0, outer_momentum=0.0, reagree_every=0)
    partner = _SlowPartner(delay_s=0.6)
    xcfg = ExchangeConfig(mix1_grace_s=0.1, timeout_s=5.0)
    method = build_method(cfg, partner, xcfg=xcfg)  # type: ignore[arg-type]
    params = [torch.zeros(6)]
    state = OuterState.from_params(params)
    for r in range(2):
        method.begin_round(state, 1.0)
        _train(params, 1.0)
        report = RoundReport(r)
        method.end_round(params, state, 1.0, report)
    # round 0's exchange landed at round 1's end, after mix1_grace_s, within its deadline
    assert partner.waits and 0.1 < partner.waits[0] <= xcfg.pause_bound_s
    assert [(e.tag, e.ok) for e in report.exchanges] == [("fragment", True)]
    assert torch.equal(state.anchor[0], torch.full((6,), -0.5))


@pytest.mark.parametrize(
    "outer", [{"fragments": 2, "reagree_every": 0}, {"overlap": True}], ids=["fragments", "overlap"]
)
def test_a_streaming_or_overlapped_swarm_learns_in_process(outer: dict[str, object]) -> None:
    cfg = tiny_config("diloco", rounds=8, h=5)
    cfg = dataclasses.replace(cfg, outer=dataclasses.replace(cfg.outer, **outer))  # type: ignore[arg-type]
    res = run_inprocess(cfg, 2)
    assert res.failed_exchanges == 0
    first = [h[0].train_loss for h in res.history]
    last = [h[-1].train_loss for h in res.history]
    assert all(b < a - 0.3 for a, b in zip(first, last, strict=True)), (first, last)
    assert res.mean_model_val_loss < 5.0


def test_overlap_is_diloco_with_one_fragment_behind_the_next_round() -> None:
    base = RunConfig(outer=OuterConfig.for_method("diloco"))
    overlapped = dataclasses.replace(base, outer=OuterConfig.for_method("diloco", overlap=True))
    assert overlapped.run_definition()["overlap"] is True and "overlap" not in base.run_definition()
    # other methods ignore it, so `--method` still works on a file that sets it
    noloco = dataclasses.replace(base, outer=OuterConfig.for_method("noloco", overlap=True))
    assert not noloco.outer.overlaps_outer_step and "overlap" not in noloco.run_definition()
    assert isinstance(build_method(noloco.outer, _Partner(), xcfg=ExchangeConfig()), NoLoCo)  # type: ignore[arg-type]
    # with fragments, fragment_overlap decides
    blocking = OuterConfig.for_method("diloco", fragments=2, fragment_overlap=False, overlap=True)
    assert not blocking.overlaps_outer_step
    cfg = OuterConfig.for_method("diloco", overlap=True, outer_lr=1.0, outer_momentum=0.0, reagree_every=0)
    partner = _Partner()
    method = build_method(cfg, partner, xcfg=ExchangeConfig())  # type: ignore[arg-type]
    params = [torch.zeros(4), torch.zeros(2)]
    state = OuterState.from_params(params)
    method.begin_round(state, 1.0)
    _train(params, 1.0)
    method.end_round(params, state, 1.0, RoundReport(0))
    # the whole model's Δ is on its way (one request, both tensors); nothing has landed yet
    assert partner.requests == [("fragment", 0, 0, [4, 2])]
    assert all(torch.equal(a, torch.zeros_like(a)) for a in state.anchor)
    assert torch.equal(params[0], torch.full((4,), -1.0)) and state.round == 1
    method.begin_round(state, 1.0)
    _train(params, 2.0)
    method.end_round(params, state, 1.0, RoundReport(1))
    # round 0's mean Δ (1/2) landed: φ = −0.5, and θ keeps round 1's own steps (−2) on top of it;
    # then round 1's Δ (φ − θ = 2) is sent, the whole model again
    assert all(torch.equal(a, torch.full_like(a, -0.5)) for a in state.anchor)
    assert torch.equal(params[0], torch.full((4,), -2.5)) and torch.equal(params[1], torch.full((2,), -2.5))
    assert partner.requests[1] == ("fragment", 1, 0, [4, 2])


def test_a_step_landed_early_keeps_the_steps_after_it_and_the_round_end_lands_nothing() -> None:
    cfg = OuterConfig.for_method("diloco", overlap=True, outer_lr=1.0, outer_momentum=0.0, reagree_every=0)
    partner = _Partner()
    method = build_method(cfg, partner, xcfg=ExchangeConfig())  # type: ignore[arg-type]
    params = [torch.zeros(4)]
    state = OuterState.from_params(params)
    method.begin_round(state, 1.0)
    assert not method.land(params, state, RoundReport(0))  # nothing in flight yet
    _train(params, 1.0)
    method.end_round(params, state, 1.0, RoundReport(0))  # Δ = 1 sent; the mean is 1/2
    method.begin_round(state, 1.0)
    _train(params, 0.25)  # the steps before the landing step
    assert method.land(params, state, RoundReport(1))
    # φ = 0 − 1/2; θ = φ + (θ now − θ at the exchange's start) = −0.5 − 0.25
    assert torch.equal(state.anchor[0], torch.full((4,), -0.5))
    assert torch.equal(params[0], torch.full((4,), -0.75))
    assert not method.land(params, state, RoundReport(1))  # landed once
    _train(params, 1.0)
    method.end_round(params, state, 1.0, RoundReport(1))
    # the round's end lands nothing more and sends this round's Δ: φ − θ = −0.5 − (−1.75) = 1.25
    assert torch.equal(state.anchor[0], torch.full((4,), -0.5))
    assert partner.requests[-1] == ("fragment", 1, 0, [4]) and state.round == 2
    assert torch.equal(params[0], torch.full((4,), -1.75))


def test_a_landing_waits_for_a_re_agreement_that_started_before_it() -> None:
    cfg = OuterConfig.for_method("diloco", overlap=True, outer_lr=1.0, outer_momentum=0.0, reagree_every=2)
    method = build_method(cfg, _Partner(), xcfg=ExchangeConfig())  # type: ignore[arg-type]
    params = [torch.zeros(4)]
    state = OuterState.from_params(params)
    method.begin_round(state, 1.0)
    _train(params, 1.0)
    method.end_round(params, state, 1.0, RoundReport(0))
    method.begin_round(state, 1.0)  # round 1: a periodic re-agreement of φ and m starts
    # its mean would replace a φ stepped now at the round's end: landed there instead
    assert not method.land(params, state, RoundReport(1))


def test_land_at_step_lands_inside_the_round_in_process() -> None:
    cfg = tiny_config("diloco", rounds=6, h=5)
    cfg = dataclasses.replace(cfg, outer=dataclasses.replace(cfg.outer, overlap=True, land_at_step=2))
    res = run_inprocess(cfg, 2)
    assert res.failed_exchanges == 0
    first = [h[0].train_loss for h in res.history]
    last = [h[-1].train_loss for h in res.history]
    assert all(b < a - 0.3 for a, b in zip(first, last, strict=True)), (first, last)
    # the round records say where it landed: nothing runs behind round 0; later rounds land from
    # step 2 on, before their end (H = 5)
    landed = [[m.landed_at_step for m in h] for h in res.history]
    assert all(peer[0] is None for peer in landed), landed
    later = [step for peer in landed for step in peer[1:]]
    assert all(step is None or 2 <= step < 5 for step in later), landed
    assert sum(step is not None for step in later) >= len(later) // 2, landed
    with pytest.raises(ConfigError, match="land_at_step=-1"):
        OuterConfig.for_method("diloco", overlap=True, land_at_step=-1)
    # at or past the round's length it lands at the round's end: a shorter H set on the command
    # line does not turn a config file's landing step into an error
    assert OuterConfig.for_method("diloco", overlap=True, num_inner_steps=3, land_at_step=5).land_at_step == 5


def test_an_early_landing_waits_for_nothing_and_lands_once_the_mean_is_in() -> None:
    cfg = OuterConfig.for_method("diloco", overlap=True, outer_lr=1.0, outer_momentum=0.0, reagree_every=0)
    partner = _SlowPartner(delay_s=0.3)
    method = build_method(cfg, partner, xcfg=ExchangeConfig(timeout_s=5.0))  # type: ignore[arg-type]
    params = [torch.zeros(4)]
    state = OuterState.from_params(params)
    method.begin_round(state, 1.0)
    _train(params, 1.0)
    method.end_round(params, state, 1.0, RoundReport(0))
    method.begin_round(state, 1.0)
    assert not method.ready_to_land(state) and not method.land(params, state, RoundReport(1))
    assert partner.waits == []  # nobody waited on the exchange: the inner steps go on
    time.sleep(0.35)
    assert method.ready_to_land(state) and method.land(params, state, RoundReport(1))
    assert torch.equal(state.anchor[0], torch.full((4,), -0.5))


def test_an_early_landing_keeps_the_fragment_digest_taken_behind_the_inner_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rounds 4–6 carry fragment digests (re-agreement every 8 rounds, P = 2), each taken behind
    the round's inner steps. A landing early in the round steps the other fragment only: the
    digest taken behind stands (none is taken again at the round's end) and is the one of the
    fragment as sent."""
    from p2p_trainer.algo import methods, streaming

    cfg = OuterConfig.for_method(
        "diloco", fragments=2, overlap=True, outer_lr=1.0, outer_momentum=0.0, reagree_every=8
    )
    partner = _Partner()
    sent: list[tuple[int, bytes]] = []
    mean = partner._mean

    def recording(tensors: list[torch.Tensor], request: ExchangeRequest) -> Ok:
        sent.append((request.round, request.state_digest))
        return mean(tensors, request)

    partner._mean = recording  # type: ignore[method-assign]
    method = build_method(cfg, partner, xcfg=ExchangeConfig())  # type: ignore[arg-type]
    taken_at_the_end: list[int] = []

    def counted(rnd: int, tensors: list[torch.Tensor]) -> bytes:
        taken_at_the_end.append(rnd)
        return methods.state_digest(rnd, tensors)

    monkeypatch.setattr(streaming, "state_digest", counted)
    params = [torch.zeros(4), torch.zeros(4)]
    state = OuterState.from_params(params)
    expected: dict[int, bytes] = {}
    for rnd in range(7):
        method.begin_round(state, 1.0)
        _train(params, 0.25)
        assert method.land(params, state, RoundReport(rnd)) == (rnd > 0)
        chosen = rnd % 2
        expected[rnd] = methods.state_digest(rnd, [state.anchor[chosen], state.momentum[chosen]])
        _train(params, 1.0)
        method.end_round(params, state, 1.0, RoundReport(rnd))
    assert taken_at_the_end == []
    assert [r for r, d in sent if d] == [4, 5, 6]
    assert all(d == expected[r] for r, d in sent if d)
