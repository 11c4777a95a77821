"""A peer that adopts a donor's state mid-round leaves out the steps the donor already did."""

from __future__ import annotations

import pytest
import torch

from p2p_trainer.config import DataConfig, InnerConfig, ModelConfig, OuterConfig, RunConfig
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.net.state_sync import DonorState, catch_up_steps
from p2p_trainer.train.data import load_corpus
from p2p_trainer.train.trainer import Peer, adopt_state

H = 10


def _state(elapsed_s: float, step_s: float) -> DonorState:
    t = [torch.zeros(2)]
    return DonorState(anchor=t, momentum=t, round=5, round_elapsed_s=elapsed_s, donor_step_s=step_s)


@pytest.mark.parametrize(
    ("elapsed", "donor_step", "own_step", "skip"),
    [
        (0.0, 1.0, 1.0, 0),  # the donor's round just began
        (3.0, 1.0, 1.0, 3),  # 7 s left: 7 steps of 1 s
        (3.5, 1.0, 1.0, 3),  # 6.5 s left: 7 steps end 0.5 s after the donor, not 1 s before
        (3.0, 1.0, 2.0, 6),  # a peer twice as slow does 4 steps (ceil(7 / 2))
        (3.0, 1.0, None, 3),  # a fresh joiner has no step time yet: the donor's is used
        (25.0, 1.0, 1.0, H - 1),  # the donor is past its steps (in its exchange): one step still runs
        (3.0, 0.0, 1.0, 0),  # the donor did not say its step time: no catching up
    ],
)
def test_catch_up_steps(elapsed: float, donor_step: float, own_step: float | None, skip: int) -> None:
    assert catch_up_steps(_state(elapsed, donor_step), H, own_step) == skip


def _peer() -> Peer:
    cfg = RunConfig(
        rounds=3,
        model=ModelConfig(d_model=16, n_layers=1, n_heads=2, seq_len=16),
        data=DataConfig(batch_size=2, val_batches=1),
        inner=InnerConfig(eval_every=0, warmup_steps=1),
        outer=OuterConfig.for_method("independent", num_inner_steps=H),
    )
    corpus = load_corpus(cfg.data, cfg.model.seq_len)
    return Peer(cfg, InProcessSwarm(1, seed=0).exchange(0), corpus, peer_key="p0")


def test_adopted_state_with_skipped_steps_runs_a_shorter_first_round_only() -> None:
    donor, joiner = _peer(), _peer()
    donor.train(2)
    adopt_state(joiner, donor.state, skip_steps=4)
    assert joiner.step == 2 * H + 4  # the schedule (learning rate) is where the donor's is
    first = joiner.run_round()
    assert first.round == 2 and first.round_tokens == (H - 4) * 2 * 16
    second = joiner.run_round()
    assert second.round_tokens == H * 2 * 16 and joiner.step == 4 * H


def test_skip_steps_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="skip_steps"):
        adopt_state(_peer(), _peer().state, skip_steps=H)
