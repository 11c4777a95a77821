"""`bench/llama_cpu.py`'s sizing and arithmetic (the run itself is a multi-minute benchmark)."""

from __future__ import annotations

import pytest

from bench import llama_cpu
from p2p_trainer.round_log import RoundRecord
from p2p_trainer.train.model import build_model


def _round(i: int, time_s: float, compute_s: float, wall_s: float) -> RoundRecord:
    return RoundRecord(
        peer="p",
        time_s=time_s,
        unix_time=0.0,
        round=i,
        step=10 * (i + 1),
        tokens=1000 * (i + 1),
        train_loss=1.0,
        val_loss=None,
        compute_s=compute_s,
        blocked_s=wall_s - compute_s,
        wall_s=wall_s,
        round_tokens=1000,
    )


def test_the_full_model_has_at_least_20m_parameters() -> None:
    assert build_model(llama_cpu.FULL, 0).num_params() >= llama_cpu.MIN_PARAMS


def test_rates_leave_the_first_round_out() -> None:
    rounds = [_round(0, 30.0, 20.0, 25.0), _round(1, 34.0, 2.0, 4.0), _round(2, 38.0, 2.0, 4.0)]
    inner, overall = llama_cpu.swarm_rates(rounds)
    assert inner == pytest.approx(2000 / 4.0)
    assert overall == pytest.approx(2000 / 8.0)
    assert llama_cpu.swarm_rates(rounds[:1]) == (pytest.approx(50.0), pytest.approx(40.0))
