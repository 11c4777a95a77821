"""The butterfly's quorum, grace window and bounded phase 2, over an in-memory fake transport."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import numpy as np
import pytest
import torch

from p2p_trainer.exchange.codecs import Codec
from p2p_trainer.exchange.interface import Failed, Ok
from p2p_trainer.net.allreduce import GroupSpec, butterfly_average, part_bounds
from p2p_trainer.net.health import PeerHealth
from p2p_trainer.net.transport import Message
from tests.unit.fake_exchanges import FakeTransport

GRACE_S = 0.3


def _spec(members: list[str], me: str, quorum: int) -> GroupSpec:
    return GroupSpec(
        key="run/outer/0/0/abc",
        members=members,
        me=me,
        quorum=quorum,
        quorum_wait_s=5.0,
        grace_s=GRACE_S,
        result_wait_s=1.0,
        view_prefix="run/outer/0/0/",
    )


async def _run(
    n: int,
    dead: set[str],
    quorum: int,
    delays: dict[str, float] | None = None,
    late_seen: dict[str, list[float]] | None = None,
) -> tuple[dict[str, Any], dict[str, float], list[torch.Tensor]]:
    members = [f"peer{i}" for i in range(n)]
    net: dict[str, FakeTransport] = {}
    for m in members:
        net[m] = FakeTransport(m, net, dead)
    flats = [torch.full((10,), float(i)) for i in range(n)]
    elapsed: dict[str, float] = {}

    async def one(i: int) -> Any:
        await asyncio.sleep((delays or {}).get(members[i], 0.0))
        t0 = time.monotonic()
        res = await butterfly_average(
            net[members[i]],  # type: ignore[arg-type]
            _spec(members, members[i], quorum),
            flats[i],
            1.0,
            time.monotonic() + 30,
            PeerHealth(),
            lambda p: p in dead,
            on_late=None if late_seen is None else late_seen.setdefault(members[i], []).append,
        )
        elapsed[members[i]] = time.monotonic() - t0
        return res

    alive = [i for i in range(n) if members[i] not in dead]
    results = await asyncio.gather(*(one(i) for i in alive))
    if late_seen is not None:
        await asyncio.sleep(max((delays or {}).values(), default=0.0))  # the late ones' arrival
    return {members[i]: r for i, r in zip(alive, results, strict=True)}, elapsed, flats


def test_all_alive_gives_the_exact_mean() -> None:
    results, _, _ = asyncio.run(_run(3, set(), quorum=2))
    for res in results.values():
        assert isinstance(res, Ok) and res.own_parts == 0 and res.group_size == 3 and not res.left_out
        torch.testing.assert_close(res.tensors[0], torch.full((10,), 1.0))


def test_dead_member_costs_one_grace_window_and_its_part_stays_own() -> None:
    results, elapsed, flats = asyncio.run(_run(3, {"peer2"}, quorum=2))
    bounds = part_bounds(10, 3)
    for name, res in results.items():
        i = int(name[-1])
        assert isinstance(res, Ok) and res.own_parts == 1 and res.left_out == ("peer2",)
        assert res.late_parts == 0  # the dead partner's part is missing: not this member's lag
        assert elapsed[name] < 2 * GRACE_S + 0.2, elapsed  # not the 30 s deadline
        out = res.tensors[0].numpy()
        for j, (a, b) in enumerate(bounds):
            # survivors' parts are their exact mean; the dead owner's part keeps the own values
            expect = 0.5 if j < 2 else float(flats[i][0])
            np.testing.assert_allclose(out[a:b], expect)


def test_member_stopping_quorum_is_not_waited_for_past_grace() -> None:
    # a pair with quorum 1: the partner is dead, the survivor waits only the grace window
    results, elapsed, _ = asyncio.run(_run(2, {"peer1"}, quorum=1))
    assert isinstance(results["peer0"], Failed)  # nothing merged anywhere: own tensors kept
    assert results["peer0"].missed == 0  # gone, not late: nothing to widen the window for
    assert elapsed["peer0"] < GRACE_S + 0.2


def test_late_member_is_left_out_and_keeps_own_values() -> None:
    results, elapsed, flats = asyncio.run(_run(3, set(), quorum=2, delays={"peer2": 1.5}))
    for name in ("peer0", "peer1"):
        res = results[name]
        assert isinstance(res, Ok) and "peer2" in res.left_out
        assert elapsed[name] < 2 * GRACE_S + 0.2
    late = results["peer2"]
    # peer2's own part had every contribution waiting for it; the others' parts left it out
    assert isinstance(late, Ok) and late.own_parts == 2 and late.late_parts == 2
    assert all(results[n].late_parts == 0 for n in ("peer0", "peer1"))  # type: ignore[union-attr]
    a, b = part_bounds(10, 3)[2]
    np.testing.assert_allclose(late.tensors[0].numpy()[a:b], 1.0)
    np.testing.assert_allclose(late.tensors[0].numpy()[:a], float(flats[2][0]))
    # the punctual owners saw a live member miss their window; the late one found everything there
    assert all(results[n].missed == 1 for n in ("peer0", "peer1"))  # type: ignore[union-attr]
    assert late.missed == 0 and late.arrival_s < 0.1


def test_contributions_after_the_window_are_timed_for_the_next_one() -> None:
    late_seen: dict[str, list[float]] = {}
    asyncio.run(_run(3, set(), quorum=2, delays={"peer2": 1.0}, late_seen=late_seen))
    for name in ("peer0", "peer1"):  # left peer2 out after 0.3 s, then saw it come at ~1.0 s
        assert len(late_seen[name]) == 1 and 1.0 <= late_seen[name][0] < 1.6, late_seen
    assert late_seen.get("peer2", []) == []  # it was the late one: nothing came after its window


def test_a_member_that_never_comes_is_not_timed() -> None:
    late_seen: dict[str, list[float]] = {}
    asyncio.run(_run(2, {"peer1"}, quorum=1, late_seen=late_seen))
    assert late_seen.get("peer0", []) == []


def test_arrival_time_covers_a_members_start_skew() -> None:
    results, _, _ = asyncio.run(_run(2, set(), quorum=2, delays={"peer1": 0.25}))
    early, late = results["peer0"], results["peer1"]
    assert isinstance(early, Ok) and isinstance(late, Ok) and early.missed == late.missed == 0
    assert 0.25 <= early.arrival_s < 0.25 + 0.15  # the partner's skew, plus a fake transfer
    assert late.arrival_s < 0.1


@pytest.mark.parametrize("bad", ["nan", "weight"])
def test_invalid_contribution_is_dropped(bad: str) -> None:
    async def run() -> Any:
        members = ["a", "b"]
        net: dict[str, FakeTransport] = {}
        for m in members:
            net[m] = FakeTransport(m, net, set())
        payload = np.full(5, np.nan if bad == "nan" else 1.0, np.float32).tobytes()
        w = 1e12 if bad == "weight" else 1.0
        net["a"].mailbox.put("run/outer/0/0/abc|c|0|b", Message("b", {"key": "x", "w": w}, payload))
        spec = GroupSpec(**{**_spec(members, "a", 2).__dict__, "max_weight": 100.0})
        return await butterfly_average(
            net["a"],  # type: ignore[arg-type]
            spec,
            torch.zeros(10),
            1.0,
            time.monotonic() + 1.0,
        )

    res = asyncio.run(run())
    # b's contribution never reaches a's part; b itself never answers: nothing merged
    assert isinstance(res, Failed)


class _Died(Exception):
    pass


def test_member_dying_after_contributing_costs_grace_plus_result_wait() -> None:
    async def run() -> tuple[list[Any], list[float]]:
        members = ["a", "b", "c"]
        net: dict[str, FakeTransport] = {}
        for m in members:
            net[m] = FakeTransport(m, net, set())

        def die() -> None:
            raise _Died  # like the self-kill fault point: phase 1 delivered, then nothing

        async def one(name: str, hook: Any) -> tuple[Any, float]:
            t0 = time.monotonic()
            res = await butterfly_average(
                net[name],  # type: ignore[arg-type]
                _spec(members, name, 2),
                torch.full((9,), float(members.index(name))),
                1.0,
                time.monotonic() + 30,
                contributed=hook,
            )
            return res, time.monotonic() - t0

        out = await asyncio.gather(one("a", None), one("b", None), one("c", die), return_exceptions=True)
        assert isinstance(out[2], _Died)
        return [o[0] for o in out[:2]], [o[1] for o in out[:2]]  # type: ignore[index]

    results, elapsed = asyncio.run(run())
    for res, took in zip(results, elapsed, strict=True):
        # c's contribution is merged into a's and b's parts; c's own part never comes back
        assert isinstance(res, Ok) and res.own_parts == 1 and "c" in res.left_out
        assert took < GRACE_S + 1.0 + 0.4, took  # grace + result_wait (1 s), not the 30 s deadline
        np.testing.assert_allclose(res.tensors[0].numpy()[:6], 1.0)  # mean of 0, 1, 2


def test_contributions_already_here_are_merged_though_their_senders_are_suspected_since() -> None:
    """The last member to arrive finds the others' contributions waiting, but its health has
    suspected their senders meanwhile (a failed send elsewhere): it still merges them, and
    everyone ends with the whole mean, instead of the last one merging nothing."""

    async def run() -> dict[str, Any]:
        members = ["a", "b", "c"]
        net: dict[str, FakeTransport] = {}
        for m in members:
            net[m] = FakeTransport(m, net, set())
        suspects = {"c": {"a", "b"}}

        async def one(name: str, delay: float) -> Any:
            await asyncio.sleep(delay)
            return await butterfly_average(
                net[name],  # type: ignore[arg-type]
                _spec(members, name, 3),
                torch.full((9,), float(members.index(name))),
                1.0,
                time.monotonic() + 30,
                PeerHealth(),
                lambda p: p in suspects.get(name, set()),
            )

        out = await asyncio.gather(one("a", 0.0), one("b", 0.0), one("c", 0.5))
        return dict(zip(members, out, strict=True))

    results = asyncio.run(run())
    for name, res in results.items():
        assert isinstance(res, Ok) and res.own_parts == 0 and res.group_size == 3 and not res.left_out, (
            name,
            res,
        )
        np.testing.assert_allclose(res.tensors[0].numpy(), 1.0)


def test_float16_wire_halves_the_bytes_and_every_member_ends_with_the_same_values() -> None:
    async def run() -> list[Any]:
        members = ["a", "b", "c"]
        net: dict[str, FakeTransport] = {}
        for m in members:
            net[m] = FakeTransport(m, net, set())
        # values float16 cannot hold exactly, and one part beyond its range (sent as float32)
        flats = [torch.linspace(0, 1, 12) / 3 + i for i in range(3)]
        flats[2][-1] = 1e6
        spec = dataclasses.replace(
            _spec(members, "a", 3), codec=Codec("float16"), result_codec=Codec("float16")
        )
        return await asyncio.gather(
            *(
                butterfly_average(
                    net[m],  # type: ignore[arg-type]
                    dataclasses.replace(spec, me=m),
                    flats[i],
                    1.0,
                    time.monotonic() + 5,
                )
                for i, m in enumerate(members)
            )
        )

    results = asyncio.run(run())
    assert all(isinstance(r, Ok) and r.group_size == 3 for r in results)
    first = results[0].tensors[0]
    for r in results[1:]:
        assert torch.equal(r.tensors[0], first)  # the owner keeps its part as sent, too
    exact = (torch.linspace(0, 1, 12) / 3 + 1).clone()
    exact[-1] = (1e6 + (1 / 3 + 0) + (1 / 3 + 1)) / 3
    a, b = part_bounds(12, 3)[2]
    torch.testing.assert_close(first[:a], exact[:a], rtol=1e-3, atol=0)  # float16's precision
    # the part with 1e6 comes back as float32: its large value keeps float32's precision
    torch.testing.assert_close(first[b - 1], exact[b - 1], rtol=1e-6, atol=0)
    # per member: 2 contributions and 2 copies of its averaged part, 4 values each, 2 bytes per
    # value, except member c's averaged part (it holds 1e6), which goes as float32
    assert [r.bytes_sent for r in results] == [32, 32, 16 + 2 * 4 * 4]
    # what came in: 2 contributions of 8 bytes, and the 2 other averaged parts, c's as float32
    assert [r.bytes_received for r in results] == [16 + 8 + 16, 16 + 8 + 16, 16 + 8 + 8]


def test_a_part_in_an_unknown_number_format_is_dropped() -> None:
    async def run() -> Any:
        members = ["a", "b"]
        net: dict[str, FakeTransport] = {}
        for m in members:
            net[m] = FakeTransport(m, net, set())
        payload = np.ones(5, np.float16).tobytes()
        header = {"key": "x", "w": 1.0, "dt": "f8"}
        net["a"].mailbox.put("run/outer/0/0/abc|c|0|b", Message("b", header, payload))
        return await butterfly_average(
            net["a"],  # type: ignore[arg-type]  # FakeTransport has the members the butterfly uses
            _spec(members, "a", 2),
            torch.zeros(10),
            1.0,
            time.monotonic() + 1.0,
        )

    assert isinstance(asyncio.run(run()), Failed)


def _with_digests(digests: list[bytes]) -> dict[str, Any]:
    """A full 3-member butterfly whose members send these state digests; each member's result."""
    members = [f"peer{i}" for i in range(len(digests))]
    net: dict[str, FakeTransport] = {}
    for m in members:
        net[m] = FakeTransport(m, net, set())

    async def one(i: int) -> Any:
        spec = dataclasses.replace(_spec(members, members[i], 0), state_digest=digests[i])
        flat = torch.full((10,), float(i))
        return await butterfly_average(net[members[i]], spec, flat, 1.0, time.monotonic() + 30)  # type: ignore[arg-type]

    async def everyone() -> list[Any]:
        return await asyncio.gather(*(one(i) for i in range(len(digests))))

    return dict(zip(members, asyncio.run(everyone()), strict=True))


def test_the_result_says_whether_every_member_sent_the_same_state_digest() -> None:
    same = _with_digests([b"a" * 16] * 3)
    assert all(isinstance(r, Ok) and r.own_parts == 0 and r.agreed for r in same.values())
    # one member's differs: every member learns it, the odd one and the two that agree alike
    one_off = _with_digests([b"a" * 16, b"a" * 16, b"b" * 16])
    assert all(isinstance(r, Ok) and r.own_parts == 0 and not r.agreed for r in one_off.values())
    # no digest sent: nothing is vouched for
    none = _with_digests([b""] * 3)
    assert all(isinstance(r, Ok) and not r.agreed for r in none.values())


def test_an_ask_for_reagreement_reaches_every_other_member_and_only_a_true_one_counts() -> None:
    async def run(flag: object) -> dict[str, Any]:
        members = ["a", "b", "c"]
        net: dict[str, FakeTransport] = {}
        for m in members:
            net[m] = FakeTransport(m, net, set())
        asker = dataclasses.replace(_spec(members, "a", 3), asks_reagree=True)

        async def one(name: str) -> Any:
            spec = asker if name == "a" else _spec(members, name, 3)
            return await butterfly_average(
                net[name],  # type: ignore[arg-type]
                spec,
                torch.full((9,), float(members.index(name))),
                1.0,
                time.monotonic() + 30,
            )

        if flag is not True:  # a sender that writes something else than true under "ra"
            net["a"].send = _rewriting(net["a"].send, flag)  # type: ignore[method-assign]
        out = await asyncio.gather(*(one(m) for m in members))
        return dict(zip(members, out, strict=True))

    results = asyncio.run(run(True))
    assert all(isinstance(r, Ok) and r.own_parts == 0 for r in results.values())
    assert [results[m].reagree_asked for m in ("a", "b", "c")] == [False, True, True]
    for bogus in (1, "yes", [True]):
        results = asyncio.run(run(bogus))
        assert not any(r.reagree_asked for r in results.values()), bogus


def _rewriting(send: Any, value: object) -> Any:
    async def rewritten(peer: str, header: dict[str, Any], payload: bytes = b"") -> None:
        if "ra" in header:
            header = {**header, "ra": value}
        await send(peer, header, payload)

    return rewritten
