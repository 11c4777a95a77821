"""Partial Mix2 (outer.mix2_tensors): only the named parameters' pseudo-gradients are mixed."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from p2p_trainer.algo.methods import OuterState, RoundReport, build_method, mixed_indices
from p2p_trainer.config import ExchangeConfig, OuterConfig, RunConfig
from p2p_trainer.exchange.interface import ExchangeRequest, ExchangeResult, Ok
from tests.unit.fake_exchanges import Finished

NAMES = ["tok_emb.weight", "blocks.0.attn.qkv.weight", "blocks.1.attn.qkv.weight", "ln_f.weight"]


class _HalvingPartner:
    """A Mix2 partner whose Δ is always zero: the group mean is half of this peer's."""

    def __init__(self) -> None:
        self.mix2_shapes: list[list[tuple[int, ...]]] = []

    def average(self, tensors: list[torch.Tensor], request: ExchangeRequest) -> ExchangeResult:
        self.mix2_shapes.append([tuple(t.shape) for t in tensors])
        return Ok([t / 2 for t in tensors], group_size=2, total_weight=2.0)

    def start(self, tensors: list[torch.Tensor], request: ExchangeRequest) -> Finished:
        return Finished(list(tensors))

    def num_live_peers(self) -> int:
        return 2

    def close(self) -> None:
        return None


def test_patterns_pick_parameters_by_name_and_refuse_a_pattern_matching_nothing() -> None:
    assert mixed_indices((), NAMES) is None
    assert mixed_indices(("tok_emb.*", "blocks.0.*"), NAMES) == [0, 1]
    assert mixed_indices(("blocks.*",), NAMES) == [1, 2]
    with pytest.raises(ValueError, match=r"matches no parameter \(names: tok_emb.weight"):
        mixed_indices(("embeddings.*",), NAMES)


def test_only_the_chosen_pseudo_gradients_are_mixed() -> None:
    cfg = OuterConfig(method="factored", mix2_tensors=("tok_emb.*", "blocks.0.*"), outer_momentum=0.0)
    cfg = dataclasses.replace(cfg, outer_lr=1.0)
    partner = _HalvingPartner()
    method = build_method(cfg, partner, xcfg=ExchangeConfig(), names=NAMES)  # type: ignore[arg-type]
    params = [torch.zeros(4), torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(5)]
    state = OuterState.from_params(params)
    method.begin_round(state, 1.0)
    with torch.no_grad():
        for p in params:
            p -= 1.0  # Δ = φ − θ = 1 everywhere
    method.end_round(params, state, 1.0, RoundReport(0))
    assert partner.mix2_shapes == [[(4,), (2, 3)]]
    # α = 1, β = 0: φ ← φ − mean Δ; the mixed ones moved by half their Δ, the others by all of it
    assert torch.equal(state.anchor[0], torch.full((4,), -0.5))
    assert torch.equal(state.anchor[1], torch.full((2, 3), -0.5))
    assert torch.equal(state.anchor[2], torch.full((2, 3), -1.0))
    assert torch.equal(state.anchor[3], torch.full((5,), -1.0))


def test_the_subset_and_the_codecs_are_part_of_the_run_definition() -> None:
    base = RunConfig()
    partial = dataclasses.replace(base, outer=dataclasses.replace(base.outer, mix2_tensors=("blocks.0.*",)))
    compressed = dataclasses.replace(base, exchange=ExchangeConfig(update_codec="int8"))
    ids = {base.run_id(), partial.run_id(), compressed.run_id()}
    assert len(ids) == 3
    assert partial.run_definition()["mix2_tensors"] == ["blocks.0.*"]
    assert compressed.run_definition()["codecs"]["update_codec"] == "int8"
    assert "codecs" not in base.run_definition() and "mix2_tensors" not in base.run_definition()
