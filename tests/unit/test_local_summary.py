"""`local`'s end figures: the consensus model against the best and the mean single peer, the peers'
spread, and the gain over training alone; computed from a run directory written here."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from p2p_trainer.algo.outer import consensus_distance
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.round_log import ExchangeRecord, FinalRecord, RoundRecord, read_log
from p2p_trainer.run.consensus import compare_peers, gain, mean_anchor
from p2p_trainer.run.final_agreement import BEFORE_FINAL_DIR, FINAL_TAG
from p2p_trainer.run.launcher import local_options
from p2p_trainer.run.local_swarm import evaluate_anchor, own_anchor, summarize, with_independent
from p2p_trainer.train.checkpoint import read_anchor, save_checkpoint
from p2p_trainer.train.data import load_corpus
from p2p_trainer.train.metrics import MetricsWriter
from p2p_trainer.train.snapshots import save_snapshot
from p2p_trainer.train.trainer import Peer
from tests.conftest import tiny_config


def test_compare_peers_picks_the_best_and_averages_the_known() -> None:
    c = compare_peers({"peer0": 2.5, "peer1": 2.1, "peer2": None, "peer3": 2.9})
    assert c.best_peer == "peer1" and c.best_peer_val_loss == 2.1
    assert c.mean_peer_val_loss == pytest.approx((2.5 + 2.1 + 2.9) / 3)
    assert compare_peers({"peer0": None}) == compare_peers({})
    assert compare_peers({}).best_peer is None
    assert compare_peers({"a": math.nan, "b": 3.0}).mean_peer_val_loss == 3.0


def test_gain_is_independent_mean_minus_consensus() -> None:
    assert gain(2.6, 2.2) == pytest.approx(0.4)
    assert gain(2.0, 2.2) == pytest.approx(-0.2)  # the swarm can lose, and then it says so
    assert gain(None, 2.2) is None and gain(2.6, None) is None


def test_mean_anchor_is_the_element_wise_mean() -> None:
    a = [torch.tensor([1.0, 2.0]), torch.tensor([[0.0]])]
    b = [torch.tensor([3.0, 6.0]), torch.tensor([[4.0]])]
    m = mean_anchor([a, b])
    assert torch.equal(m[0], torch.tensor([2.0, 4.0])) and torch.equal(m[1], torch.tensor([[2.0]]))
    with pytest.raises(ValueError):
        mean_anchor([])


def _final(peer: str, val: float, own: float | None, merged: bool, rounds: int = 2) -> FinalRecord:
    rec = None
    if own is not None:
        rec = ExchangeRecord(FINAL_TAG, merged, 2 if merged else 1, 0.1, 0.1, reason="" if merged else "late")
    return FinalRecord(peer, rounds, 100, val, 1.0, False, "h", rounds * 3, own_val_loss=own, agreement=rec)


def _round(peer: str) -> RoundRecord:
    return RoundRecord(peer, 1.0, 0.0, 1, 6, 100, 3.0, None, 0.5, 0.1, 0.6)


def test_summary_of_a_run_whose_peers_agreed(tmp_path: Path) -> None:
    """Two peers with different own models; after the agreement both hold their mean."""
    cfg = tiny_config("diloco", rounds=2)
    opts = local_options(tmp_path / "run", cfg, peers=2)
    corpus = load_corpus(cfg.data, cfg.model.seq_len)
    peers = [Peer(cfg, InProcessSwarm(2, 0).exchange(i), corpus, f"peer{i}") for i in range(2)]
    own = [
        [a + 0.05 * (2 * i - 1) * torch.randn_like(a) for a in p.state.anchor] for i, p in enumerate(peers)
    ]
    consensus = mean_anchor(own)
    own_losses = [evaluate_anchor(cfg, a) for a in own]
    for i, peer in enumerate(peers):
        d = opts.run_dir / f"peer{i}"
        peer.state.anchor, peer.state.round, peer.step = consensus, 2, 6
        save_checkpoint(peer, d / "checkpoint.safetensors")
        save_snapshot(d / BEFORE_FINAL_DIR, own[i], 2, 6, 100, 1.0)
        writer = MetricsWriter(d / "metrics.jsonl")
        writer.write(_round(f"p{i}"))
        writer.write(_final(f"p{i}", evaluate_anchor(cfg, consensus), own_losses[i], merged=True))
        writer.close()
    s = summarize(opts, wall_s=5.0, interrupted=False)
    assert s["consensus_val_loss"] == pytest.approx(evaluate_anchor(cfg, consensus), abs=1e-5)
    assert s["averaged_model_val_loss"] == s["consensus_val_loss"]
    best = min(range(2), key=lambda i: own_losses[i])
    assert s["best_peer"] == f"peer{best}" and s["best_peer_val_loss"] == pytest.approx(own_losses[best])
    assert s["mean_peer_val_loss"] == pytest.approx(sum(own_losses) / 2)
    assert s["consensus_distance"] == pytest.approx(consensus_distance(own), rel=1e-5)
    assert s["consensus_distance"] > 0 and s["final_distance"] == pytest.approx(0.0, abs=1e-7)
    assert s["agreed_peers"] == 2 and [p["final_agreement"] for p in s["per_peer"]] == ["ok(2)"] * 2


def test_own_anchor_falls_back_to_the_checkpoint(tmp_path: Path) -> None:
    """Without an agreement that changed φ (or with a copy from another life), the own model is the
    final checkpoint's."""
    cfg = tiny_config("diloco", rounds=2)
    peer = Peer(cfg, InProcessSwarm(1, 0).exchange(0), load_corpus(cfg.data, cfg.model.seq_len), "peer0")
    peer.state.round, peer.step = 2, 6
    save_checkpoint(peer, tmp_path / "checkpoint.safetensors")
    stale = [a + 1.0 for a in peer.state.anchor]
    save_snapshot(tmp_path / BEFORE_FINAL_DIR, stale, 1, 3, 50, 0.5)  # an earlier life's
    ckpt = read_anchor(tmp_path / "checkpoint.safetensors")
    for final in (None, _final("p", 2.0, None, merged=False), _final("p", 2.0, 2.1, merged=False)):
        got = own_anchor(tmp_path, final)
        assert got is not None and all(torch.equal(a, b) for a, b in zip(got, ckpt, strict=True))
    got = own_anchor(tmp_path, _final("p", 2.0, 2.1, merged=True))  # merged, but the copy is stale
    assert got is not None and all(torch.equal(a, b) for a, b in zip(got, ckpt, strict=True))
    assert read_log(tmp_path / "metrics.jsonl").final is None


def test_with_independent_reports_the_gain(tmp_path: Path) -> None:
    swarm = {"consensus_val_loss": 2.2, "mean_peer_val_loss": 2.3}
    alone = {
        "mean_peer_val_loss": 2.5,
        "best_peer_val_loss": 2.45,
        "consensus_val_loss": 2.4,
        "tokens": 10,
        "wall_s": 3.0,
        "interrupted": False,
    }
    s = with_independent(swarm, alone, tmp_path / "independent")
    assert s["gain_vs_independent"] == pytest.approx(0.3)
    assert s["independent"]["mean_peer_val_loss"] == 2.5 and s["independent"]["run_dir"].endswith(
        "independent"
    )
    assert s["consensus_val_loss"] == 2.2


def test_steps_left_out_to_align_a_round_count_as_lost_compute() -> None:
    from p2p_trainer.round_log import RunLog
    from p2p_trainer.run.local_swarm import _peer_entry

    def rnd(i: int, step: int, skipped: int) -> RoundRecord:
        # H = 10 steps of 0.1 s each; a round that skipped k steps computed (10 − k) · 0.1 s
        compute = (10 - skipped) * 0.1
        return RoundRecord(
            "p", 1.0 * i, 0.0, i, step, 100, 3.0, None, compute, 0.0, compute, skipped_steps=skipped
        )

    entry = _peer_entry("p", RunLog((rnd(0, 10, 0), rnd(1, 16, 4), rnd(2, 26, 0))))
    assert entry["skipped_steps"] == 4
    # 2.6 s of compute, over 2.6 s of wall time plus the 4 dropped steps at 0.1 s each
    assert entry["utilisation"] == pytest.approx(2.6 / 3.0)
