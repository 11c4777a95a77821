"""Butterfly all-reduce of one flat float vector within a group, over `Transport` messages.

Member i owns part i of the vector. Phase 1: every member sends part j of its contribution (with
its weight) to member j. Each owner checks every contribution (size, finiteness, weight bounds)
before it merges anything, and averages what arrived by the deadline. Phase 2: owners send the
averaged part to every member. Per member and exchange, 2·(n−1)/n of the vector goes each way,
as in hivemind's all-reduce; a pair moves exactly one model each way.

The result is complete or it is `Failed`: a part that did not come back fails the exchange
(hivemind can return a silently partial average; see HIVEMIND_NOTES.md), and the caller's
tensors are never touched.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from p2p_trainer.exchange import ExchangeResult, Failed, Ok, valid_weight
from p2p_trainer.net.transport import Message, Transport

logger = logging.getLogger(__name__)


def part_bounds(numel: int, n: int) -> list[tuple[int, int]]:
    base, extra = divmod(numel, n)
    bounds, start = [], 0
    for j in range(n):
        size = base + (1 if j < extra else 0)
        bounds.append((start, start + size))
        start += size
    return bounds


@dataclass(frozen=True)
class GroupSpec:
    key: str
    """Unique per exchange and member list: peers with different views never mix."""
    members: list[str]
    me: str
    max_weight: float = math.inf


def _check(msg: Message | None, expected_floats: int, max_weight: float) -> tuple[np.ndarray, float] | str:
    if msg is None:
        return "did not arrive before the deadline"
    weight = msg.header.get("w")
    if not isinstance(weight, int | float) or not valid_weight(float(weight), max_weight):
        return f"weight {weight!r} is not finite, positive and <= {max_weight}"
    if len(msg.payload) != 4 * expected_floats:
        return f"{len(msg.payload)} bytes, expected {4 * expected_floats}"
    values = np.frombuffer(msg.payload, dtype=np.float32)
    if not np.isfinite(values).all():
        return "non-finite values"
    return values, float(weight)


async def send_with_retries(
    transport: Transport, peer: str, header: dict[str, object], payload: bytes, deadline: float
) -> bool:
    """Deliver one message before `deadline`, retrying with backoff.

    A peer that just joined may not be routable for a few seconds (libp2p routing warms up); a
    member that stays unreachable is a missing contribution, not a crash.
    """
    delay_s = 0.25
    while True:
        try:
            await transport.send(peer, header, payload)
            return True
        except Exception as exc:  # p2pd reports unreachable peers with several error types
            if time.monotonic() + delay_s >= deadline:
                logger.info("send to %s failed for good: %s", peer[-8:], str(exc).splitlines()[0])
                return False
            await asyncio.sleep(delay_s)
            delay_s = min(2.0, 2 * delay_s)


async def butterfly_average(
    transport: Transport, group: GroupSpec, flat: torch.Tensor, weight: float, deadline: float
) -> ExchangeResult:
    started = time.monotonic()
    n, me = len(group.members), group.members.index(group.me)
    bounds = part_bounds(flat.numel(), n)
    data = flat.detach().to(torch.float32).contiguous().numpy()
    others = [j for j in range(n) if j != me]
    # phase 1 sends the others' parts and receives n−1 copies of mine; phase 2 the reverse
    moved = 4 * (sum(bounds[j][1] - bounds[j][0] for j in others) + (n - 1) * (bounds[me][1] - bounds[me][0]))

    async def send(j: int, phase: str, part: int, payload: bytes, header_extra: dict[str, float]) -> None:
        header = {"key": f"{group.key}|{phase}|{part}", **header_extra}
        await send_with_retries(transport, group.members[j], header, payload, deadline)

    lo, hi = bounds[me]
    phase1 = [
        asyncio.create_task(send(j, "c", j, data[bounds[j][0] : bounds[j][1]].tobytes(), {"w": weight}))
        for j in others
    ]
    acc, total_w, contributors = data[lo:hi].astype(np.float64) * weight, weight, 1
    for j in others:
        remaining = deadline - time.monotonic()
        msg = await transport.mailbox.get(f"{group.key}|c|{me}|{group.members[j]}", remaining)
        checked = _check(msg, hi - lo, group.max_weight)
        if isinstance(checked, str):
            logger.warning("contribution of %s to %s dropped: %s", group.members[j][-8:], group.key, checked)
            continue
        values, w = checked
        acc += values.astype(np.float64) * w
        total_w += w
        contributors += 1
    mine = (acc / total_w).astype(np.float32)
    phase2 = [
        asyncio.create_task(send(j, "r", me, mine.tobytes(), {"w": total_w, "n": contributors}))
        for j in others
    ]
    out = np.empty_like(data)
    out[lo:hi] = mine
    min_contributors = contributors
    for j in others:
        msg = await transport.mailbox.get(
            f"{group.key}|r|{j}|{group.members[j]}", deadline - time.monotonic()
        )
        a, b = bounds[j]
        checked = _check(msg, b - a, math.inf)
        if isinstance(checked, str):
            await asyncio.gather(*phase1, *phase2)
            transport.mailbox.discard(group.key)
            return Failed(
                f"averaged part {j} from {group.members[j][-8:]} {checked}", time.monotonic() - started
            )
        out[a:b] = checked[0]
        n_part = msg.header.get("n") if msg is not None else 0
        min_contributors = min(min_contributors, n_part if isinstance(n_part, int) else 0)
    await asyncio.gather(*phase1, *phase2)
    transport.mailbox.discard(group.key)
    return Ok(
        [torch.from_numpy(out)],
        group_size=min_contributors,
        total_weight=total_w,
        bytes_sent=moved,
        bytes_received=moved,
        elapsed_s=time.monotonic() - started,
    )
