"""The simulator's scenario: one frozen config describing the swarm, its failures and its links.

Every field carries its unit in its name. `Scenario.validate()` says what to change when a value
makes no sense; `load_scenario(path)` reads the same fields from a TOML file (flat table, or under
a `[scenario]` table). The defaults describe a mid-sized swarm; the published Decoupled DiLoCo
comparison (docs/simulator.md) only changes `num_chips`, `num_peers` and the horizon.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import tomllib

SECONDS_PER_YEAR = 365.0 * 86400.0

AllReduce = Literal["ring", "tree"]
ALLREDUCES: tuple[str, ...] = get_args(AllReduce)
"""All-reduce latency models (latency.py)."""

METHODS = ("sync_dp", "elastic_dp", "diloco", "decoupled", "noloco", "gossip")
"""Every simulated method, in report order (see timing.py)."""


class ScenarioError(ValueError):
    """A scenario value that cannot be simulated; the message says what to change."""


@dataclass(frozen=True)
class Scenario:
    """A swarm to simulate. Peers are the units that exchange (DiLoCo peers, Decoupled DiLoCo learners)."""

    num_chips: int = 4096
    """Accelerators in the whole swarm (10 to 10^6+)."""
    num_peers: int = 16
    """Peers (= learners for Decoupled DiLoCo); each runs synchronous data parallelism inside.
    `num_chips` must be a multiple of it."""
    chips_per_slice: int = 256
    """Failure domain: one chip's interruption takes this many chips out until repaired (a rack/host group)."""
    mtbi_chip_s: float = SECONDS_PER_YEAR
    """Mean time between interruptions of one chip (exponential inter-arrival)."""
    repair_s: float = 3600.0
    """Time for a failed slice to be repaired or swapped and return to its peer."""
    restart_s: float = 60.0
    """Stop-the-world restart of a synchronous job (reschedule + restore in-memory checkpoint)."""
    reconfig_s: float = 15.0
    """Pause of a synchronous group (an elastic job or one peer) to drop a failed slice and re-form."""
    checkpoint_interval_s: float = 2.0
    """How often sync data-parallel checkpoints; on restart it loses the work since the last one."""
    step_s: float = 2.0
    """Time of one inner (or data-parallel) step at nominal speed."""
    straggler_sigma: float = 0.0
    """Lognormal sigma of each peer's step-time factor (0: all peers equally fast)."""
    round_jitter_sigma: float = 0.0
    """Lognormal sigma of a peer's compute time per round, drawn afresh every round (OS scheduling,
    background work). Peers that never wait for each other drift apart by a random walk of these."""
    model_params: float = 1.0e9
    """Parameters of the model exchanged by the outer methods."""
    bytes_per_param: float = 4.0
    """Bytes per exchanged value before compression (4 = fp32 pseudo-gradients)."""
    compression_ratio: float = 1.0
    """Exchanged bytes are divided by this (e.g. 8 for fp32 -> int4)."""
    bandwidth_gbps: float = 10.0
    """Median per-peer link bandwidth (each direction) in Gbit/s."""
    bandwidth_sigma: float = 0.0
    """Lognormal sigma of per-peer bandwidth (heterogeneous links)."""
    latency_ms: float = 50.0
    """Median one-way per-peer latency in milliseconds."""
    latency_sigma: float = 0.0
    """Lognormal sigma of per-peer latency."""
    exchange_overhead_s: float = 0.0
    """Fixed cost of every outer exchange (matchmaking, group formation), added to the transfer time;
    hivemind's is about its `matchmaking_time`. Not applied to data-parallel's per-step collective."""
    link_efficiency: float = 1.0
    """Fraction of the link rate an exchange achieves (transport framing, encryption, flow control,
    the CPU of the network stack on a slow host); 1 is the ideal alpha-beta model."""
    overlap_cpu_s_per_mb: float = 0.0
    """Compute time a background exchange (Mix1) takes from its peer's inner steps, per MB the peer
    sends: peers whose network stack runs on the cores that also compute (CPU peers, the WAN
    testbed's capped peers). 0 for accelerators, whose steps do not wait for the host's network stack."""
    round_overhead_s: float = 0.0
    """Per-round time outside inner steps and exchanges (outer step, snapshot, metrics, checkpoint)."""
    num_inner_steps: int = 100
    """H: inner steps per outer round (the run config's outer.num_inner_steps, as are the knobs
    below named like run-config fields: outer.group_size, outer.mix2_every, exchange.quorum_fraction...)."""
    group_size: int = 2
    """g: NoLoCo group size and Mix1 group size of factored gossip."""
    mix2_every: int = 10
    """Factored gossip: blocking Mix2 every this many rounds (0: never)."""
    mix2_group_size: int = 0
    """Factored gossip Mix2 group size; 0 means all peers (an all-reduce)."""
    allreduce: AllReduce = "ring"
    """All-reduce latency model for DiLoCo and Mix2: "ring" or "tree" (latency.py)."""
    quorum_fraction: float = 0.5
    """Decoupled DiLoCo: the syncer merges once this fraction of learners has contributed."""
    grace_gamma: float = 1.0
    """Decoupled DiLoCo: gamma_g of the adaptive grace window (docs/algorithms.md §4)."""
    grace_max_s: float = 60.0
    """Decoupled DiLoCo: upper clamp of the grace window."""
    grace_overlap_steps: int = 10
    """τ: inner steps a peer may run while its exchange completes (learners never wait for less);
    exchange.grace_overlap_steps in the run config."""
    horizon_s: float = 86400.0
    """Simulated wall-clock time."""
    seed: int = 0
    """Root seed; every random stream (failures, speeds, links, groups) is derived from it."""
    methods: tuple[str, ...] = field(default=METHODS)
    """Which methods to simulate (subset of METHODS)."""

    @property
    def chips_per_peer(self) -> int:
        return self.num_chips // self.num_peers

    @property
    def exchange_bytes(self) -> float:
        """Bytes of one full model-sized message after compression."""
        return self.model_params * self.bytes_per_param / self.compression_ratio

    def validate(self) -> Scenario:
        """Raise ScenarioError naming the field and what to change; return self when valid."""
        for name in ("num_chips", "num_peers", "chips_per_slice", "num_inner_steps", "group_size"):
            if getattr(self, name) < 1:
                raise ScenarioError(f"{name}={getattr(self, name)}: must be >= 1")
        _check_positive(self, ("mtbi_chip_s", "step_s", "model_params", "bytes_per_param"))
        _check_positive(self, ("compression_ratio", "bandwidth_gbps", "horizon_s", "checkpoint_interval_s"))
        _check_non_negative(self, ("repair_s", "restart_s", "reconfig_s", "latency_ms", "grace_max_s"))
        _check_non_negative(
            self, ("exchange_overhead_s", "overlap_cpu_s_per_mb", "round_overhead_s", "round_jitter_sigma")
        )
        if not 0.0 < self.link_efficiency <= 1.0:
            raise ScenarioError(f"link_efficiency={self.link_efficiency}: must be in (0, 1]")
        _check_non_negative(self, ("straggler_sigma", "bandwidth_sigma", "latency_sigma", "grace_gamma"))
        if self.num_chips % self.num_peers:
            raise ScenarioError(
                f"num_chips={self.num_chips} is not a multiple of num_peers={self.num_peers}: "
                "change one so that every peer has the same number of chips"
            )
        if self.chips_per_slice > self.chips_per_peer:
            raise ScenarioError(
                f"chips_per_slice={self.chips_per_slice} exceeds chips per peer={self.chips_per_peer}: "
                "lower chips_per_slice or use fewer peers"
            )
        if not 0.0 < self.quorum_fraction <= 1.0:
            raise ScenarioError(f"quorum_fraction={self.quorum_fraction}: must be in (0, 1]")
        if self.group_size > self.num_peers:
            raise ScenarioError(f"group_size={self.group_size} exceeds num_peers={self.num_peers}")
        if self.mix2_every < 0 or self.mix2_group_size < 0 or self.grace_overlap_steps < 0:
            raise ScenarioError("mix2_every, mix2_group_size and grace_overlap_steps must be >= 0")
        if self.allreduce not in ALLREDUCES:
            raise ScenarioError(f"allreduce={self.allreduce!r}: choose one of {', '.join(ALLREDUCES)}")
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise ScenarioError(f"methods={list(self.methods)}: choose a non-empty subset of {list(METHODS)}")
        return self

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["methods"] = list(self.methods)
        return out


def _check_positive(s: Scenario, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(s, name)
        if not (math.isfinite(value) and value > 0):
            raise ScenarioError(f"{name}={value}: must be a finite number > 0")


def _check_non_negative(s: Scenario, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(s, name)
        if not (math.isfinite(value) and value >= 0):
            raise ScenarioError(f"{name}={value}: must be a finite number >= 0")


def scenario_from_dict(values: dict[str, Any]) -> Scenario:
    """Build and validate a Scenario; unknown keys and wrong types are errors that name the key."""
    fields = {f.name: f for f in dataclasses.fields(Scenario)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ScenarioError(f"unknown scenario keys {unknown}; valid keys: {sorted(fields)}")
    kwargs: dict[str, Any] = {}
    defaults = Scenario()
    for key, value in values.items():
        default = getattr(defaults, key)
        if key == "methods":
            if not isinstance(value, list | tuple) or not all(isinstance(m, str) for m in value):
                raise ScenarioError(f"methods must be a list of names from {list(METHODS)}")
            kwargs[key] = tuple(value)
        elif isinstance(default, bool) or isinstance(value, bool):
            raise ScenarioError(f"{key}={value!r}: booleans are not accepted here")
        elif isinstance(default, int) and not isinstance(default, bool):
            if not isinstance(value, int):
                raise ScenarioError(f"{key}={value!r}: must be an integer")
            kwargs[key] = value
        elif isinstance(default, float):
            if not isinstance(value, int | float):
                raise ScenarioError(f"{key}={value!r}: must be a number")
            kwargs[key] = float(value)
        else:
            if not isinstance(value, str):
                raise ScenarioError(f"{key}={value!r}: must be a string")
            kwargs[key] = value
    return Scenario(**kwargs).validate()


def load_scenario(path: str | Path) -> Scenario:
    """Read a TOML scenario: keys of Scenario at top level or in a `[scenario]` table."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{path}: not valid TOML ({e})") from e
    table = data.get("scenario", data)
    if not isinstance(table, dict):
        raise ScenarioError(f"{path}: [scenario] must be a table")
    return scenario_from_dict(table)
