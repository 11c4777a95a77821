"""docs/checkpoints.md's snippet loads a checkpoint with only json, safetensors and torch, and its
logits are the trainer's model's, for both architectures."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from p2p_trainer.config import ModelConfig, RunConfig
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.train.checkpoint import save_checkpoint
from p2p_trainer.train.data import load_corpus
from p2p_trainer.train.model import build_model
from p2p_trainer.train.trainer import Peer
from tests.conftest import tiny_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md"


def snippet() -> dict[str, Any]:
    """The doc's first python block, run as a module (its `__main__` part left out)."""
    code = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)[0]
    imports = set(re.findall(r"^(?:from|import) (\w+)", code, re.MULTILINE))
    assert imports <= {"json", "pathlib", "torch", "safetensors", "sys"}, imports
    namespace: dict[str, Any] = {"__name__": "checkpoint_snippet"}
    exec(compile(code, str(DOC), "exec"), namespace)
    return namespace


@pytest.mark.parametrize(
    "model",
    [
        ModelConfig(d_model=32, n_layers=2, n_heads=2, seq_len=32),
        ModelConfig(d_model=32, n_layers=2, n_heads=2, seq_len=32, tie_embeddings=False),
        ModelConfig(arch="llama", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, seq_len=32),
    ],
    ids=["gpt", "gpt-untied", "llama-gqa"],
)
def test_the_documented_snippet_gives_the_trainers_logits(tmp_path: Path, model: ModelConfig) -> None:
    cfg: RunConfig = dataclasses.replace(tiny_config("independent", rounds=1, h=2), model=model)
    peer = Peer(cfg, InProcessSwarm(1, 0).exchange(0), load_corpus(cfg.data, model.seq_len), "peer0")
    peer.run_round()  # trained a little, so norms and biases are not at their initial values
    path = tmp_path / "peer0" / "checkpoint.safetensors"
    save_checkpoint(peer, path)

    doc = snippet()
    meta, weights = doc["load_checkpoint"](str(path))
    assert meta["model"] == dataclasses.asdict(model) and meta["tokenizer"] == {"kind": "bytes"}
    idx = torch.randint(0, model.vocab_size, (2, model.seq_len), generator=torch.Generator().manual_seed(0))
    trainer_model = build_model(model, seed=1)
    with torch.no_grad():
        for p, v in zip(trainer_model.parameters(), peer.state.anchor, strict=True):
            p.copy_(v)
        expected = trainer_model.eval()(idx)
        got = doc["logits"](meta, weights, idx)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
