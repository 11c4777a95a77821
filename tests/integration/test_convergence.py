"""Convergence check on the real corpus: 4 in-process peers, every method, 180 to 300 inner steps.

Every method must learn and NoLoCo's γ term must measurably tighten the peers' agreement; a small
model shows both in `make test`. The per-token ordering (per-step averaging best, independent
training worst) needs the larger model, where the outer steps have room to pay: at this budget
the small model's DiLoCo trails independent training, so that check is a benchmark
(`make bench-check`).
"""

from __future__ import annotations

import logging

import pytest

from p2p_trainer.config import DataConfig, InnerConfig, ModelConfig, OuterConfig, RunConfig
from p2p_trainer.run.threads import InProcessResult, run_inprocess

logger = logging.getLogger(__name__)

H, PEERS = 10, 4
SMALL_ROUNDS = 18
"""180 inner steps: the small model ends below 2.95 (from ~5.5) in every method, and NoLoCo's peers
10x closer with γ than without."""
LARGE_ROUNDS = 30


SMALL = ModelConfig(d_model=64, n_layers=2, n_heads=4, seq_len=64)
"""A quarter of the large model's compute per step; enough to show learning and γ's effect."""
LARGE = ModelConfig(d_model=128, n_layers=4, n_heads=4, seq_len=64)


def _cfg(method: str, model: ModelConfig, rounds: int, **outer: float) -> RunConfig:
    return RunConfig(
        seed=0,
        rounds=rounds,
        model=model,
        data=DataConfig(batch_size=8, val_batches=8),
        inner=InnerConfig(lr=1e-3, warmup_steps=10, eval_every=0),
        outer=OuterConfig.for_method(method, num_inner_steps=H, **outer),
    )


def _run_all(model: ModelConfig, rounds: int) -> dict[str, InProcessResult]:
    runs = {
        "data-parallel": _cfg("data-parallel", model, rounds),
        "diloco": _cfg("diloco", model, rounds),
        "noloco": _cfg("noloco", model, rounds),
        "noloco-gamma0": _cfg("noloco", model, rounds, gamma=0.0),
        "factored": _cfg("factored", model, rounds),
        "independent": _cfg("independent", model, rounds),
    }
    out = {name: run_inprocess(cfg, PEERS) for name, cfg in runs.items()}
    for name, r in out.items():
        logger.warning(
            "%-14s val %.3f (mean model %.3f) consensus %.4f failed %d",
            name,
            sum(r.val_loss) / len(r.val_loss),
            r.mean_model_val_loss,
            r.consensus_distance,
            r.failed_exchanges,
        )
    return out


@pytest.fixture(scope="module")
def results() -> dict[str, InProcessResult]:
    return _run_all(SMALL, SMALL_ROUNDS)


@pytest.fixture(scope="module")
def large_results() -> dict[str, InProcessResult]:
    return _run_all(LARGE, LARGE_ROUNDS)


@pytest.mark.timeout(2400)
def test_every_method_learns(results: dict[str, InProcessResult]) -> None:
    for name, r in results.items():
        assert r.failed_exchanges == 0, name
        assert max(r.val_loss) < 3.2, f"{name}: validation loss {r.val_loss} did not fall from ~5.5"
        assert r.tokens == PEERS * SMALL_ROUNDS * H * 8 * 64


@pytest.mark.bench
@pytest.mark.timeout(2400)
def test_ordering_per_token(large_results: dict[str, InProcessResult]) -> None:
    # the five methods; NoLoCo with γ = 0 is an ablation, not a method
    mean = {k: sum(r.val_loss) / len(r.val_loss) for k, r in large_results.items() if k != "noloco-gamma0"}
    assert mean["data-parallel"] == min(mean.values()), mean
    assert mean["independent"] == max(mean.values()), mean


@pytest.mark.timeout(2400)
def test_gamma_keeps_noloco_peers_together(results: dict[str, InProcessResult]) -> None:
    with_gamma = results["noloco"].consensus_distance
    without = results["noloco-gamma0"].consensus_distance
    assert without > 1.2 * with_gamma, (without, with_gamma)
    # methods that average everything every round keep peers identical
    assert results["diloco"].consensus_distance < 1e-5
    assert results["data-parallel"].consensus_distance < 1e-5
