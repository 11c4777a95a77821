"""Scale simulator: goodput, utilisation and round times of each method for swarms up to 10^6+ chips.

Entry points: `simulate(scenario)` (all metrics per method) and `predict(scenario)` (the few numbers a
testbed can measure). The click command lives in `command.py`; see docs/simulator.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from p2p_trainer.lab.sim.scenario import Scenario, ScenarioError, load_scenario

if TYPE_CHECKING:
    from p2p_trainer.lab.sim.engine import predict, simulate

__all__ = ["Scenario", "ScenarioError", "load_scenario", "predict", "simulate"]


def __getattr__(name: str) -> Any:
    # The engine pulls in numpy; loading it on first use keeps `p2p-trainer --help` (which builds
    # the simulate command's options from Scenario) quick.
    if name in ("predict", "simulate"):
        from p2p_trainer.lab.sim import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
