"""Constant work per round (docs/algorithms.md §6): survivors take over the quota of the peers that left."""

from __future__ import annotations

import pytest

from p2p_trainer.algo.work import WorkQuota, micro_batch_tokens, share_of
from p2p_trainer.config import ConfigError, DataConfig, InnerConfig, ModelConfig, OuterConfig, RunConfig
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.train.data import load_corpus
from p2p_trainer.train.trainer import Peer

H = 4


def _cfg(target_micro_batches: int, method: str = "independent") -> RunConfig:
    model = ModelConfig(d_model=16, n_layers=1, n_heads=2, seq_len=16)
    data = DataConfig(batch_size=2, val_batches=1)
    return RunConfig(
        rounds=6,
        model=model,
        data=data,
        inner=InnerConfig(eval_every=0, warmup_steps=1),
        outer=OuterConfig.for_method(
            method, num_inner_steps=H, target_tokens_per_round=target_micro_batches * 2 * 16
        ),
    )


@pytest.mark.parametrize("total", [16, 17, 50, 101])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_shares_of_one_view_add_up_to_the_target(total: int, n: int) -> None:
    live = [f"p{i}" for i in range(n)]
    shares = [share_of(p, list(reversed(live)), total) for p in live]
    assert sum(shares) == total
    assert max(shares) - min(shares) <= 1


def test_a_peer_tops_up_in_the_steps_left_when_a_peer_vanishes_mid_round() -> None:
    live = ["a", "b", "c", "d"]
    quota = WorkQuota(_cfg(16), "a", lambda: live)
    quota.begin_round()
    taken = [quota.next_step(0), quota.next_step(1)]  # 4 live: share 4, one per step
    live.remove("d")  # share becomes 6 (16 = 6 + 5 + 5): the two remaining steps take 4
    taken += [quota.next_step(2), quota.next_step(3)]
    assert taken == [1, 1, 2, 2]
    assert sum(taken) == share_of("a", live, 16)


def test_no_target_keeps_grad_accum() -> None:
    cfg = RunConfig(inner=InnerConfig(grad_accum=3))
    quota = WorkQuota(cfg, "a", lambda: ["a", "b"])
    quota.begin_round()
    assert [quota.next_step(s) for s in range(cfg.outer.num_inner_steps)] == [3] * cfg.outer.num_inner_steps


def test_target_below_one_micro_batch_per_step_is_refused() -> None:
    with pytest.raises(ConfigError, match="target_tokens_per_round"):
        _cfg(H - 1)


def test_swarm_tokens_per_round_stay_at_the_target_as_peers_leave() -> None:
    """4 peers, then 3, then 2: every round the swarm processes T tokens (±5%; exactly, here)."""
    cfg = _cfg(16)
    target = cfg.outer.target_tokens_per_round
    corpus = load_corpus(cfg.data, cfg.model.seq_len)
    swarm = InProcessSwarm(4, cfg.seed)
    live = list(swarm.names)
    peers = [
        Peer(cfg, swarm.exchange(i), corpus, peer_key=swarm.names[i], live_peers=lambda: list(live))
        for i in range(4)
    ]
    per_round: list[int] = []
    for rnd in range(cfg.rounds):
        if rnd in (2, 4):
            live.pop()  # the last peer "dies" before this round
        members = [p for p in peers if p.work.me in live]
        per_round.append(sum(p.run_round().round_tokens for p in members))
    assert all(abs(t - target) / target <= 0.05 for t in per_round), (per_round, target)
    assert per_round == [target] * cfg.rounds
    assert target == 16 * micro_batch_tokens(cfg)
