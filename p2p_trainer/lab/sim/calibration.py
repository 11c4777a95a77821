"""Decoupled DiLoCo's published goodput points (arXiv 2604.21428) and the scenario we compare them with.

The assumptions are documented in docs/simulator.md, next to the figures. Two are calibrated, each
on one published point, and the other points are then predictions:
`restart_s` = 60 s from "1 learner at 2.4M chips = 18%" and `reconfig_s` = 15 s from "elastic
data-parallel at 1.2M chips = 58%". Everything else is a stated physical assumption.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2p_trainer.lab.sim.scenario import SECONDS_PER_YEAR, Scenario


@dataclass(frozen=True)
class PublishedPoint:
    """One published goodput figure."""

    num_chips: int
    method: str
    """Our method name: sync_dp (a single SPMD learner), elastic_dp or decoupled."""
    num_learners: int
    goodput: float
    label: str


PUBLISHED: tuple[PublishedPoint, ...] = (
    PublishedPoint(1_200_000, "elastic_dp", 1, 0.58, "1.2M chips, elastic data-parallel"),
    PublishedPoint(1_200_000, "decoupled", 8, 0.88, "1.2M chips, 8 learners"),
    PublishedPoint(1_200_000, "decoupled", 16, 0.93, "1.2M chips, 16 learners"),
    PublishedPoint(2_400_000, "sync_dp", 1, 0.18, "2.4M chips, 1 learner"),
    PublishedPoint(2_400_000, "elastic_dp", 1, 0.40, "2.4M chips, elastic data-parallel"),
    PublishedPoint(2_400_000, "decoupled", 8, 0.80, "2.4M chips, 8 learners"),
)

TOLERANCE = 0.10
"""Acceptance: each simulated goodput within ±10 points of the published one."""


def published_scenario(point: PublishedPoint, horizon_s: float = 86400.0, seed: int = 0) -> Scenario:
    """The datacenter-scale scenario of the comparison (see docs/simulator.md for each value)."""
    return Scenario(
        num_chips=point.num_chips,
        num_peers=point.num_learners,
        chips_per_slice=256,
        mtbi_chip_s=SECONDS_PER_YEAR,
        repair_s=3600.0,
        restart_s=60.0,
        reconfig_s=15.0,
        checkpoint_interval_s=2.0,
        step_s=2.0,
        model_params=1.0e9,
        bytes_per_param=4.0,
        # Datacenter fabric between learners: exchanges take milliseconds, as in the paper's setting.
        bandwidth_gbps=1.0e5,
        latency_ms=0.01,
        num_inner_steps=100,
        group_size=min(2, point.num_learners),
        quorum_fraction=0.5,
        horizon_s=horizon_s,
        seed=seed,
        methods=(point.method,),
    ).validate()
