"""The in-process backend: exact means, seeded random groups, failures as values."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch

from p2p_trainer.algo.groups import group_seed, partition
from p2p_trainer.config import DataConfig, InnerConfig, ModelConfig, OuterConfig, RunConfig
from p2p_trainer.exchange.codecs import Codec
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.exchange.interface import ALL, ExchangeRequest, ExchangeResult, Failed, Ok
from p2p_trainer.run.threads import run_inprocess


def _run_all(n: int, fn: Callable[[int], ExchangeResult]) -> list[ExchangeResult]:
    out: list[ExchangeResult | None] = [None] * n
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, fn(i))) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(r is not None for r in out)
    return [r for r in out if r is not None]


def test_all_reduce_is_the_exact_weighted_mean() -> None:
    swarm = InProcessSwarm(4, seed=0)
    values = [torch.full((3,), float(i)) for i in range(4)]
    weights = [1.0, 1.0, 2.0, 4.0]
    results = _run_all(
        4, lambda i: swarm.exchange(i).average([values[i]], ExchangeRequest("t", 0, ALL, weights[i]))
    )
    expected = sum(w * v for w, v in zip(weights, values, strict=True)) / sum(weights)
    for r in results:
        assert isinstance(r, Ok) and r.group_size == 4
        torch.testing.assert_close(r.tensors[0], expected)
        assert r.bytes_sent == int(2 * 3 / 4 * 12)


def test_float16_wire_rounds_the_mean_as_the_network_peers_get_it() -> None:
    swarm = InProcessSwarm(2, seed=0)
    values = [torch.full((4,), 0.1), torch.full((4,), 0.2)]
    req = ExchangeRequest("t", 0, ALL, 1.0, codec=Codec("float16"))
    results = _run_all(2, lambda i: swarm.exchange(i).average([values[i]], req))
    for r in results:
        assert isinstance(r, Ok) and r.bytes_sent == int(2 * 1 / 2 * 8)  # 2 bytes per value
        torch.testing.assert_close(r.tensors[0], torch.full((4,), 0.15).half().float(), rtol=0, atol=0)
        assert r.tensors[0].dtype == torch.float32 and not torch.equal(r.tensors[0], torch.full((4,), 0.15))


def test_pairs_average_within_their_group_only() -> None:
    swarm = InProcessSwarm(4, seed=1)
    values = [torch.full((2,), float(10 * i)) for i in range(4)]
    results = _run_all(4, lambda i: swarm.exchange(i).average([values[i]], ExchangeRequest("t", 3, 2)))
    groups = partition(swarm.names, 2, group_seed(1, "t", 3))
    for group in groups:
        idx = [swarm.names.index(n) for n in group]
        mean = sum(values[i] for i in idx) / len(idx)
        for i in idx:
            r = results[i]
            assert isinstance(r, Ok) and r.group_size == 2
            torch.testing.assert_close(r.tensors[0], mean)


def test_groups_are_random_and_change_every_round() -> None:
    names = [f"peer{i}" for i in range(8)]
    partitions = {tuple(map(tuple, partition(names, 2, group_seed(0, "t", r)))) for r in range(10)}
    assert len(partitions) > 5
    # same inputs, same groups: no messages needed to agree
    assert partition(names, 2, group_seed(0, "t", 4)) == partition(
        list(reversed(names)), 2, group_seed(0, "t", 4)
    )


def test_odd_peer_is_not_left_alone() -> None:
    groups = partition([f"p{i}" for i in range(5)], 2, seed=7)
    assert sorted(len(g) for g in groups) == [2, 3]


def test_timeout_is_a_failed_value_and_inputs_are_untouched() -> None:
    swarm = InProcessSwarm(2, seed=0)
    mine = [torch.ones(4)]
    res = swarm.exchange(0).average(mine, ExchangeRequest("t", 0, ALL, timeout_s=0.2))
    assert isinstance(res, Failed) and "peer1" in res.reason
    torch.testing.assert_close(mine[0], torch.ones(4))


def test_background_exchange_snapshots_inputs() -> None:
    swarm = InProcessSwarm(2, seed=0)
    a, b = [torch.zeros(2)], [torch.full((2,), 2.0)]
    pending = swarm.exchange(0).start(a, ExchangeRequest("mix1", 0, 2))
    a[0].add_(100.0)  # training continues; the exchange must use the value at start
    assert not pending.done()
    swarm.exchange(1).average(b, ExchangeRequest("mix1", 0, 2))
    res = pending.result(timeout_s=5)
    assert isinstance(res, Ok)
    torch.testing.assert_close(res.tensors[0], torch.full((2,), 1.0))


def test_invalid_contributions_are_dropped_before_merging() -> None:
    swarm = InProcessSwarm(3, seed=0)
    contributions = [[torch.ones(2)], [torch.tensor([float("nan"), 1.0])], [torch.full((2,), 3.0)]]
    weights = [1.0, 1.0, -5.0]
    results = _run_all(
        3, lambda i: swarm.exchange(i).average(contributions[i], ExchangeRequest("t", 0, ALL, weights[i]))
    )
    for r in results:
        assert isinstance(r, Ok) and r.group_size == 1
        torch.testing.assert_close(r.tensors[0], torch.ones(2))


def test_dead_peer_is_left_out_of_later_groups() -> None:
    swarm = InProcessSwarm(3, seed=0)
    swarm.leave(2)
    results = _run_all(
        2,
        lambda i: swarm.exchange(i).average(
            [torch.full((1,), float(i))], ExchangeRequest("t", 0, ALL, timeout_s=5)
        ),
    )
    for r in results:
        assert isinstance(r, Ok) and r.group_size == 2


def test_a_member_that_leaves_fails_its_group_at_once_not_at_the_timeout() -> None:
    swarm = InProcessSwarm(2, seed=0)
    pending = swarm.exchange(0).start([torch.ones(3)], ExchangeRequest("t", 0, ALL, 1.0, timeout_s=60.0))
    threading.Timer(0.2, swarm.leave, args=(1,)).start()
    started = time.monotonic()
    res = pending.result(60.0)
    assert isinstance(res, Failed) and "left" in res.reason
    assert time.monotonic() - started < 5.0


def test_a_stop_request_ends_an_inprocess_run_between_inner_steps() -> None:
    cfg = RunConfig(
        rounds=1000,
        model=ModelConfig(d_model=16, n_layers=1, n_heads=2, seq_len=16),
        data=DataConfig(batch_size=2, val_batches=1),
        inner=InnerConfig(eval_every=0, warmup_steps=1),
        outer=OuterConfig(method="diloco", num_inner_steps=50),
    )
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    started = time.monotonic()
    result = run_inprocess(cfg, 3, stop=stop)
    assert time.monotonic() - started < 30.0  # 1000 rounds would take many minutes
    assert len(result.val_loss) == 3 and all(0 < v < 7 for v in result.val_loss)
