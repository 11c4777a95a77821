"""The WAN bench's evaluation at exactly the budget, from files a run leaves, and its byte counts."""

from __future__ import annotations

import dataclasses
import signal
import sys
from pathlib import Path

import pytest
import torch

from bench.wan import bare_peer
from bench.wan.analysis import Evaluator, _peer_stats, fragment_params, pair_bytes
from bench.wan.evaluate import budget_eval, prune_snapshots
from bench.wan.ideal import ideal_config, run_ideal
from p2p_trainer.config import ModelConfig, OuterConfig, RunConfig, to_toml
from p2p_trainer.round_log import ExchangeRecord, RoundRecord, read_log
from p2p_trainer.train.metrics import MetricsWriter
from p2p_trainer.train.model import build_model
from p2p_trainer.train.snapshots import list_snapshots, save_snapshot
from p2p_trainer.train.trainer import lr_factor


def _tiny() -> RunConfig:
    cfg = RunConfig(rounds=1)
    model = dataclasses.replace(cfg.model, d_model=16, n_layers=1, n_heads=2, seq_len=16)
    assert isinstance(model, ModelConfig)
    return dataclasses.replace(
        cfg, model=model, data=dataclasses.replace(cfg.data, val_batches=1, batch_size=2)
    )


def _peer(
    run_dir: Path, i: int, offset: float, snaps: list[tuple[float, float]], base: list[torch.Tensor]
) -> None:
    """Peer i: its clock starts at Unix `offset`; snapshots (time_s, value added to every weight)."""
    w = MetricsWriter(run_dir / f"peer{i}" / "metrics.jsonl")
    for k, (t, bump) in enumerate(snaps):
        w.write(RoundRecord("p", t, offset + t, k, 10 * (k + 1), 100 * (k + 1), 1.0, None, 1.0, 0.0, 1.0))
        tensors = [b + bump for b in base]
        save_snapshot(run_dir / f"peer{i}" / "snapshots", tensors, k + 1, 10 * (k + 1), 100 * (k + 1), t)
    w.close()


def test_models_are_taken_at_exactly_the_budget_on_the_shared_clock(tmp_path: Path) -> None:
    ev = Evaluator(_tiny())
    base = [p.detach().clone() for p in ev.model.parameters()]
    # peer 0's clock starts at 1000, peer 1's at 1004; t0 = 1010, budget 20 s: the models at Unix 1030
    _peer(tmp_path, 0, 1000.0, [(8.0, 0.0), (19.0, 0.0), (30.0, 0.01), (31.0, 5.0)], base)
    _peer(tmp_path, 1, 1004.0, [(6.0, 0.0), (26.0, 0.02), (27.0, 5.0)], base)
    run = {"t0_unix": 1010.0, "budget_s": 20.0}
    out = budget_eval(tmp_path, run, 2, ev, points=2)
    assert out["ok"] and [p["time_s"] for p in out["curve"]] == [10.0, 20.0]
    # at the budget: peer 0's snapshot at its 30 s (Unix 1030), peer 1's at its 26 s (Unix 1030)
    assert out["steps"] == [30, 20] and out["tokens"] == [300, 200]
    assert out["curve"][-1]["age_s"] == pytest.approx(0.0)
    assert out["curve"][-1]["tokens"] == 500.0
    # at 10 s (Unix 1020): peer 0's 19 s snapshot, peer 1's 6 s one, 1 and 10 s old
    assert out["curve"][0]["tokens"] == 300.0 and out["curve"][0]["age_s"] == pytest.approx(10.0)
    expected = [ev.loss([b + 0.01 for b in base]), ev.loss([b + 0.02 for b in base])]
    assert out["peer_losses"] == pytest.approx(expected)
    assert out["best_peer_loss"] == pytest.approx(min(expected))
    assert out["consensus_loss"] == pytest.approx(ev.loss([b + 0.015 for b in base]), abs=1e-5)
    opened = budget_eval(tmp_path, run, 2, ev, points=2, init_loss=5.5)["curve"]
    assert opened[0] == {"time_s": 0.0, "tokens": 0.0, "step": 0.0, "val_loss": 5.5, "age_s": 0.0}
    assert opened[1:] == out["curve"]
    gone = prune_snapshots(tmp_path, 2, out["used_snapshots"])
    assert gone == 7 - len(out["used_snapshots"])
    assert {
        str(s.path) for i in range(2) for s in list_snapshots(tmp_path / f"peer{i}" / "snapshots")
    } == set(out["used_snapshots"])


def test_a_run_without_a_shared_start_has_no_models(tmp_path: Path) -> None:
    out = budget_eval(tmp_path, {"t0_unix": None, "budget_s": 10.0}, 2, Evaluator(_tiny()), 3)
    assert not out["ok"] and out["curve"] == []


def test_partial_merges_count_in_bytes_and_exchange_time() -> None:
    def ex(g: int, ok: bool = True, own_parts: int = 0) -> ExchangeRecord:
        return ExchangeRecord("mix1", ok, g, elapsed_s=1.0, blocked_s=0.0, own_parts=own_parts)

    rounds = [
        RoundRecord("p", t, t, k, k, 0, 1.0, None, 1.0, 0.0, 1.0, exchanges=(e,))
        for k, (t, e) in enumerate(
            [(1.0, ex(2)), (2.0, ex(1, own_parts=1)), (3.0, ex(1)), (4.0, ex(1, ok=False))]
        )
    ]
    stats, _, ratios = _peer_stats(rounds, 10.0, 4, 10.0, 1000)
    # the full pair and the partial merge count as pairs; a group of one moved nothing
    assert stats["theory_bytes"] == pytest.approx(2 * pair_bytes(2, 1000))
    assert stats["theory_bytes_failed"] == pytest.approx(pair_bytes(2, 1000))
    assert stats["partial_merges"] == 1 and len(ratios["mix1"]) == 2


def test_a_streamed_fragment_is_charged_its_own_values_not_the_models() -> None:
    def ex(rnd: int, fragment: int, elapsed_s: float) -> ExchangeRecord:
        group = f"run/fragment/{rnd}/{fragment}/abc"
        return ExchangeRecord("fragment", True, 4, elapsed_s=elapsed_s, blocked_s=0.0, group=group)

    rounds = [
        RoundRecord("p", t, t, k, k, 0, 1.0, None, 1.0, 0.0, 1.0, exchanges=(e,))
        for k, (t, e) in enumerate([(1.0, ex(0, 0, 1.0)), (2.0, ex(1, 1, 1.0))])
    ]
    stats, _, ratios = _peer_stats(rounds, 10.0, 4, 10.0, 1000, fragments=[300, 700])
    # a member of 4 sends 3/4 of its values each way, 4 bytes each: 1,800 and 4,200 bytes
    assert stats["theory_bytes"] == pytest.approx(1800 + 4200)
    # at 10 Mbit/s those take 1.44 and 3.36 ms: the same second is a worse ratio for the smaller
    assert ratios["fragment"] == pytest.approx([1.0 / 1.44e-3, 1.0 / 3.36e-3])
    unnamed = dataclasses.replace(rounds[0], exchanges=(dataclasses.replace(ex(0, 0, 1.0), group="run/x"),))
    with pytest.raises(ValueError, match="names none of the 2 fragments"):
        _peer_stats([unnamed], 10.0, 4, 10.0, 1000, fragments=[300, 700])


def test_fragment_sizes_come_from_the_models_tensors() -> None:
    cfg = _tiny()
    assert fragment_params(cfg) is None
    streamed = dataclasses.replace(cfg, outer=dataclasses.replace(cfg.outer, method="diloco", fragments=2))
    sizes = fragment_params(streamed)
    total = sum(p.numel() for p in build_model(cfg.model, cfg.seed).parameters())
    assert sizes is not None and len(sizes) == 2 and sum(sizes) == total and min(sizes) > total / 4


def test_the_ideal_is_exact_data_parallel_on_the_paired_streams() -> None:
    cfg = ideal_config(_tiny(), steps=3, anneal=False)
    assert cfg.outer.method == "data-parallel" and cfg.outer.num_inner_steps == 1 and cfg.rounds == 3
    assert cfg.inner.min_lr_ratio == 1.0 and ideal_config(_tiny(), 3, anneal=True).inner.min_lr_ratio < 1.0
    model, tokens = run_ideal(cfg, peers=2, steps=3)
    assert tokens == 2 * 3 * cfg.data.batch_size * cfg.model.seq_len
    # a few exact data-parallel steps lower the loss from the seed's initial model
    ev = Evaluator(cfg)
    start = ev.loss([p.detach().clone() for p in ev.model.parameters()])
    assert ev.loss(model) < start


def test_the_bare_loop_logs_a_round_and_a_snapshot_every_h_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = dataclasses.replace(
        _tiny(), rounds=3, outer=OuterConfig.for_method("independent", num_inner_steps=4)
    )
    (tmp_path / "run.toml").write_text(to_toml(cfg))
    argv = ["bare_peer", "--config", str(tmp_path / "run.toml"), "--run-dir", str(tmp_path / "p")]
    monkeypatch.setattr(sys, "argv", [*argv, "--data-key", "slot0"])
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert bare_peer.main() == 0
    finally:  # main installs its stop handlers: give pytest its own back
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    log = read_log(tmp_path / "p" / "metrics.jsonl")
    assert [r.step for r in log.rounds] == [4, 8, 12]
    assert [s.step for s in list_snapshots(tmp_path / "p" / "snapshots")] == [4, 8, 12]
    assert log.rounds[-1].tokens == 12 * cfg.data.batch_size * cfg.model.seq_len
    # join's schedule (Peer's LambdaLR): warm-up, then cosine over rounds x H steps
    inner = cfg.inner
    for step in (0, 11, 30):
        expected = inner.lr * lr_factor(step, inner.warmup_steps, 12, inner.min_lr_ratio)
        assert bare_peer.scheduled_lr(cfg, step) == pytest.approx(expected)
