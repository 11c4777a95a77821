"""A CPU peer's training thread flushes subnormal floats to zero (InnerConfig.flush_denormal)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch

from p2p_trainer.config import RunConfig
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.train.data import load_corpus
from p2p_trainer.train.trainer import Peer
from tests.conftest import tiny_config

SUBNORMAL = 1e-39
"""Below float32's smallest normal number (1.18e-38), above zero."""


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    torch.set_flush_denormal(False)
    yield
    torch.set_flush_denormal(False)


def _kept() -> bool:
    """Whether this thread computes with subnormals rather than flushing them to zero."""
    return float(torch.tensor([SUBNORMAL], dtype=torch.float32) * 1.0) != 0.0


def _peer(cfg: RunConfig) -> Peer:
    return Peer(cfg, InProcessSwarm(1, cfg.seed).exchange(0), load_corpus(cfg.data, cfg.model.seq_len), "p0")


def test_a_cpu_peer_flushes_subnormals_unless_told_not_to() -> None:
    cfg = tiny_config("diloco", rounds=1)
    assert _kept()
    _peer(cfg)
    assert not _kept()
    torch.set_flush_denormal(False)
    _peer(dataclasses.replace(cfg, inner=dataclasses.replace(cfg.inner, flush_denormal=False)))
    assert _kept()
