"""The butterfly's sends one at a time (`GroupSpec.send_stall_s`), over an in-memory transport."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import torch

from p2p_trainer.exchange.interface import Ok
from p2p_trainer.net.allreduce import GroupSpec, butterfly_average, turn_order
from p2p_trainer.net.health import PeerHealth
from tests.unit.fake_exchanges import FakeTransport

SEND_S = 0.05


class TimedTransport(FakeTransport):
    """Each send takes SEND_S (one to a `hung` peer never ends); every send's start, and the span
    of every one delivered, is recorded."""

    def __init__(self, peer_id: str, net: dict[str, FakeTransport], hung: set[str], log: list[Any]) -> None:
        super().__init__(peer_id, net, set())
        self.hung, self.log = hung, log
        self.starts: dict[str, float] = {}

    async def send(self, peer: str, header: dict[str, Any], payload: bytes = b"") -> None:
        began = time.monotonic()
        self.starts.setdefault(peer, began)
        if peer in self.hung:
            await asyncio.sleep(3600)
        await asyncio.sleep(SEND_S)
        await super().send(peer, header, payload)
        phase = str(header["key"]).split("|")[1]
        self.log.append((self.peer_id, phase, peer, began, time.monotonic()))


async def _exchange(
    n: int, stall_s: float | None, hung: frozenset[str] = frozenset()
) -> tuple[dict[str, Any], list[Any], dict[str, TimedTransport]]:
    members = [f"peer{i}" for i in range(n)]
    net: dict[str, FakeTransport] = {}
    log: list[Any] = []
    timed = {m: TimedTransport(m, net, set(hung), log) for m in members}
    net.update(timed)
    spec = {"key": "run/outer/0/0/abc", "members": members, "grace_s": 0.3, "result_wait_s": 1.0}

    async def one(i: int) -> Any:
        group = GroupSpec(me=members[i], quorum=n - len(hung), send_stall_s=stall_s, **spec)  # type: ignore[arg-type]
        flat = torch.full((12,), float(i))
        return await butterfly_average(net[members[i]], group, flat, 1.0, time.monotonic() + 10, PeerHealth())  # type: ignore[arg-type]

    alive = [i for i in range(n) if members[i] not in hung]
    results = await asyncio.gather(*(one(i) for i in alive))
    return {members[i]: r for i, r in zip(alive, results, strict=True)}, log, timed


def _spans(log: list[Any], sender: str, phase: str) -> list[tuple[str, float, float]]:
    return sorted((to, a, b) for s, p, to, a, b in log if s == sender and p == phase)


def test_turn_order_starts_after_the_member_itself_and_wraps() -> None:
    assert turn_order(2, [0, 1, 3, 4], 5) == [3, 4, 0, 1]
    assert turn_order(0, [3, 1, 2], 4) == [1, 2, 3]
    assert turn_order(3, [0, 2], 4) == [0, 2]


def test_in_turn_each_member_sends_one_part_at_a_time_in_its_order_and_the_mean_is_exact() -> None:
    results, log, _ = asyncio.run(_exchange(4, stall_s=5.0))
    for res in results.values():  # (0 + 1 + 2 + 3) / 4
        assert isinstance(res, Ok) and res.group_size == 4
        torch.testing.assert_close(res.tensors[0], torch.full((12,), 1.5))
    for i in range(4):
        for phase in ("c", "r"):
            spans = sorted(_spans(log, f"peer{i}", phase), key=lambda s: s[1])
            assert [to for to, _, _ in spans] == [f"peer{(i + k) % 4}" for k in (1, 2, 3)]
            for (_, _, end), (_, start, _) in itertools.pairwise(spans):
                assert start >= end - 1e-3  # the next began only once the one before was delivered


def test_all_at_once_without_a_stall_bound() -> None:
    _, log, _ = asyncio.run(_exchange(4, stall_s=None))
    spans = _spans(log, "peer0", "c")
    assert len(spans) == 3
    assert max(a for _, a, _ in spans) < min(b for _, _, b in spans)  # all three overlapped


def test_a_member_that_never_takes_its_message_holds_the_next_send_back_only_for_the_stall() -> None:
    stall_s = 0.2
    results, log, timed = asyncio.run(_exchange(4, stall_s=stall_s, hung=frozenset({"peer1"})))
    # peer0 sends to peer1 first (it never ends), then to peer2 and peer3
    spans = {to: (a, b) for to, a, b in _spans(log, "peer0", "c")}
    assert set(spans) == {"peer2", "peer3"}
    assert stall_s - 0.02 <= spans["peer2"][0] - timed["peer0"].starts["peer1"] < stall_s + 0.15
    for name, res in results.items():  # the other three still merge with each other (0 + 2 + 3) / 3
        assert isinstance(res, Ok) and res.left_out == ("peer1",) and res.own_parts == 1
        got = res.tensors[0]
        torch.testing.assert_close(torch.cat([got[:3], got[6:]]), torch.full((9,), 5 / 3))
        torch.testing.assert_close(got[3:6], torch.full((3,), float(name[-1])))  # peer1's part: own
