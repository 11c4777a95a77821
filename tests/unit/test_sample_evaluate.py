"""`p2p-trainer sample` and `evaluate` on a run directory written here: two peers trained apart,
checkpointed as `local` lays them out; the losses and the text are checked against the peers'
own models and an average computed from the safetensors files directly."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from safetensors.torch import load_file

from p2p_trainer import cli
from p2p_trainer.config import ModelConfig, RunConfig, to_toml
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.run import use_checkpoints
from p2p_trainer.train.checkpoint import save_checkpoint
from p2p_trainer.train.data import load_corpus, validation_batches
from p2p_trainer.train.model import build_model
from p2p_trainer.train.tokenizer import load_tokenizer
from p2p_trainer.train.trainer import Peer
from tests.conftest import tiny_config
from tests.unit.test_tokenizers import text_corpus, train_tokenizer


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("P2P_TRAINER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def write_run(run_dir: Path, cfg: RunConfig, peers: int = 2) -> list[Peer]:
    """Peers trained one round each on their own streams (so their models differ), checkpointed
    where `local` puts them, with the run's config.toml."""
    corpus = load_corpus(cfg.data, cfg.model.seq_len)
    trained = []
    for i in range(peers):
        peer = Peer(cfg, InProcessSwarm(1, cfg.seed).exchange(0), corpus, peer_key=f"peer{i}")
        peer.run_round()
        save_checkpoint(peer, run_dir / f"peer{i}" / "checkpoint.safetensors")
        trained.append(peer)
    (run_dir / "config.toml").write_text(to_toml(cfg))
    return trained


@pytest.fixture
def run(tmp_path: Path) -> tuple[Path, RunConfig, list[Peer]]:
    cfg = tiny_config("independent", rounds=1, h=3)
    return tmp_path / "run", cfg, write_run(tmp_path / "run", cfg)


def independent_loss(cfg: RunConfig, params: list[torch.Tensor], corpus: str | None = None) -> float:
    data = cfg.data if corpus is None else dataclasses.replace(cfg.data, corpus=corpus)
    model = build_model(cfg.model, seed=123)
    with torch.no_grad():
        for p, v in zip(model.parameters(), params, strict=True):
            p.copy_(v)
        batches = validation_batches(load_corpus(data, cfg.model.seq_len), cfg.model.seq_len, 4, 2)
        losses = [F.cross_entropy(model(x).flatten(0, 1), y.flatten()) for x, y in batches]
    return float(torch.stack(losses).mean())


def test_evaluate_prints_each_peer_and_the_average_of_their_models(
    run: tuple[Path, RunConfig, list[Peer]], tmp_path: Path
) -> None:
    run_dir, cfg, peers = run
    result = use_checkpoints.evaluate(run_dir, cfg)
    for i, peer in enumerate(peers):
        assert result.per_peer[f"peer{i}"] == pytest.approx(peer.evaluate(peer.state.anchor), abs=1e-6)
    phis = [load_file(str(run_dir / f"peer{i}/checkpoint.safetensors")) for i in range(2)]
    n = sum(1 for k in phis[0] if k.startswith("phi."))
    mean = [(phis[0][f"phi.{i}"] + phis[1][f"phi.{i}"]) / 2 for i in range(n)]
    assert result.average == pytest.approx(independent_loss(cfg, mean), abs=1e-5)
    assert result.average not in result.per_peer.values()  # the peers' models differ

    out = CliRunner().invoke(cli.main, ["evaluate", str(run_dir)])
    assert out.exit_code == 0, out.output
    assert f"peer1: val loss {result.per_peer['peer1']:.4f}" in out.output
    assert f"average of 2 peer(s): val loss {result.average:.4f}" in out.output

    other = text_corpus(tmp_path / "other")
    on_other = use_checkpoints.evaluate(run_dir, cfg, data=str(other))
    assert on_other.average == pytest.approx(independent_loss(cfg, mean, str(other)), abs=1e-5)


def greedy(peer: Peer, prompt: bytes, tokens: int) -> str:
    model = build_model(peer.cfg.model, seed=0)
    with torch.no_grad():
        for p, v in zip(model.parameters(), peer.state.anchor, strict=True):
            p.copy_(v)
        ids = list(prompt)
        for _ in range(tokens):
            ids.append(int(model(torch.tensor([ids[-peer.cfg.model.seq_len :]]))[0, -1].argmax()))
    return bytes(ids).decode("utf-8", errors="replace")


def test_sample_continues_the_prompt_with_the_chosen_peers_model(
    run: tuple[Path, RunConfig, list[Peer]],
) -> None:
    run_dir, _, peers = run
    for peer in (None, 1):
        argv = ["sample", str(run_dir), "--prompt", "ROMEO:", "--tokens", "16", "--temperature", "0"]
        out = CliRunner().invoke(cli.main, argv + ([] if peer is None else ["--peer", str(peer)]))
        assert out.exit_code == 0, out.output
        assert out.output == greedy(peers[peer or 0], b"ROMEO:", 16) + "\n"
    sampled = [use_checkpoints.sample(run_dir, "ROMEO:", 16, temperature=1.0) for _ in range(2)]
    assert sampled[0] == sampled[1] and sampled[0].startswith("ROMEO:")  # seeded: the same each time
    out = CliRunner().invoke(cli.main, ["sample", str(run_dir), "--peer", "5"])
    assert out.exit_code == 1 and "no checkpoint of peer5; the run has peer0, peer1" in out.output


def test_sample_uses_the_runs_tokenizer_and_notices_it_changed(tmp_path: Path) -> None:
    corpus = text_corpus(tmp_path / "corpus")
    tokenizer = train_tokenizer(corpus, tmp_path / "tokenizer.json")
    base = tiny_config("independent", rounds=1, h=2)
    cfg = dataclasses.replace(
        base,
        model=dataclasses.replace(base.model, vocab_size=300),
        data=dataclasses.replace(base.data, corpus=str(corpus), tokenizer=str(tokenizer)),
    )
    run_dir = tmp_path / "run"
    write_run(run_dir, cfg, peers=1)
    text = use_checkpoints.sample(run_dir, "the swarm", 20, temperature=0)
    assert text.startswith("the swarm") and len(load_tokenizer(cfg.data).encode_batch([text])[0]) > 10
    assert use_checkpoints.evaluate(run_dir, cfg).per_peer.keys() == {"peer0"}
    train_tokenizer(corpus, tokenizer, vocab=290)
    with pytest.raises(use_checkpoints.RunDirError, match="changed since the run"):
        use_checkpoints.sample(run_dir, "the swarm", 5, temperature=0)


def test_a_directory_without_checkpoints_or_with_another_model_is_refused(
    run: tuple[Path, RunConfig, list[Peer]], tmp_path: Path
) -> None:
    run_dir, cfg, _ = run
    with pytest.raises(use_checkpoints.RunDirError, match=r"no checkpoint\.safetensors"):
        use_checkpoints.evaluate(tmp_path, cfg)
    wider = dataclasses.replace(cfg, model=ModelConfig(d_model=64, n_layers=2, n_heads=2, seq_len=32))
    with pytest.raises(use_checkpoints.RunDirError, match=r"the config's \[model\] is not the checkpoint's"):
        use_checkpoints.evaluate(run_dir, wider)
