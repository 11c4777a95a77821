"""Stand-ins for a pending exchange in unit tests of the methods."""

from __future__ import annotations

import torch

from p2p_trainer.exchange.interface import Ok


class Finished:
    """A background exchange that is already done and hands back the tensors it was given."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors

    def done(self) -> bool:
        return True

    def result(self, timeout_s: float) -> Ok:
        return Ok(list(self.tensors), group_size=2, total_weight=2.0)
