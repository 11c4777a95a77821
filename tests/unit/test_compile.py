"""`inner.compile`: torch.compile's forward gives eager's loss; checkpoints keep the module's names."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from p2p_trainer.config import ConfigError, DataConfig, InnerConfig, ModelConfig, OuterConfig, RunConfig
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.train import compiled
from p2p_trainer.train.checkpoint import save_checkpoint
from p2p_trainer.train.checkpoint_json import json_path
from p2p_trainer.train.data import load_corpus
from p2p_trainer.train.trainer import Peer


def _peer(compile: bool, device: str = "cpu", bf16: bool = False) -> Peer:
    cfg = RunConfig(
        rounds=1,
        model=ModelConfig(arch="llama", d_model=16, n_layers=1, n_heads=2, seq_len=16),
        data=DataConfig(batch_size=2, val_batches=1),
        inner=InnerConfig(eval_every=0, warmup_steps=1, compile=compile, bf16=bf16),
        outer=OuterConfig.for_method("independent", num_inner_steps=2),
    )
    corpus = load_corpus(cfg.data, cfg.model.seq_len)
    return Peer(cfg, InProcessSwarm(1, 0).exchange(0), corpus, "p0", device=device)


# about 70 s on a 2-core machine (inductor builds C++ kernels), so out of `make test`
@pytest.mark.bench
@pytest.mark.skipif(compiled.compile_problem(torch.device("cpu")) is not None, reason="no C++ compiler")
def test_compiled_steps_give_eager_losses_and_unprefixed_names(tmp_path: Path) -> None:
    eager, fast = _peer(False), _peer(True)
    assert fast.forward_model is not fast.model
    for e, c in zip(eager.train(1), fast.train(1), strict=True):
        assert c.train_loss == pytest.approx(e.train_loss, rel=1e-4)
    for x, y in zip(eager.params, fast.params, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)
    assert not any("_orig_mod" in k for k in fast.model.state_dict())
    save_checkpoint(fast, tmp_path / "c.safetensors")
    assert "_orig_mod" not in json_path(tmp_path / "c.safetensors").read_text()
    with safe_open(str(tmp_path / "c.safetensors"), framework="pt") as f:
        stored = list(f.keys())
    assert stored and not any("_orig_mod" in k for k in stored)


def test_without_a_compiler_the_error_says_what_to_change(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(compiled.shutil, "which", lambda name: None)
    with pytest.raises(ConfigError, match=r"no C\+\+ compiler.*set inner\.compile = false"):
        _peer(True)


def test_eager_is_the_default() -> None:
    peer = _peer(False)
    assert peer.forward_model is peer.model


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")
def test_on_cuda_compiled_bf16_steps_give_eager_losses() -> None:
    eager, fast = _peer(False, device="cuda", bf16=True), _peer(True, device="cuda", bf16=True)
    assert fast.forward_model is not fast.model
    for e, c in zip(eager.train(1), fast.train(1), strict=True):
        # bf16 autocast: kernels fused differently round differently
        assert c.train_loss == pytest.approx(e.train_loss, rel=2e-2)
    assert all(p.device.type == "cuda" for p in fast.params)
