"""Decoupled DiLoCo syncer: quorum, grace window, late learners merged next time."""

import numpy as np
import pytest

from p2p_trainer.lab.sim.decoupled import GraceWindow, arrivals_from_matrix, run_syncer

INF = np.inf


def test_grace_window_formula_and_clamp() -> None:
    g = GraceWindow(gamma=0.5, overlap_s=100.0, max_s=30.0)
    assert g.seconds(t_quorum_s=20.0, t_sync_s=10.0) == pytest.approx(30.0)  # 0.5*70 = 35, clamped
    assert g.seconds(t_quorum_s=60.0, t_sync_s=10.0) == pytest.approx(15.0)
    assert g.seconds(t_quorum_s=200.0, t_sync_s=10.0) == 0.0


def test_quorum_then_grace_decides_who_is_merged() -> None:
    # 4 learners, one round each: arrivals at 10, 11, 30, 100.
    arrivals = np.array([[10.0, 11.0, 30.0, 100.0]])  # rounds x learners
    no_grace = GraceWindow(gamma=0.0, overlap_s=0.0, max_s=0.0)
    trace = run_syncer(arrivals_from_matrix(arrivals), quorum=2, grace=no_grace, sync_s=0.0, horizon_s=1000.0)
    # merge 1 at quorum (t=11) with 2 learners; the two late ones form the next quorum at t=100.
    np.testing.assert_allclose(trace.close_s, [11.0, 100.0])
    np.testing.assert_allclose(trace.contributors, [2.0, 2.0])

    wide = GraceWindow(gamma=1.0, overlap_s=25.0, max_s=1000.0)  # grace = 25 - 1 (quorum wait) - 0
    trace = run_syncer(arrivals_from_matrix(arrivals), quorum=2, grace=wide, sync_s=0.0, horizon_s=1000.0)
    assert trace.close_s[0] == pytest.approx(35.0)
    assert trace.contributors[0] == 3.0  # the learner at 30 made it inside the window
    assert trace.contributors.sum() == 3.0  # learner 4 alone never reaches quorum 2 again


def test_merge_never_waits_for_missing_learners() -> None:
    # learner 3 never arrives (failed for the whole horizon): merges still happen with the quorum.
    arrivals = np.array([[10.0, 20.0, 30.0], [12.0, 22.0, 32.0], [INF, INF, INF]]).T
    trace = run_syncer(
        arrivals_from_matrix(arrivals),
        quorum=2,
        grace=GraceWindow(1.0, 0.0, 0.0),
        sync_s=0.0,
        horizon_s=100.0,
    )
    np.testing.assert_allclose(trace.close_s, [12.0, 22.0, 32.0])
    assert np.all(trace.contributors == 2.0)
