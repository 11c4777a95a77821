"""Bench: wall time and peak memory of the simulator on ~10^6 chips over a simulated day.

Usage: python -m bench.sim_bench [SCENARIO.toml]   (default: bench/scenarios/million_chips.toml)
Target on a 2-core machine: <= 60 s and <= 4 GB peak resident memory.
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

from p2p_trainer.lab.sim import load_scenario, simulate

DEFAULT = Path(__file__).parent / "scenarios" / "million_chips.toml"


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    scenario = load_scenario(path)
    t0 = time.perf_counter()
    results = simulate(scenario)
    wall_s = time.perf_counter() - t0
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # ru_maxrss is KiB on Linux
    print(
        f"scenario: {path.name}: {scenario.num_chips} chips, {scenario.num_peers} peers, {scenario.horizon_s:.0f} s"
    )
    for name, r in results.items():
        print(f"  {name:11s} goodput {r.goodput:6.3f}  round {r.mean_round_s:8.2f} s  rounds {r.rounds}")
    print(f"wall time: {wall_s:.2f} s (target <= 60)")
    print(f"peak resident memory: {peak_gb:.2f} GB (target <= 4)")


if __name__ == "__main__":
    main()
