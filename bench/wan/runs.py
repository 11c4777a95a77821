"""One swarm run on the WAN testbed: bootstrap + N peers in namespaces, capped links and CPUs.

Used by `python -m bench.wan`. A `Variant` is a method with its settings (our `join` peers or the
hivemind.Optimizer baseline); `run_swarm` starts a fresh testbed for it, runs every peer for the
wall-time budget (longer where `min_rounds` asks for it), reads every peer's interface counters,
and removes the testbed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2p_trainer.config import ExchangeConfig, OuterConfig, RunConfig, to_toml
from p2p_trainer.lab.testbed import Testbed, TestbedConfig
from p2p_trainer.lab.testbed.layout import HostSpec
from p2p_trainer.round_log import read_log
from p2p_trainer.run.launcher import JoinArgs, bootstrap_argv, join_argv, read_initial_peers

logger = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Variant:
    """A method as benchmarked: a name for tables, our method name (or 'hivemind'), overrides."""

    name: str
    method: str
    outer: dict[str, Any] = field(default_factory=dict)
    """OuterConfig and ExchangeConfig overrides (by field name) on top of the method's reference values."""
    snapshot_every: int = 1
    """Rounds between snapshots (data-parallel's rounds are single steps, so it uses H)."""


@dataclass(frozen=True)
class SwarmSpec:
    peers: int
    rate_mbit: float
    cpu_cores: float
    budget_s: float
    """Wall-time budget of every peer (its --minutes), and the time at which methods are compared."""
    min_rounds: int = 0
    """A run whose slowest peer has fewer rounds than this at the budget goes on until it has them
    (then every peer gets SIGTERM), up to `max_budget_s`: so a slow method (hivemind's, DiLoCo's
    blocking rounds) still gets enough rounds to be judged, while the comparison time stays `budget_s`."""
    max_budget_s: float = 0.0
    """Hard wall-time cap of a run extended by `min_rounds` (0: 2.5 x budget_s)."""
    boot_cpu_cores: float = 0.2
    timeout_s: float = 30.0
    """Exchange timeout (ours) and averaging timeout (hivemind's): bounds the wait of a peer whose
    partner has already reached its budget and left; far above any exchange on the bench's links."""


CANONICAL = {"quorum_fraction": 1.0}
"""The baselines as their users run them: every exchange waits for its whole group (bounded by
`quorum_wait_max_s`, 15 s). Our resilient default (half the group, then a grace window sized by
the step time) would leave a peer that finishes a little after its group out of exchanges that
take seconds on these links, so the baselines' models would drift apart and the comparison would
measure our default, not the baselines (bench/RESULTS.md has the runs). Factored gossip keeps the
default: it is ours, failures included."""


def variant_config(base: RunConfig, v: Variant, h: int, timeout_s: float) -> RunConfig:
    if v.method == "hivemind":
        return dataclasses.replace(base, outer=OuterConfig.for_method("independent", num_inner_steps=h))
    exchange_keys = {f.name for f in dataclasses.fields(ExchangeConfig)}
    knobs = {k: value for k, value in v.outer.items() if k not in exchange_keys}
    rules = {k: value for k, value in v.outer.items() if k in exchange_keys}
    outer = OuterConfig.for_method(v.method, **{"num_inner_steps": h, **knobs})
    exchange = dataclasses.replace(base.exchange, **{"timeout_s": timeout_s, **rules})
    return dataclasses.replace(base, outer=outer, exchange=exchange)


def _start_bootstrap(tb: Testbed, out: Path, timeout_s: float = 90.0) -> tuple[subprocess.Popen[Any], str]:
    """The bootstrap node in host "boot" (the testbed kills it on close) and its --initial-peers line."""
    err = open(out / "bootstrap.log", "wb")
    argv = bootstrap_argv(out / "keys" / "boot.key", tb.address("boot"), port=31337, status_interval_s=60)
    proc = tb.run("boot", argv, env={"PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, stderr=err)
    return proc, read_initial_peers(proc, out / "bootstrap.log", timeout_s)


def _peer_argv(
    v: Variant, i: int, config: Path, initial: str, tb: Testbed, out: Path, spec: SwarmSpec
) -> list[str]:
    peer_dir = out / f"peer{i}"
    minutes = f"{peer_budget_s(spec) / 60:.4f}"
    if v.method == "hivemind":
        argv = [sys.executable, "-m", "bench.wan.hivemind_peer", "--config", str(config)]
        argv += [
            "--initial-peers",
            initial.split()[1],
            "--host",
            tb.address(f"h{i}"),
            "--run-dir",
            str(peer_dir),
        ]
        return [
            *argv,
            "--peers",
            str(spec.peers),
            "--minutes",
            minutes,
            "--snapshot-every",
            str(v.snapshot_every),
        ]
    args = JoinArgs(
        config_path=config,
        identity=out / "keys" / f"peer{i}.key",
        run_dir=peer_dir,
        host=tb.address(f"h{i}"),
        wait_for_peers=spec.peers,
        extra=("--minutes", minutes, "--snapshot-every", str(v.snapshot_every)),
    )
    return join_argv(args, initial)


def peer_budget_s(spec: SwarmSpec) -> float:
    """Each peer's own --minutes: the budget, or the cap when the harness may extend the run."""
    if spec.min_rounds <= 0:
        return spec.budget_s
    return spec.max_budget_s or 2.5 * spec.budget_s


def rounds_logged(metrics: Path) -> int:
    """Round records a peer has written so far (0 before its metrics.jsonl exists)."""
    return len(read_log(metrics).rounds)


def run_swarm(v: Variant, cfg: RunConfig, spec: SwarmSpec, out: Path) -> dict[str, Any]:
    """Run one variant; returns per-peer interface byte counts and the run's wall time."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "keys").mkdir(exist_ok=True)
    config = out / "config.toml"
    config.write_text(to_toml(cfg))
    hosts = (
        HostSpec("boot", spec.rate_mbit, spec.rate_mbit, spec.boot_cpu_cores),
        *tuple(HostSpec(f"h{i}", spec.rate_mbit, spec.rate_mbit, spec.cpu_cores) for i in range(spec.peers)),
    )
    started = time.monotonic()
    with Testbed(TestbedConfig(hosts=hosts)) as tb:
        _, initial = _start_bootstrap(tb, out)
        before = {f"h{i}": tb.counters(f"h{i}") for i in range(spec.peers)}
        procs = []
        for i in range(spec.peers):
            log = open(out / f"peer{i}.log", "wb")
            argv = _peer_argv(v, i, config, initial, tb, out, spec)
            procs.append(tb.run(f"h{i}", argv, env={"PYTHONPATH": str(REPO)}, stdout=log, stderr=log))
        launched = time.monotonic()
        limit = launched + peer_budget_s(spec) + 150.0  # start-up, final evaluation, shutdown
        stop_s: float | None = None
        while any(p.poll() is None for p in procs) and time.monotonic() < limit:
            time.sleep(1.0)
            elapsed = time.monotonic() - launched
            if stop_s is None and spec.min_rounds > 0 and elapsed >= spec.budget_s:
                fewest = min(rounds_logged(out / f"peer{i}" / "metrics.jsonl") for i in range(spec.peers))
                if fewest >= spec.min_rounds:
                    # enough rounds: a clean stop (SIGTERM checkpoints and exits) for all at once,
                    # so no peer is left waiting out an exchange with one that has gone
                    stop_s = elapsed
                    logger.info("  %.0f s: every peer has >= %d rounds, stopping", elapsed, spec.min_rounds)
                    for p in procs:
                        if p.poll() is None:
                            p.send_signal(signal.SIGTERM)
        counters = {name: tb.counters(name) - c for name, c in before.items()}
        codes = [p.poll() for p in procs]
    result = {
        "variant": v.name,
        "wall_s": time.monotonic() - started,
        "stop_s": stop_s if stop_s is not None else peer_budget_s(spec),
        "exit_codes": codes,
        "iface": {f"peer{i}": dataclasses.asdict(counters[f"h{i}"]) for i in range(spec.peers)},
    }
    (out / "run.json").write_text(json.dumps(result, indent=2))
    return result
