"""The numbers a run ends with: the consensus model against the single peers, and against training
alone. Pure functions of the peers' anchors and losses (`local_swarm.py` reads them from the run
directory)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from p2p_trainer.algo import outer

Anchor = Sequence[torch.Tensor]


def mean_anchor(anchors: Sequence[Anchor]) -> list[torch.Tensor]:
    """The plain mean of the peers' anchors: the consensus model."""
    if not anchors:
        raise ValueError("no anchors to average")
    return outer.weighted_mean(anchors, [1.0] * len(anchors))


@dataclass(frozen=True)
class PeerComparison:
    """The single peers' losses, next to which the consensus's is read."""

    best_peer: str | None
    """The peer whose own model had the lowest validation loss (None: no peer reported one)."""
    best_peer_val_loss: float | None
    mean_peer_val_loss: float | None
    """Mean over the peers that reported a loss."""


def compare_peers(losses: Mapping[str, float | None]) -> PeerComparison:
    """Best and mean of the peers' own validation losses; peers without a loss are left out."""
    known = {peer: loss for peer, loss in losses.items() if loss is not None and math.isfinite(loss)}
    if not known:
        return PeerComparison(None, None, None)
    best = min(known, key=lambda p: (known[p], p))
    return PeerComparison(best, known[best], statistics.fmean(known.values()))


def gain(independent_mean: float | None, consensus: float | None) -> float | None:
    """What joining bought: the independent peers' mean loss minus the swarm's consensus loss
    (positive: the swarm's model is better than training alone)."""
    if independent_mean is None or consensus is None:
        return None
    return independent_mean - consensus
