"""Run a scenario: start the swarm, apply its events on schedule, stop, report (JSON and a table).

Event times count from the swarm's first completed round, so start-up time does not eat the
schedule. Events run one after another; a phase-aware kill waits (bounded) for its phase, which
delays the events behind it. The run ends `duration_s` after the first round, or once a peer has
finished all rounds (the others get 30 s to finish theirs), or when every peer has exited; the
peers are then stopped with SIGINT. Events not reached by then are reported as skipped.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from p2p_trainer.config import to_toml
from p2p_trainer.lab.chaos.injector import Injector, follow_log
from p2p_trainer.lab.chaos.nodes import ChaosSwarm, Node, TestbedChaosSwarm
from p2p_trainer.lab.chaos.report import peer_summary, tokens_per_round
from p2p_trainer.lab.chaos.timeline import ChaosScenario
from p2p_trainer.run.launcher import LocalOptions
from p2p_trainer.train.checkpoint import atomic_write_text

logger = logging.getLogger(__name__)


def _first_round_seen(run_dir: Path, peers: int) -> bool:
    return any(follow_log(run_dir, i).rounds for i in range(peers))


def _someone_finished(run_dir: Path, peers: int, rounds: int) -> bool:
    """A peer finished all rounds: the run is over (a peer restarted now would find no donor)."""
    return any(f.round >= rounds for i in range(peers) for f in follow_log(run_dir, i).finals)


def _wait(until: float, stop: threading.Event, nodes: dict[int, Node], done: Callable[[], bool]) -> bool:
    """Sleep until `until` (monotonic); False if stopped, every peer exited or the run is done first."""
    checked = 0.0
    while time.monotonic() < until:
        if stop.is_set() or not any(n.alive() for n in nodes.values()):
            return False
        if time.monotonic() - checked > 1.0:
            checked = time.monotonic()
            if done():
                return False
        time.sleep(0.05)
    return True


def run_scenario(
    scenario: ChaosScenario,
    out_dir: Path,
    stop: threading.Event | None = None,
    torch_threads: int = 1,
    startup_timeout_s: float = 120.0,
) -> dict[str, Any]:
    stop = stop or threading.Event()
    out_dir.mkdir(parents=True, exist_ok=True)
    config_path = out_dir / "config.toml"
    atomic_write_text(config_path, to_toml(scenario.run))
    opts = LocalOptions(
        config_path=config_path,
        run=scenario.run,
        peers=scenario.peers,
        run_dir=out_dir,
        torch_threads=torch_threads,
    )
    swarm: ChaosSwarm = (
        TestbedChaosSwarm(opts, scenario.rate_mbit) if scenario.needs_testbed else ChaosSwarm(opts)
    )
    started = time.monotonic()
    boot: Node | None = None
    peers: dict[int, Node] = {}
    skipped: list[str] = []
    injector: Injector | None = None
    try:
        boot = swarm.start_bootstrap()
        peers.update({i: swarm.start_peer(i, []) for i in range(scenario.peers)})
        deadline = time.monotonic() + startup_timeout_s
        while not _first_round_seen(out_dir, scenario.peers):
            if time.monotonic() > deadline or stop.is_set() or not any(n.alive() for n in peers.values()):
                raise RuntimeError(f"the swarm did not complete a round within {startup_timeout_s:.0f} s")
            time.sleep(0.1)
        t0 = time.monotonic()
        injector = Injector(swarm, peers, boot, t0)

        def done() -> bool:
            return _someone_finished(out_dir, scenario.peers, scenario.run.rounds)

        for event in scenario.events:
            if not _wait(t0 + event.at_s, stop, peers, done):
                skipped.append(event.describe())
                continue
            injector.apply(event)
        end = t0 + scenario.duration_s if scenario.duration_s else float("inf")
        if _wait(end, stop, peers, done) is False and not stop.is_set():
            _wait(time.monotonic() + 30.0, stop, peers, lambda: False)  # the others finish their last rounds
    finally:
        for node in peers.values():
            node.stop(timeout_s=30)
        if boot is not None:
            boot.stop(timeout_s=10)
        swarm.close()
    report = build_report(scenario, out_dir, time.monotonic() - started, injector, skipped)
    atomic_write_text(out_dir / "report.json", json.dumps(report, indent=2))
    return report


def build_report(
    scenario: ChaosScenario, out_dir: Path, wall_s: float, injector: Injector | None, skipped: list[str]
) -> dict[str, Any]:
    per_peer = [peer_summary(out_dir, i) for i in range(scenario.peers)]
    target = scenario.run.outer.target_tokens_per_round
    return {
        "scenario": scenario.name,
        "peers": scenario.peers,
        "method": scenario.run.outer.method,
        "testbed": scenario.needs_testbed,
        "wall_s": wall_s,
        "events": [a.as_dict() for a in injector.applied] if injector else [],
        "removed_socket_files": sorted(str(p) for p in injector.removed_sockets) if injector else [],
        "skipped_events": skipped,
        "per_peer": per_peer,
        "failed_exchanges": sum(p["failed_exchanges"] for p in per_peer),
        "longest_pause_s": max((p["longest_pause_s"] for p in per_peer), default=0.0),
        "tokens_per_round": tokens_per_round(out_dir, scenario.peers, target),
    }
