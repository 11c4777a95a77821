"""§5: each exchange carries the tokens behind the tensor it sends."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from p2p_trainer.config import DataConfig, InnerConfig, ModelConfig, OuterConfig, RunConfig
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.exchange.interface import Exchange, ExchangeRequest, ExchangeResult, PendingExchange
from p2p_trainer.train.data import load_corpus
from p2p_trainer.train.trainer import Peer, adopt_state

H, BATCH, SEQ = 6, 2, 16
ROUND_TOKENS = H * BATCH * SEQ


class _Recording:
    """The in-process exchange of a one-peer swarm, keeping every request it was given."""

    def __init__(self, inner: Exchange) -> None:
        self.inner = inner
        self.requests: list[ExchangeRequest] = []

    def average(self, tensors: Sequence[torch.Tensor], request: ExchangeRequest) -> ExchangeResult:
        self.requests.append(request)
        return self.inner.average(tensors, request)

    def start(self, tensors: Sequence[torch.Tensor], request: ExchangeRequest) -> PendingExchange:
        self.requests.append(request)
        return self.inner.start(tensors, request)

    def num_live_peers(self) -> int:
        return self.inner.num_live_peers()

    def close(self) -> None:
        self.inner.close()


def _peer(method: str) -> tuple[Peer, _Recording]:
    cfg = RunConfig(
        rounds=3,
        model=ModelConfig(d_model=16, n_layers=1, n_heads=2, seq_len=SEQ),
        data=DataConfig(batch_size=BATCH, val_batches=1),
        inner=InnerConfig(eval_every=0, warmup_steps=1),
        outer=OuterConfig.for_method(method, num_inner_steps=H, align_rounds=False),
    )
    recording = _Recording(InProcessSwarm(1, seed=0).exchange(0))
    return Peer(cfg, recording, load_corpus(cfg.data, SEQ), peer_key="p0"), recording


def _weights(rec: _Recording, tag: str) -> list[float]:
    return [r.weight for r in rec.requests if r.tag == tag]


def test_mix1_weighs_an_anchor_by_the_tokens_of_the_round_that_made_it() -> None:
    peer, rec = _peer("factored")
    peer.train(3)
    # round 0's anchor is the shared initialisation: no tokens behind it, weight 1
    assert _weights(rec, "mix1") == [1.0, float(ROUND_TOKENS), float(ROUND_TOKENS)]
    assert _weights(rec, "mix2") == [float(ROUND_TOKENS)] * 3


def test_a_shortened_round_counts_its_own_tokens_in_both_mixes() -> None:
    donor, _ = _peer("factored")
    donor.train(1)
    peer, rec = _peer("factored")
    adopt_state(peer, donor.state, skip_steps=2)  # a late joiner's first round has H − 2 steps
    peer.train(2)
    short = float((H - 2) * BATCH * SEQ)
    assert _weights(rec, "mix2") == [short, float(ROUND_TOKENS)]
    assert _weights(rec, "mix1")[1] == short


def test_diloco_and_noloco_weigh_the_round_they_end() -> None:
    for method, tag in (("diloco", "outer"), ("noloco", "noloco")):
        peer, rec = _peer(method)
        peer.train(2)
        assert _weights(rec, tag) == [float(ROUND_TOKENS)] * 2, method
