"""Where the outer state lives: on the host, in fp32, when the model trains on an accelerator.

The outer step (docs/algorithms.md §1–§3) touches φ, m and θ once per round, while the inner
steps touch θ every step. With `outer.offload` on (`"auto"` with a CUDA device), φ and m stay in
host memory, so the GPU holds only the model and AdamW's moments, and a background exchange of
φ (Mix1, the re-agreement) reads host memory and never waits on the GPU's queue. θ crosses the
bus twice per round, through one pinned fp32 staging copy (`HostMirror.fast`):

- `pull`, before the outer step: device → pinned host copies queued without blocking, then a
  CUDA event recorded behind them is waited for. The event covers only this stream's work up to
  the copies: the training thread does not wait for a device-wide synchronisation, and other
  peers sharing the device keep running.
- `push`, after it: host → device copies queued without blocking and not waited for. The next
  forward is queued on the same stream behind them, so it reads the new θ; the staging buffer is
  not written again before the next `pull` has waited for its event, which lies behind these
  copies.

φ and m are plain (pageable) host memory: they never cross the bus in the loop (the outer step
reads and writes them on the host, the exchanges read them there), so pinning them would only
lock memory. On the CPU, or with offload off, `pull` hands back the parameters themselves and
`push` does nothing: the same code runs, with no extra copy of the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from p2p_trainer.algo.methods import OuterState


def offloads(mode: str, device: torch.device) -> bool:
    """Whether the outer state lives on the host (`outer.offload`): "on" with the model on any
    accelerator, "auto" with it on a CUDA device; never on the CPU, where host memory is all there is."""
    if device.type == "cpu" or mode == "off":
        return False
    return mode == "on" or device.type == "cuda"


class HostMirror:
    """θ as the outer step sees it, and the device the outer state is kept on (see the module)."""

    def __init__(self, params: list[torch.Tensor], offload: bool) -> None:
        self.params = params
        self.device = params[0].device if params else torch.device("cpu")
        # `offloads` decides; a CPU model told to offload anyway takes the staging path with
        # synchronous copies, which is how the tests check it without a GPU
        self.offload = offload
        # only CUDA copies from pinned memory are asynchronous; elsewhere the copies block
        self.cuda = self.offload and self.device.type == "cuda"
        self.fast: list[torch.Tensor] = (
            [torch.empty(p.shape, dtype=torch.float32, pin_memory=self.cuda) for p in params]
            if self.offload
            else params
        )

    @property
    def state_device(self) -> torch.device:
        """Where φ, m and the exchanged tensors live."""
        return torch.device("cpu") if self.offload else self.device

    def memory(self, state: OuterState) -> OuterMemory:
        staging = tensor_bytes(self.fast) if self.offload else 0
        return OuterMemory(
            tensor_bytes(state.anchor), tensor_bytes(state.momentum), staging, self.state_device.type
        )

    def pull(self) -> list[torch.Tensor]:
        """θ on `state_device`, up to date: the parameters themselves without offload."""
        if not self.offload:
            return self.params
        with torch.no_grad():
            for host, p in zip(self.fast, self.params, strict=True):
                host.copy_(p.detach(), non_blocking=self.cuda)
        if self.cuda:
            done = torch.cuda.Event()
            done.record()
            done.synchronize()  # this stream up to the copies, not the whole device
        return self.fast

    def push(self) -> None:
        """θ ← the staging copy (written by the outer step), queued behind the inner steps' work."""
        if not self.offload:
            return
        with torch.no_grad():
            for p, host in zip(self.params, self.fast, strict=True):
                p.copy_(host, non_blocking=self.cuda)


def tensor_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class OuterMemory:
    """Bytes the outer state adds to the model's own, and the device type they live on."""

    anchor: int
    momentum: int
    staging: int
    """θ's pinned copy for the outer step (offload only)."""
    where: str

    @property
    def total(self) -> int:
        return self.anchor + self.momentum + self.staging
