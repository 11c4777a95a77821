"""Stand-ins for a pending exchange (unit tests of the methods) and for a transport (of the butterfly)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import torch

from p2p_trainer.exchange.interface import Ok
from p2p_trainer.net.transport import Mailbox, Message

T = TypeVar("T")


class Finished:
    """A background exchange that is already done and hands back the tensors it was given."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.tensors = tensors

    def done(self) -> bool:
        return True

    def result(self, timeout_s: float) -> Ok:
        return Ok(list(self.tensors), group_size=2, total_weight=2.0)


class FakeTransport:
    """Delivers straight into the receiver's mailbox; sends to a dead peer raise like p2pd does.

    It has the members the butterfly uses (`send`, `mailbox`), but Transport is a concrete class,
    not a Protocol: callers pass it with `# type: ignore[arg-type]`."""

    def __init__(self, peer_id: str, net: dict[str, FakeTransport], dead: set[str]) -> None:
        self.peer_id, self.net, self.dead = peer_id, net, dead
        self.mailbox = Mailbox()

    async def send(self, peer: str, header: dict[str, Any], payload: bytes = b"") -> None:
        await asyncio.sleep(0.001)
        if peer in self.dead:
            raise ConnectionError(f"{peer} refused")
        self.net[peer].mailbox.put(f"{header['key']}|{self.peer_id}", Message(self.peer_id, header, payload))


class LoopTransport:
    """In-memory transport on one shared event loop: enough of `Transport` for `NetworkExchange`."""

    def __init__(self, peer_id: str, net: dict[str, LoopTransport], loop: asyncio.AbstractEventLoop) -> None:
        self.peer_id, self.net, self.loop = peer_id, net, loop
        self.mailbox = Mailbox()

    async def send(self, peer: str, header: dict[str, Any], payload: bytes = b"") -> None:
        await asyncio.sleep(0.001)
        self.net[peer].mailbox.put(f"{header['key']}|{self.peer_id}", Message(self.peer_id, header, payload))

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)
