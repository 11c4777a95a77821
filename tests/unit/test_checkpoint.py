"""Resume reproduces the next step exactly, and the state hash at save equals the hash at load."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from p2p_trainer.config import DataConfig, InnerConfig, ModelConfig, OuterConfig, RunConfig
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint, state_hash
from p2p_trainer.train.data import load_corpus
from p2p_trainer.train.trainer import Peer


def _cfg(seed: int = 0) -> RunConfig:
    return RunConfig(
        seed=seed,
        rounds=3,
        model=ModelConfig(d_model=32, n_layers=2, n_heads=2, seq_len=32),
        data=DataConfig(batch_size=4, val_batches=2),
        inner=InnerConfig(eval_every=0, warmup_steps=2),
        outer=OuterConfig.for_method("diloco", num_inner_steps=3),
    )


def _peer(cfg: RunConfig) -> Peer:
    corpus = load_corpus(cfg.data, cfg.model.seq_len)
    return Peer(cfg, InProcessSwarm(1, cfg.seed).exchange(0), corpus, "peer0")


def test_resume_reproduces_the_next_round(tmp_path: Path) -> None:
    cfg = _cfg()
    a = _peer(cfg)
    a.run_round()
    saved = save_checkpoint(a, tmp_path / "ckpt.safetensors")
    assert saved == state_hash(a)
    next_a = a.run_round()

    b = _peer(cfg)
    assert load_checkpoint(b, tmp_path / "ckpt.safetensors") == saved
    next_b = b.run_round()
    assert next_a.train_loss == next_b.train_loss
    for x, y in zip(a.state.anchor, b.state.anchor, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_checkpoint_of_another_run_is_refused(tmp_path: Path) -> None:
    a = _peer(_cfg(seed=0))
    save_checkpoint(a, tmp_path / "c.safetensors")
    with pytest.raises(CheckpointError, match="belongs to run"):
        load_checkpoint(_peer(_cfg(seed=1)), tmp_path / "c.safetensors")


def test_checkpoint_write_is_atomic(tmp_path: Path) -> None:
    a = _peer(_cfg())
    save_checkpoint(a, tmp_path / "c.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json", "c.safetensors"]
