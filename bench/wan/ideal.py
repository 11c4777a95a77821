"""The ideal collaboration: exact data-parallel training of N peers in one process, no network.

Peer k reads stream `slot{k}`, as in every WAN arm; gradients are averaged over all N every step
(the in-process backend: exact, instant). It runs for a given number of steps (the bench: the
independent arm's median step count at the budget), on the same schedule shape, so its loss is
what N peers' compute would reach if communication were free: L_ideal in the fraction of ideal
collaboration retained (bench/wan/budget.py).
"""

from __future__ import annotations

import dataclasses
import threading

import torch

from p2p_trainer.config import OuterConfig, RunConfig
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.train.data import load_corpus
from p2p_trainer.train.trainer import Peer


def ideal_config(cfg: RunConfig, steps: int, anneal: bool) -> RunConfig:
    """Data-parallel (a round is one step) for `steps` steps; with `anneal`, the cosine ends there."""
    outer = OuterConfig.for_method("data-parallel", num_inner_steps=1)
    inner = cfg.inner if anneal else dataclasses.replace(cfg.inner, min_lr_ratio=1.0)
    return dataclasses.replace(cfg, outer=outer, inner=inner, rounds=max(1, steps))


def run_ideal(cfg: RunConfig, peers: int, steps: int) -> tuple[list[torch.Tensor], int]:
    """Train `peers` data-parallel peers for `steps` steps (`cfg` from `ideal_config`); returns the
    model (every peer holds the same) and the tokens all peers processed."""
    corpus = load_corpus(cfg.data, cfg.model.seq_len)
    swarm = InProcessSwarm(peers, cfg.seed)
    group = [Peer(cfg, swarm.exchange(i), corpus, peer_key=f"slot{i}") for i in range(peers)]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            group[i].train(steps)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
            swarm.leave(i)

    threads = [threading.Thread(target=work, args=(i,), name=f"ideal{i}") for i in range(peers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [t.detach().clone() for t in group[0].params], sum(p.tokens for p in group)
