"""The tiny run of the multi-process tests and of the attack benches: a model small enough that
several peers train it on one 2-core machine in seconds per round."""

from __future__ import annotations

from typing import Any

from p2p_trainer.config import DataConfig, ExchangeConfig, InnerConfig, ModelConfig, OuterConfig, RunConfig


def tiny_config(method: str, rounds: int, h: int = 5, **exchange: Any) -> RunConfig:
    """A tiny model for multi-process runs; `exchange` overrides ExchangeConfig fields (of mixed
    types; ExchangeConfig checks each against its annotation)."""
    return RunConfig(
        seed=0,
        rounds=rounds,
        model=ModelConfig(d_model=32, n_layers=2, n_heads=2, seq_len=32),
        data=DataConfig(batch_size=4, val_batches=2),
        inner=InnerConfig(eval_every=0, warmup_steps=2),
        outer=OuterConfig.for_method(method, num_inner_steps=h),
        exchange=ExchangeConfig(**{"timeout_s": 30.0, **exchange}),
    )
