"""Scale simulator: goodput, utilisation and round times of each method for swarms up to 10^6+ chips.

Entry points: `simulate(scenario)` (all metrics per method) and `predict(scenario)` (the few numbers a
testbed can measure). The click command lives in `command.py`; see docs/simulator.md.
"""

from p2p_trainer.lab.sim.engine import predict, simulate
from p2p_trainer.lab.sim.scenario import Scenario, ScenarioError, load_scenario

__all__ = ["Scenario", "ScenarioError", "load_scenario", "predict", "simulate"]
