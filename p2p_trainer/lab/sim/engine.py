"""Run the selected methods on one sampled swarm."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from p2p_trainer.lab.sim.decoupled import decoupled
from p2p_trainer.lab.sim.sampled import SampledSwarm
from p2p_trainer.lab.sim.scenario import Scenario
from p2p_trainer.lab.sim.timing import MethodResult, diloco, elastic_dp, gossip, noloco, sync_dp

log = logging.getLogger(__name__)

RUNNERS: dict[str, Callable[[SampledSwarm], MethodResult]] = {
    "sync_dp": sync_dp,
    "elastic_dp": elastic_dp,
    "diloco": diloco,
    "decoupled": decoupled,
    "noloco": noloco,
    "gossip": gossip,
}


def simulate(scenario: Scenario) -> dict[str, MethodResult]:
    """Every method in `scenario.methods`, on the same failures, speeds and links (same seed)."""
    scenario.validate()
    swarm = SampledSwarm.sample(scenario)
    log.info("sampled %d chip interruptions over %.0f s", len(swarm.failures), scenario.horizon_s)
    results: dict[str, MethodResult] = {}
    for name in scenario.methods:
        t0 = time.perf_counter()
        results[name] = RUNNERS[name](swarm)
        log.info("%s: goodput %.3f in %.2f s", name, results[name].goodput, time.perf_counter() - t0)
    return results


def predict(scenario: Scenario) -> dict[str, dict[str, float]]:
    """What a testbed can measure, per method: utilisation, mean round time, goodput, bytes/peer/round.

    Meant for small swarms (4-8 peers) to be compared with WAN-testbed measurements.
    """
    return {
        name: {
            "utilisation": r.utilisation,
            "round_time_s": r.mean_round_s,
            "goodput": r.goodput,
            "bytes_per_peer_per_round": r.bytes_per_peer_per_round,
        }
        for name, r in simulate(scenario).items()
    }
