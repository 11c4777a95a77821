"""Timed fault injection on a live swarm: kills at a phase, stalls, restarts and link faults.

A scenario (`timeline.py`) is a run config, a swarm size and timed events; `runner.py` starts the
swarm (`nodes.py`, on loopback or in the testbed's namespaces), lets the `Injector` apply the events
(`injector.py`), stops it and reports per peer and per round from the metrics files (`report.py`).
`p2p-trainer chaos` runs one; see docs/chaos.md.
"""
