"""The in-process sweep's table: medians with ranges, fractions of ideal per seed."""

from __future__ import annotations

from typing import Any

from bench.quality_sweep import VARIANTS, table, variant_config
from p2p_trainer.config import load_config


def _run(variant: str, seed: int, mean_peer: float, consensus: float) -> dict[str, Any]:
    return {
        "variant": variant,
        "seed": seed,
        "mean_peer": mean_peer,
        "consensus": consensus,
        "best_peer": consensus,
        "consensus_distance": 0.01,
    }


def test_fraction_of_ideal_is_taken_per_seed_against_that_seeds_baselines() -> None:
    runs = [
        _run("independent", 1, 2.20, 2.18),
        _run("ideal", 1, 2.00, 2.00),
        _run("diloco-h20", 1, 2.10, 2.06),  # (2.20 − 2.06) / 0.20 = 0.70
        _run("independent", 2, 2.30, 2.28),
        _run("ideal", 2, 2.20, 2.20),
        _run("diloco-h20", 2, 2.28, 2.25),  # (2.30 − 2.25) / 0.10 = 0.50
    ]
    md = table(runs, ["independent", "ideal", "diloco-h20"], [1, 2])
    row = next(line for line in md.splitlines() if line.startswith("| diloco-h20 "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "2.1550 (2.0600–2.2500)"  # consensus: median, then min–max
    assert cells[4] == "0.60 (0.50–0.70)"  # fraction of ideal (consensus)
    assert cells[5] == "0.35 (0.20–0.50)"  # (2.20 − 2.10) / 0.20 and (2.30 − 2.28) / 0.10
    assert cells[-1] == "2"


def test_every_arm_gets_the_same_budget_and_a_constant_learning_rate() -> None:
    base = load_config()
    for name in VARIANTS:
        cfg = variant_config(base, name, steps=1500, seed=7)
        assert cfg.rounds * cfg.outer.num_inner_steps == 1500, name
        assert cfg.inner.min_lr_ratio == 1.0 and cfg.seed == 7 and not cfg.outer.align_rounds, name
