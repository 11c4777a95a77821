"""Outer-step math of every method in docs/algorithms.md: pure functions, tensors in, tensors out.

All functions take lists of tensors (one entry per parameter tensor) and return new tensors;
nothing here mutates its inputs, talks to the network or reads the clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

Tensors = Sequence[torch.Tensor]


def pseudo_grad(anchor: Tensors, fast: Tensors) -> list[torch.Tensor]:
    """Δ = φ − θ (§ Notation): points uphill like a gradient; the outer step subtracts it."""
    return [phi - theta for phi, theta in zip(anchor, fast, strict=True)]


def check_weights(weights: Sequence[float]) -> None:
    """§5: weights must be finite and > 0; raise with the offending index otherwise."""
    if not weights:
        raise ValueError("a group mean needs at least one contribution")
    for i, w in enumerate(weights):
        if not (isinstance(w, int | float) and math.isfinite(w) and w > 0):
            raise ValueError(f"weight {i} is {w!r}: weights must be finite and > 0")


def weighted_mean(contributions: Sequence[Tensors], weights: Sequence[float]) -> list[torch.Tensor]:
    """mean_G(x) = Σ_j w_j x_j / Σ_j w_j over the group's contributions (one tensor list each)."""
    check_weights(weights)
    if len(contributions) != len(weights):
        raise ValueError(f"{len(contributions)} contributions but {len(weights)} weights")
    total = float(sum(weights))
    out = []
    for parts in zip(*contributions, strict=True):
        acc = torch.zeros_like(parts[0], dtype=torch.float32)
        for w, x in zip(weights, parts, strict=True):
            acc.add_(x.float(), alpha=w / total)
        out.append(acc.to(parts[0].dtype))
    return out


def _unit(x: torch.Tensor) -> torch.Tensor:
    norm = x.norm()
    return x / norm if norm > 0 else torch.zeros_like(x)


def rda_mean(contributions: Sequence[Tensors], weights: Sequence[float]) -> list[torch.Tensor]:
    """Radial-directional averaging (§5), per tensor:

    merged = (Σ w‖v‖ / Σ w) · unit(Σ w · unit(v) / Σ w)

    The norm is the weighted mean norm, so nearly orthogonal updates do not shrink the merge.
    """
    check_weights(weights)
    total = float(sum(weights))
    out = []
    for parts in zip(*contributions, strict=True):
        xs = [x.float() for x in parts]
        radius = sum(w * float(x.norm()) for w, x in zip(weights, xs, strict=True)) / total
        direction = sum(w * _unit(x) for w, x in zip(weights, xs, strict=True)) / total
        out.append((radius * _unit(torch.as_tensor(direction))).to(parts[0].dtype))
    return out


def nesterov_outer_step(
    anchor: Tensors, momentum: Tensors, delta: Tensors, outer_lr: float, outer_momentum: float
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """DiLoCo's outer step (§1), also factored mixing's (§3) with anchor = φ̂ and delta = Δ̂.

    m ← β m + Δ;  φ ← φ − α (Δ + β m)   (identical to torch.optim.SGD(nesterov=True), dampening 0)
    """
    new_m = [outer_momentum * m + d for m, d in zip(momentum, delta, strict=True)]
    new_phi = [
        phi - outer_lr * (d + outer_momentum * m) for phi, d, m in zip(anchor, delta, new_m, strict=True)
    ]
    return new_phi, new_m


def noloco_outer_step(
    anchor: Tensors,
    momentum: Tensors,
    mean_descent: Tensors,
    mean_anchor: Tensors,
    outer_lr: float,
    outer_momentum: float,
    gamma: float,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """NoLoCo (§2), general form with the γ term.

    Δ̄_G = mean_G(θ_j − φ_j) (descent direction), φ̄_G = mean_G(φ_j):
    m ← β m + α Δ̄_G + γ (φ̄_G − φ);  φ ← φ + m
    """
    new_m = [
        outer_momentum * m + outer_lr * d + gamma * (pbar - phi)
        for m, d, pbar, phi in zip(momentum, mean_descent, mean_anchor, anchor, strict=True)
    ]
    new_phi = [phi + m for phi, m in zip(anchor, new_m, strict=True)]
    return new_phi, new_m


def noloco_shortcut_step(
    anchor: Tensors, momentum: Tensors, mean_fast: Tensors, outer_lr: float, outer_momentum: float
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """NoLoCo with γ = α (§2): m ← β m + α (mean_G(θ) − φ);  φ ← φ + m.

    Needs only the group mean of the fast weights: 1× the model on the wire per round.
    """
    new_m = [
        outer_momentum * m + outer_lr * (tbar - phi)
        for m, tbar, phi in zip(momentum, mean_fast, anchor, strict=True)
    ]
    new_phi = [phi + m for phi, m in zip(anchor, new_m, strict=True)]
    return new_phi, new_m


def consensus_distance(anchors: Sequence[Tensors]) -> float:
    """§8: mean_i ‖φ_i − φ̄‖ / ‖φ̄‖ over peers, each peer's tensors flattened into one vector."""
    flat = [torch.cat([t.float().reshape(-1) for t in a]) for a in anchors]
    center = torch.stack(flat).mean(dim=0)
    denom = float(center.norm())
    if denom == 0:
        return 0.0
    return float(sum(float((f - center).norm()) for f in flat) / len(flat) / denom)
