"""The ideal collaboration: exact data-parallel training of N peers in one process, no network.

Peer k reads stream `slot{k}`, as in every WAN arm; gradients are averaged over all N every step
(the in-process backend: exact, instant). It runs for a given number of steps (the bench: the
independent arm's median step count at the budget), on the same schedule shape, so its loss is
what N peers' compute would reach if communication were free: L_ideal in the fraction of ideal
collaboration retained (bench/wan/budget.py).
"""

from __future__ import annotations

import dataclasses

import torch

from p2p_trainer.config import OuterConfig, RunConfig
from p2p_trainer.run.threads import run_inprocess


def ideal_config(cfg: RunConfig, steps: int, anneal: bool) -> RunConfig:
    """Data-parallel (a round is one step) for `steps` steps; with `anneal`, the cosine ends there."""
    outer = OuterConfig.for_method("data-parallel", num_inner_steps=1)
    inner = cfg.inner if anneal else dataclasses.replace(cfg.inner, min_lr_ratio=1.0)
    return dataclasses.replace(cfg, outer=outer, inner=inner, rounds=max(1, steps))


def run_ideal(cfg: RunConfig, peers: int, steps: int) -> tuple[list[torch.Tensor], int]:
    """Train `peers` data-parallel peers for `steps` steps (`cfg` from `ideal_config`); returns the
    model (every peer holds the same) and the tokens all peers processed."""
    one_per_step = dataclasses.replace(cfg, rounds=max(1, steps))  # as ideal_config: a round is a step
    res = run_inprocess(one_per_step, peers, torch_threads=torch.get_num_threads(), data_key="slot")
    return [t.detach().clone() for t in res.anchors[0]], res.tokens
