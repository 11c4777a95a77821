"""The exchange tap records what was sent and returned, and the group check catches a wrong mean."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
import torch

from p2p_trainer.exchange.interface import ExchangeRequest, Failed, Ok
from p2p_trainer.net.exchange_tap import (
    NO_TAP,
    RecordingTap,
    TappedExchange,
    TapRecord,
    TransportCounters,
    read_counters,
    read_tapped,
)
from p2p_trainer.net.network_exchange import NetworkExchange
from p2p_trainer.net.transport import Transport
from tests.integration.tapped_groups import check_group, check_swarm, weighted_mean
from tests.unit.fake_exchanges import LoopTransport

MEMBERS = ["peer-a", "peer-b", "peer-c"]


def test_recording_tap_writes_each_exchange_and_the_counters(tmp_path: Path) -> None:
    tap = RecordingTap(tmp_path, "peer-a", max_records=2)
    req = ExchangeRequest("mix2", 3, gossip_step=1)
    sent, result = torch.arange(5, dtype=torch.float32), torch.full((5,), 2.5)
    tap.record(req, "k1", MEMBERS, 7.0, sent, Ok([result], 3, 21.0, left_out=("b",), own_parts=1))
    tap.record(req, "k2", MEMBERS, 7.0, sent, Failed("late"))
    tap.record(req, "k3", MEMBERS, 7.0, sent, Failed("over the cap"))
    tap.close(TransportCounters(1, 2, 3, 4))
    first, second = read_tapped(tmp_path)
    assert first.record == TapRecord(
        "peer-a", "mix2", 3, 1, "k1", tuple(MEMBERS), 7.0, "float32", True, "", 3, 21.0, 1, ("b",), 0
    )
    assert torch.equal(first.sent, sent) and first.result is not None and torch.equal(first.result, result)
    assert not second.record.ok and second.record.reason == "late" and second.result is None
    assert read_counters(tmp_path) == TransportCounters(1, 2, 3, 4)
    assert not list(tmp_path.glob(".*tmp*")), "no temporary file is left behind"


def test_network_exchange_hands_the_snapshot_and_result_to_the_tap(tmp_path: Path) -> None:
    transport = cast(Transport, SimpleNamespace(peer_id="peer-a"))
    tap = RecordingTap(tmp_path, "peer-a")
    exchange = NetworkExchange(transport, lambda: [], "run", 0, max_weight=10.0, tap=tap)
    x = torch.ones(2, 3)
    pending = exchange.start([x], ExchangeRequest("outer", 0, weight=50.0))
    x.add_(1.0)  # training goes on after the snapshot: the record keeps what was sent
    assert isinstance(pending.result(1.0), Ok)
    pending.result(1.0)  # taken twice, recorded once
    (tapped,) = read_tapped(tmp_path)
    assert tapped.record.members == ("peer-a",) and tapped.record.weight == 10.0  # the bounded weight
    assert torch.equal(tapped.sent, torch.ones(6))
    assert not NO_TAP.enabled


def _group(
    results: list[torch.Tensor], sent: list[torch.Tensor], weights: list[float]
) -> dict[str, TappedExchange]:
    total = sum(weights)
    return {
        m: TappedExchange(
            TapRecord(
                m, "outer", 0, 0, "k", tuple(MEMBERS), w, "float32", True, group_size=3, total_weight=total
            ),
            s,
            r,
        )
        for m, s, r, w in zip(MEMBERS, sent, results, weights, strict=True)
    }


def test_group_check_accepts_the_weighted_mean_and_catches_others() -> None:
    gen = torch.Generator().manual_seed(0)
    sent = [torch.randn(100, generator=gen) for _ in MEMBERS]
    weights = [384.0, 512.0, 384.0]
    mean = weighted_mean(sent, weights)
    checked = check_group("k", _group([mean.clone() for _ in MEMBERS], sent, weights))
    assert checked is not None and checked.weighted and checked.moved and checked.merged == 3
    unweighted = weighted_mean(sent, [1.0, 1.0, 1.0])
    with pytest.raises(AssertionError):
        check_group("k", _group([unweighted.clone() for _ in MEMBERS], sent, weights))
    off = mean.clone()
    off[17] += 1e-5  # one value of one member's result
    with pytest.raises(AssertionError):
        check_group("k", _group([mean.clone(), off, mean.clone()], sent, weights))
    partial = _group([mean.clone() for _ in MEMBERS], sent, weights)
    del partial["peer-c"]  # merged everything, yet a member's contribution was never recorded
    with pytest.raises(AssertionError):
        check_group("k", partial)


@pytest.mark.parametrize(("peers", "group_size", "groups"), [(3, 0, 1), (4, 2, 2)])
def test_recorded_butterfly_exchanges_pass_the_group_check(
    tmp_path: Path, loop: asyncio.AbstractEventLoop, peers: int, group_size: int, groups: int
) -> None:
    ids = [f"peer{i}" for i in range(peers)]
    net: dict[str, LoopTransport] = {}
    for i in ids:
        net[i] = LoopTransport(i, net, loop)
    dirs = [tmp_path / i for i in ids]
    exchanges = [
        NetworkExchange(cast(Transport, net[i]), lambda: ids, "run", 0, tap=RecordingTap(d, i))
        for i, d in zip(ids, dirs, strict=True)
    ]
    gen = torch.Generator().manual_seed(1)
    tensors = [[torch.randn(7, 5, generator=gen), torch.randn(11, generator=gen)] for _ in ids]
    pending = [
        x.start(t, ExchangeRequest("noloco", 2, group_size, weight=100.0 + 28 * k, timeout_s=10.0))
        for k, (x, t) in enumerate(zip(exchanges, tensors, strict=True))
    ]
    assert all(isinstance(p.result(10.0), Ok) for p in pending)
    checked = check_swarm(dirs)
    assert len(checked) == groups
    assert all(c.weighted and c.moved and c.merged == len(c.weights) for c in checked)
