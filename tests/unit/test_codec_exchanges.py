"""Lossy codecs inside the exchanges: the butterfly and the in-process backend agree, and a
method's error feedback carries what the codec dropped into its next contribution."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
import torch

from p2p_trainer.algo.methods import OuterState, RoundReport, build_method
from p2p_trainer.config import ExchangeConfig, OuterConfig
from p2p_trainer.exchange.codecs import FLOAT32, Codec
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.exchange.interface import ALL, ExchangeRequest, ExchangeResult, Ok
from p2p_trainer.net.allreduce import GroupSpec, butterfly_average
from tests.unit.fake_exchanges import FakeTransport

MEMBERS = ["peer0", "peer1", "peer2"]
SIZE = 4096 * 3 + 500


def _contributions(size: int = SIZE) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randn(size, generator=gen) * 1e-2 * (i + 1) for i in range(len(MEMBERS))]


def _butterfly(codec: Codec, results: Codec, flats: list[torch.Tensor]) -> list[ExchangeResult]:
    async def run() -> list[ExchangeResult]:
        net: dict[str, FakeTransport] = {}
        for m in MEMBERS:
            net[m] = FakeTransport(m, net, set())
        spec = GroupSpec(
            key="run/mix2/0/0/abc",
            members=MEMBERS,
            me=MEMBERS[0],
            quorum_wait_s=5.0,
            grace_s=0.5,
            result_wait_s=1.0,
            view_prefix="run/mix2/0/0/",
            codec=codec,
            result_codec=results,
        )
        return await asyncio.gather(
            *(
                butterfly_average(
                    net[m],  # type: ignore[arg-type]
                    GroupSpec(**{**spec.__dict__, "me": m}),
                    flats[i],
                    1.0,
                    time.monotonic() + 10,
                )
                for i, m in enumerate(MEMBERS)
            )
        )

    return asyncio.run(run())


def _inprocess(codec: Codec, results: Codec, flats: list[torch.Tensor]) -> list[ExchangeResult]:
    swarm = InProcessSwarm(len(MEMBERS), seed=0)
    req = ExchangeRequest("mix2", 0, ALL, 1.0, codec=codec, result_codec=results)
    out: list[ExchangeResult | None] = [None] * len(MEMBERS)

    def peer(i: int) -> None:
        out[i] = swarm.exchange(i).average([flats[i]], req)

    threads = [threading.Thread(target=peer, args=(i,)) for i in range(len(MEMBERS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(r is not None for r in out)
    return [r for r in out if r is not None]


CASES = [
    (Codec("int8", 128), FLOAT32),
    (Codec("int4", 128), Codec("int8", 128)),
    (Codec("topk", 4096, 1 / 64), Codec("topk", 4096, 1 / 64)),
    (Codec("topk", 4096, 1 / 64), Codec("float16")),
]


@pytest.mark.parametrize(("codec", "results"), CASES, ids=lambda c: c.name)
def test_network_and_inprocess_means_agree_under_a_lossy_codec(codec: Codec, results: Codec) -> None:
    flats = _contributions()
    net, ref = _butterfly(codec, results, flats), _inprocess(codec, results, flats)
    assert all(isinstance(r, Ok) and r.group_size == 3 and not r.own_parts for r in net + ref)
    first = net[0].tensors[0]  # type: ignore[union-attr]
    for r in net + ref:
        # identical on every member; the backends differ only by float64 vs float32 summation
        torch.testing.assert_close(r.tensors[0], first, rtol=0, atol=2e-6)  # type: ignore[union-attr]
    exact = torch.stack(flats).mean(0)
    # the mean of what the codec delivers, not the exact mean: a lossy codec changes the values
    assert not torch.allclose(first, exact, atol=1e-6)
    if codec.name == "int8":
        torch.testing.assert_close(first, exact, rtol=0, atol=float(exact.abs().max()) / 50)


def test_a_topk_exchange_moves_far_fewer_bytes_than_float32() -> None:
    # 1/64 of each chunk out, at most 3/64 back (the union of 3 members' entries): about 42 x
    flats = _contributions(4096 * 30)
    dense = _butterfly(FLOAT32, FLOAT32, flats)
    sparse = _butterfly(Codec("topk", 4096, 1 / 64), Codec("topk", 4096, 1 / 64), flats)
    for d, s in zip(dense, sparse, strict=True):
        assert isinstance(d, Ok) and isinstance(s, Ok)
        assert d.bytes_sent / s.bytes_sent > 32 and d.bytes_received / s.bytes_received > 32


class _Recording:
    """An exchange of one peer with a partner whose contributions are always zero."""

    def __init__(self, codec_of: Callable[[ExchangeRequest], Codec]) -> None:
        self.sent: list[np.ndarray] = []
        self.codec_of = codec_of

    def average(self, tensors: list[torch.Tensor], request: ExchangeRequest) -> ExchangeResult:
        flat = torch.cat([t.reshape(-1) for t in tensors]).numpy()
        self.sent.append(flat.copy())
        delivered = request.codec.roundtrip(flat)
        mean = torch.from_numpy(delivered / 2)
        out, at = [], 0
        for t in tensors:
            out.append(mean[at : at + t.numel()].view(t.shape).clone())
            at += t.numel()
        return Ok(out, group_size=2, total_weight=2.0)

    def start(self, tensors: list[torch.Tensor], request: ExchangeRequest) -> object:
        raise AssertionError("diloco's exchange of updates blocks")

    def num_live_peers(self) -> int:
        return 2

    def close(self) -> None:
        return None


@pytest.mark.parametrize("feedback", [True, False])
def test_diloco_adds_what_the_codec_dropped_to_its_next_contribution(feedback: bool) -> None:
    xcfg = ExchangeConfig(update_codec="topk", topk_chunk=64, topk_fraction=1 / 8, error_feedback=feedback)
    cfg = OuterConfig(method="diloco", reagree_every=0)
    exchange = _Recording(lambda r: r.codec)
    method = build_method(cfg, exchange, xcfg=xcfg)  # type: ignore[arg-type]
    params = [torch.zeros(16, 8), torch.zeros(64)]
    state = OuterState.from_params(params)
    deltas = []
    for rnd in range(3):
        method.begin_round(state, 1.0)
        with torch.no_grad():
            for p, a in zip(params, state.anchor, strict=True):
                p.copy_(a - 0.01 * (rnd + 1) * torch.linspace(-1, 1, p.numel()).view(p.shape))
        deltas.append(torch.cat([(a - p).reshape(-1) for a, p in zip(state.anchor, params, strict=True)]))
        method.end_round(params, state, 1.0, RoundReport(rnd))
    codec = Codec("topk", 64, 1 / 8)
    first = deltas[0].numpy()
    np.testing.assert_allclose(exchange.sent[0], first, rtol=1e-6)
    residual = first - codec.roundtrip(first)
    expected_second = deltas[1].numpy() + (residual if feedback else 0.0)
    np.testing.assert_allclose(exchange.sent[1], expected_second, rtol=1e-5, atol=1e-8)
    assert np.abs(residual).max() > 1e-3  # the codec did drop something


def test_models_never_take_a_lossy_codec() -> None:
    xcfg = ExchangeConfig(update_codec="int4", wire_dtype="bfloat16")
    seen: list[tuple[str, str]] = []

    class Pending:
        def __init__(self, tensors: list[torch.Tensor]) -> None:
            self.tensors = tensors

        def done(self) -> bool:
            return True

        def result(self, timeout_s: float) -> ExchangeResult:
            return Ok(self.tensors, group_size=2, total_weight=2.0)

    class Exchange(_Recording):
        def average(self, tensors: list[torch.Tensor], request: ExchangeRequest) -> ExchangeResult:
            seen.append((request.tag, request.codec.name))
            return super().average(tensors, request)

        def start(self, tensors: list[torch.Tensor], request: ExchangeRequest) -> object:
            seen.append((request.tag, request.codec.name))
            return Pending(list(tensors))

    method = build_method(OuterConfig(method="factored"), Exchange(lambda r: r.codec), xcfg=xcfg)  # type: ignore[arg-type]
    params = [torch.zeros(300)]
    state = OuterState.from_params(params)
    for rnd in range(2):
        method.begin_round(state, 1.0)
        params[0].data -= 0.01
        method.end_round(params, state, 1.0, RoundReport(rnd))
    assert ("mix1", "bfloat16") in seen and ("mix2", "int4") in seen
    assert all(name == "bfloat16" for tag, name in seen if tag == "mix1")
