"""Chaos scenarios as data: a swarm (peers, run config, length) and a list of timed fault events.

    name = "kill-restart"
    peers = 4
    duration_s = 240          # stop the swarm after this long (from the first round), or
    # rounds come from [run]: the swarm stops when every live peer reached them
    [run]                     # a run config, exactly as in peers/*.toml
    rounds = 40
    [[events]]
    at_s = 60                 # seconds after the first peer finished its first round
    action = "kill"           # see ACTIONS
    peer = 1
    phase = "inner"           # kill only: any | inner | mix1 | blocking | download | serve
    [[events]]
    at_s = 70
    action = "restart"        # same identity and run directory; late-joins (or resume = true)
    peer = 1

Link events (throttle, cut, heal) need the emulated-WAN testbed: the runner puts every node in
its own network namespace when a scenario has one (root only).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from p2p_trainer.config import ConfigError, RunConfig, config_from_dict
from p2p_trainer.fault_points import CHAOS_POINTS

ACTIONS = ("kill", "stall", "resume", "restart", "kill_bootstrap", "throttle", "cut", "heal")
"""kill: SIGKILL the peer's whole process group (its DHT process and p2pd too), at `phase`.
stall / resume: SIGSTOP / SIGCONT the peer's processes. restart: start a killed peer again with
the same identity key and run directory. kill_bootstrap: SIGKILL the bootstrap node.
throttle: cap the peer's link at `rate_mbit` (both directions); cut / heal: drop / restore it."""
LINK_ACTIONS = ("throttle", "cut", "heal")


class ChaosScenarioError(ValueError):
    """A scenario file that cannot run; the message says what to change."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ChaosScenarioError(message)


@dataclass(frozen=True)
class Event:
    at_s: float
    """Seconds after the swarm's first completed round."""
    action: str
    peer: int | None = None
    """Index of the target peer (all actions but kill_bootstrap)."""
    phase: str = "any"
    """kill only: where it lands, one of `fault_points.CHAOS_POINTS`. inner: mid-way through the
    inner steps; mix1: just after a round starts (factored's Mix1 is in flight); blocking: in the
    round's end-of-round exchange; download: while the peer downloads the swarm's state after a
    (re)start; serve: while the peer sends its state to a joiner (a donor dying mid-transfer; needs
    a throttled link to land inside the transfer). inner/mix1/blocking are timed from the peer's
    last round record (its compute and blocked seconds), download and serve from its log lines;
    all approximate."""
    rate_mbit: float | None = None
    """throttle only: the link's new rate, both directions."""
    resume: bool = False
    """restart only: continue from the peer's checkpoint instead of downloading the swarm's state."""

    def validate(self, peers: int, where: str) -> None:
        _require(
            self.action in ACTIONS, f"{where}: action {self.action!r}; choose one of {', '.join(ACTIONS)}"
        )
        _require(self.at_s >= 0, f"{where}: at_s={self.at_s}; use seconds >= 0")
        if self.action == "kill_bootstrap":
            _require(self.peer is None, f"{where}: kill_bootstrap takes no peer")
        else:
            _require(
                self.peer is not None and 0 <= self.peer < peers,
                f"{where}: peer={self.peer}; use an index in 0..{peers - 1}",
            )
        _require(
            self.phase in CHAOS_POINTS,
            f"{where}: phase {self.phase!r}; choose one of {', '.join(CHAOS_POINTS)}",
        )
        _require(self.phase == "any" or self.action == "kill", f"{where}: only kill takes a phase")
        _require(
            (self.action == "throttle") == (self.rate_mbit is not None),
            f"{where}: rate_mbit goes with (and only with) throttle",
        )
        _require(self.rate_mbit is None or self.rate_mbit > 0, f"{where}: rate_mbit must be positive")
        _require(not self.resume or self.action == "restart", f"{where}: only restart takes resume")

    def describe(self) -> str:
        target = "bootstrap" if self.peer is None else f"peer{self.peer}"
        extra = f" at {self.phase}" if self.phase != "any" else ""
        extra += f" to {self.rate_mbit} Mbit/s" if self.rate_mbit is not None else ""
        return f"{self.action} {target}{extra}"


@dataclass(frozen=True)
class ChaosScenario:
    name: str
    peers: int
    run: RunConfig
    events: tuple[Event, ...] = ()
    duration_s: float | None = None
    """Stop every peer this long after the first round; None: run until the peers finish `run.rounds`."""
    rate_mbit: float | None = None
    """Testbed only: every host's link rate at the start (None: unshaped)."""
    testbed: bool = False
    """Run the nodes in network namespaces (forced on by link events)."""

    @property
    def needs_testbed(self) -> bool:
        return self.testbed or any(e.action in LINK_ACTIONS for e in self.events)

    def validate(self, where: str) -> None:
        _require(self.peers >= 1, f"{where}: peers={self.peers}; use at least 1")
        _require(self.duration_s is None or self.duration_s > 0, f"{where}: duration_s must be positive")
        for i, event in enumerate(self.events):
            event.validate(self.peers, f"{where} events[{i}]")
        killed: set[int] = set()
        for e in sorted(self.events, key=lambda e: e.at_s):
            if e.action == "kill" and e.peer is not None:
                killed.add(e.peer)
            if e.action == "restart":
                _require(
                    e.peer in killed, f"{where}: restart of peer{e.peer} at {e.at_s} s, but it was not killed"
                )
                killed.discard(e.peer)  # type: ignore[arg-type]


_SCENARIO_KEYS = {"name", "peers", "duration_s", "rate_mbit", "testbed", "run", "events"}
_EVENT_KEYS = {"at_s", "action", "peer", "phase", "rate_mbit", "resume"}


def chaos_scenario_from_dict(raw: dict[str, Any], where: str = "scenario") -> ChaosScenario:
    unknown = set(raw) - _SCENARIO_KEYS
    _require(
        not unknown,
        f"{where}: unknown key(s) {sorted(unknown)}; allowed: {', '.join(sorted(_SCENARIO_KEYS))}",
    )
    try:
        run = config_from_dict(raw.get("run", {}), where=f"{where} [run]")
    except ConfigError as exc:
        raise ChaosScenarioError(str(exc)) from None
    events = []
    for i, ev in enumerate(raw.get("events", [])):
        bad = set(ev) - _EVENT_KEYS
        _require(
            not bad,
            f"{where} events[{i}]: unknown key(s) {sorted(bad)}; allowed: {', '.join(sorted(_EVENT_KEYS))}",
        )
        _require("at_s" in ev and "action" in ev, f"{where} events[{i}]: needs at_s and action")
        events.append(Event(**ev))
    scenario = ChaosScenario(
        name=str(raw.get("name", "chaos")),
        peers=int(raw.get("peers", 4)),
        run=run,
        events=tuple(sorted(events, key=lambda e: e.at_s)),
        duration_s=raw.get("duration_s"),
        rate_mbit=raw.get("rate_mbit"),
        testbed=bool(raw.get("testbed", False)),
    )
    scenario.validate(where)
    return scenario


def load_chaos_scenario(path: str | Path) -> ChaosScenario:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ChaosScenarioError(f"scenario file {path} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ChaosScenarioError(f"scenario file {path} is not valid TOML: {exc}") from exc
    return chaos_scenario_from_dict(raw, where=str(path))
