"""Error feedback for lossy codecs (docs/algorithms.md §7) and the tensor side of the codecs.

A peer that sends its update c through a lossy codec Q delivers Q(c + β_e·e) and keeps
e ← (c + β_e·e) − Q(c + β_e·e) (β_e = 1 by default): what rounding or sparsification dropped this time is added to the next
contribution, so over rounds nothing is lost, only delayed. The residual is kept per exchange tag
and gossip step over the whole flattened vector, not per part or group, so it survives changes of
group and of part ownership; the codecs' grid makes Q of the whole vector equal to the parts
each encoded alone (`codecs.py`), which is what lets the peer know Q(c + e) without asking.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from p2p_trainer.exchange.codecs import Codec


def flatten(tensors: Sequence[torch.Tensor]) -> np.ndarray:
    """One float32 vector of the tensors in order, as both backends lay them out."""
    if not tensors:
        return np.zeros(0, np.float32)
    return torch.cat([t.detach().to("cpu", torch.float32).reshape(-1) for t in tensors]).numpy()


def unflatten(flat: np.ndarray, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    out, offset = [], 0
    for t in like:
        part = torch.from_numpy(np.array(flat[offset : offset + t.numel()], dtype=np.float32))
        out.append(part.view(t.shape).to(t.device, t.dtype))
        offset += t.numel()
    return out


def as_sent(tensors: Sequence[torch.Tensor], codec: Codec, k: int | None = None) -> list[torch.Tensor]:
    """The tensors as a receiver decodes them from `codec` (the same shapes and dtypes)."""
    return unflatten(codec.roundtrip(flatten(tensors), k), tensors)


class ErrorFeedback:
    """One peer's residuals e, by (tag, gossip step)."""

    def __init__(self, decay: float = 1.0) -> None:
        self.decay = decay
        """β_e: the share of the residual carried into the next contribution."""
        self._residual: dict[tuple[str, int], np.ndarray] = {}

    def contribution(self, key: tuple[str, int], tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """c + β_e · e: what this peer sends this time."""
        residual = self._residual.get(key)
        if residual is None:
            return list(tensors)
        return unflatten(flatten(tensors) + np.float32(self.decay) * residual, tensors)

    def delivered(self, key: tuple[str, int], sent: Sequence[torch.Tensor], codec: Codec) -> None:
        """`sent` (c + e) went out through `codec`: keep what it dropped for the next time."""
        flat = flatten(sent)
        self._residual[key] = flat - codec.roundtrip(flat)

    def norm(self, key: tuple[str, int]) -> float:
        """|e| for `key` (0 before its first delivery): how much is still owed to the group."""
        residual = self._residual.get(key)
        return 0.0 if residual is None else float(np.linalg.norm(residual))
