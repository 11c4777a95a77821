"""A time bound or a stop request ends a round between inner steps; a checkpoint resumes it there.

Also the one vocabulary of fault points, shared by `--kill-self-at` and the chaos scenarios.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from p2p_trainer.config import DataConfig, InnerConfig, ModelConfig, OuterConfig, RunConfig
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.fault_points import (
    CHAOS_POINTS,
    FAULT_POINTS,
    NO_FAULTS,
    FaultInjector,
    FaultPoint,
    parse_fault_point,
)
from p2p_trainer.lab.chaos.timeline import ChaosScenarioError, chaos_scenario_from_dict
from p2p_trainer.train.checkpoint import load_checkpoint, save_checkpoint
from p2p_trainer.train.data import load_corpus
from p2p_trainer.train.trainer import Peer


def _peer(h: int, faults: FaultInjector = NO_FAULTS, target_tokens_per_round: int = 0) -> Peer:
    cfg = RunConfig(
        rounds=3,
        model=ModelConfig(d_model=16, n_layers=1, n_heads=2, seq_len=16),
        data=DataConfig(batch_size=2, val_batches=1),
        inner=InnerConfig(eval_every=0, warmup_steps=1),
        outer=OuterConfig.for_method(
            "diloco", num_inner_steps=h, target_tokens_per_round=target_tokens_per_round
        ),
    )
    corpus = load_corpus(cfg.data, cfg.model.seq_len)
    live = (lambda: ["p0"]) if target_tokens_per_round else None
    exchange = InProcessSwarm(1, seed=0).exchange(0)
    return Peer(cfg, exchange, corpus, peer_key="p0", faults=faults, live_peers=live)


def _deadline(after_s: float) -> Callable[[], bool]:
    deadline = time.monotonic() + after_s
    return lambda: time.monotonic() >= deadline


def _stop_request(after_s: float) -> Callable[[], bool]:
    stop = threading.Event()
    threading.Timer(after_s, stop.set).start()
    return stop.is_set


@pytest.mark.parametrize("bound", [_deadline, _stop_request])
def test_a_bound_mid_round_stops_within_about_one_inner_step(
    bound: Callable[[float], Callable[[], bool]],
) -> None:
    h = 5000  # the whole round would take many seconds
    peer = _peer(h)
    peer.run_round_until(lambda: peer.step >= 5)  # warms up and times the inner step
    step_s = peer.timing.t_step_s
    assert step_s is not None
    peer.skip_steps = 0
    anchor = [a.clone() for a in peer.state.anchor]
    t0 = time.monotonic()
    m = peer.run_round_until(bound(0.3))
    late_s = time.monotonic() - t0 - 0.3
    assert m is None
    assert late_s < 0.2 + 3 * step_s, f"stopped {late_s:.3f} s after the bound; one step takes {step_s:.4f} s"
    # before the exchange and outer step: still round 0, φ untouched, the steps done remembered
    assert peer.state.round == 0 and 0 < peer.skip_steps < h and peer.step == 5 + peer.skip_steps
    for a, b in zip(anchor, peer.state.anchor, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_round_stopped_mid_way_resumes_from_its_checkpoint_where_it_stopped(tmp_path: Path) -> None:
    h = 6
    whole = _peer(h)
    whole.run_round()
    stopped = _peer(h)
    assert stopped.run_round_until(lambda: stopped.step >= 4) is None
    save_checkpoint(stopped, tmp_path / "ckpt.safetensors")
    resumed = _peer(h)
    load_checkpoint(resumed, tmp_path / "ckpt.safetensors")
    m = resumed.run_round()
    assert m.skipped_steps == 4 and resumed.step == whole.step == h and resumed.state.round == 1
    for a, b in zip(whole.state.anchor, resumed.state.anchor, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_resumed_round_does_only_the_rest_of_its_work_quota(tmp_path: Path) -> None:
    h, target = 4, 20 * 2 * 16  # 20 micro-batches of 2 x 16 tokens over 4 steps: 5 a step
    whole = _peer(h, target_tokens_per_round=target)
    assert whole.run_round().round_tokens == target
    stopped = _peer(h, target_tokens_per_round=target)
    assert stopped.run_round_until(lambda: stopped.step >= 2) is None
    done = stopped.tokens
    save_checkpoint(stopped, tmp_path / "ckpt.safetensors")
    resumed = _peer(h, target_tokens_per_round=target)
    load_checkpoint(resumed, tmp_path / "ckpt.safetensors")
    resumed.run_round()
    assert 0 < done < target and resumed.tokens == whole.tokens == target


class _Recording(FaultInjector):
    def __init__(self) -> None:
        super().__init__()
        self.reached_at: list[tuple[FaultPoint, int]] = []

    def reached(self, point: FaultPoint, round: int) -> None:
        self.reached_at.append((point, round))


def test_the_peer_tells_its_injector_when_the_inner_steps_are_half_done() -> None:
    faults = _Recording()
    peer = _peer(4, faults)
    peer.train(2)
    assert faults.reached_at == [("inner", 0), ("inner", 1)]


def test_one_vocabulary_of_fault_points() -> None:
    assert FAULT_POINTS == ("inner", "mix1", "blocking", "download", "serve")
    assert CHAOS_POINTS == ("any", "inner", "mix1", "blocking", "download", "serve")
    assert parse_fault_point("blocking:4") == ("blocking", 4)
    for bad in ("exchange:4", "serving:1", "inner", "inner:x"):
        with pytest.raises(ValueError, match="POINT one of inner, mix1, blocking, download, serve"):
            parse_fault_point(bad)
    assert not NO_FAULTS.wants("inner", 0) and FaultInjector(("serve", 1)).wants("serve", 1)
    for point in CHAOS_POINTS:
        chaos_scenario_from_dict(
            {"peers": 2, "events": [{"at_s": 1, "action": "kill", "peer": 0, "phase": point}]}
        )
    with pytest.raises(ChaosScenarioError, match="choose one of any, inner, mix1, blocking, download, serve"):
        chaos_scenario_from_dict(
            {"peers": 2, "events": [{"at_s": 1, "action": "kill", "peer": 0, "phase": "serving"}]}
        )
