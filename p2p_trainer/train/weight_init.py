"""The decoders' initial weights: GPT-2's scheme, one function for both architectures."""

from __future__ import annotations

import math

from torch import nn


def init_transformer_weights(model: nn.Module, n_layers: int, residual_projections: tuple[str, ...]) -> None:
    """GPT-2's initialisation, shared by both decoders: every linear and embedding weight from
    N(0, 0.02), then the projections that write into the residual stream (parameter names ending
    in `residual_projections`) scaled down by depth, so the residual stream stays O(1)."""

    def normal(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    model.apply(normal)  # children before parents: the order, and so the weights, of every seed
    for name, p in model.named_parameters():
        if name.endswith(residual_projections):
            nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layers))
