"""Loss under churn: a kill/restart schedule against the failure-free run of the same length.

Two real-process swarms on loopback, one after the other (bench/chaos_goodput.py's arms): 4 peers of
factored gossip with constant work per round, the first with a SIGKILL every `kill_every_s` (peers
in turn, each restarted 5 s later with its identity, late-joining the swarm's state) until every
peer has been killed once, the second without faults. The survivors' final validation loss must stay within 0.05 nats/byte of the
failure-free run's. The numbers are printed (run with -s). A quality target over two 3-minute
swarms, so it runs with the benchmarks (`make bench-check`), not in `make test`.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from bench.chaos_goodput import Plan, ours

LOSS_BOUND = 0.05
"""nats/byte between the churned and the failure-free run's mean final validation loss."""
PLAN = Plan(
    peers=4, rounds=300, num_inner_steps=20, kill_every_s=15.0, kills=4, d_model=32, seq_len=32, batch_size=4
)
"""Four kills, one per peer, 15 s apart, each restarted 5 s later; the swarm then trains on without
faults to its 300 rounds, so the test measures whether churn leaves lasting damage."""


@pytest.mark.bench
@pytest.mark.timeout(600)
def test_final_loss_under_kill_restart_schedule_matches_failure_free(tmp_path: Path) -> None:
    churn = ours(PLAN, tmp_path / "churn", kills=True)
    free = ours(PLAN, tmp_path / "failure-free", kills=False)
    assert churn["kills"] == PLAN.kills, f"{churn['kills']} kills happened in {churn['window_s']:.0f} s"
    # every peer that finished all rounds reports a loss; churn must leave at least the unkilled ones
    assert len(churn["final_val_loss"]) >= 2 and len(free["final_val_loss"]) == PLAN.peers
    churn_loss = statistics.fmean(churn["final_val_loss"])
    free_loss = statistics.fmean(free["final_val_loss"])
    print(
        f"\n{churn['kills']} kills in {churn['window_s']:.0f} s ({PLAN.rounds} rounds of H={PLAN.num_inner_steps}):"
        f" final val loss churn {churn_loss:.4f}, failure-free {free_loss:.4f},"
        f" difference {churn_loss - free_loss:+.4f} (bound {LOSS_BOUND})"
    )
    assert free_loss < 5.0, "the failure-free run did not train"  # 5.55 = uniform over bytes
    assert abs(churn_loss - free_loss) <= LOSS_BOUND
