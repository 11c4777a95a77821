"""Pins the simulator to Decoupled DiLoCo's published goodput figures (assumptions: docs/simulator.md)."""

import pytest

from p2p_trainer.lab.sim import simulate
from p2p_trainer.lab.sim.calibration import PUBLISHED, TOLERANCE, PublishedPoint, published_scenario


@pytest.mark.parametrize("point", PUBLISHED, ids=[p.label for p in PUBLISHED])
def test_goodput_matches_published_figure(point: PublishedPoint) -> None:
    result = simulate(published_scenario(point))[point.method]
    assert abs(result.goodput - point.goodput) <= TOLERANCE, (point.label, result.goodput)


def test_ordering_at_scale_more_learners_more_goodput() -> None:
    by_learners = {}
    for learners in (1, 8, 16):
        point = PublishedPoint(1_200_000, "decoupled", learners, 0.0, "")
        by_learners[learners] = simulate(published_scenario(point))["decoupled"].goodput
    sync = simulate(published_scenario(PublishedPoint(1_200_000, "sync_dp", 1, 0.0, "")))["sync_dp"].goodput
    elastic = simulate(published_scenario(PublishedPoint(1_200_000, "elastic_dp", 1, 0.0, "")))
    assert sync < elastic["elastic_dp"].goodput < by_learners[8] < by_learners[16]
    # one learner that re-forms elastically is elastic data-parallel, give or take a quorum of one
    assert by_learners[1] == pytest.approx(elastic["elastic_dp"].goodput, abs=0.03)
