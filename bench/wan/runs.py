"""One swarm run on the WAN testbed: N peers in namespaces, capped links and CPUs, one shared budget.

Used by `python -m bench.wan`. A `Variant` is an arm: one of our methods (`join` peers), the
hivemind.Optimizer baseline, or the bare torch loop (no node at all). `run_swarm` starts a fresh
testbed for it and its peers (peer k reads data stream `slot{k}` in every arm, so arms see the
same batches), waits until every peer is training (t0, the shared start), stops all of them with
SIGTERM once the budget has passed, reads every peer's interface counters at that moment, and
removes the testbed. Peers snapshot their model at every round end, so the analysis can take each
peer's model at exactly t0 + budget (bench/wan/budget.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.wan.budget import swarm_t0, training_start_unix
from p2p_trainer.config import ExchangeConfig, NetworkConfig, OuterConfig, RunConfig, to_toml
from p2p_trainer.lab.testbed import Testbed, TestbedConfig
from p2p_trainer.lab.testbed.layout import HostSpec
from p2p_trainer.round_log import RoundLogError, read_log
from p2p_trainer.run.launcher import JoinArgs, bootstrap_argv, join_argv, read_initial_peers

logger = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
DEFAULT_METHOD = "default"
"""Not a method: the arm runs the packaged default.toml as it is, only H and timeout set."""
BASELINE_PEERS = ("hivemind", "bare")
"""Arms whose peers are the bench's own scripts (bench/wan/<name>_peer.py), not `p2p-trainer join`."""


@dataclass(frozen=True)
class Variant:
    """An arm as benchmarked: a name for tables, our method name (or 'hivemind', 'bare'), overrides."""

    name: str
    method: str
    outer: dict[str, Any] = field(default_factory=dict)
    """OuterConfig, ExchangeConfig and NetworkConfig overrides (by field name) on top of the method's
    reference values; for 'hivemind', the baseline peer's options (bench/wan/hivemind_peer.py)."""
    family: str = ""
    """Arms of one family are alternatives of one method: the bench picks one on the tuning seeds."""


@dataclass(frozen=True)
class SwarmSpec:
    peers: int
    rate_mbit: float
    cpu_cores: float
    budget_s: float
    """Training time of every peer after the shared start t0; models are compared at t0 + budget_s."""
    boot_cpu_cores: float = 0.2
    timeout_s: float = 30.0
    """Exchange timeout (ours) and averaging timeout (hivemind's): bounds the wait of a peer whose
    partner has already reached its budget and left; far above any exchange on the bench's links."""
    startup_timeout_s: float = 180.0
    """How long the peers may take from launch until every one has finished a round."""


def rounds_logged(metrics: Path) -> int:
    """Round records a peer has written so far (0 before its metrics.jsonl exists)."""
    return len(read_log(metrics).rounds)


CANONICAL = {"quorum_fraction": 1.0}
"""The baselines as their users run them: every exchange waits for its whole group (bounded by
`quorum_wait_max_s`, 15 s). Our resilient default (half the group, then a grace window sized by
the step time) would leave a peer that finishes a little after its group out of exchanges that
take seconds on these links, so the baselines' models would drift apart and the comparison would
measure our default, not the baselines (bench/RESULTS.md has the runs). Factored gossip keeps the
default: it is ours, failures included."""


def variant_config(base: RunConfig, v: Variant, h: int, timeout_s: float) -> RunConfig:
    if v.method in BASELINE_PEERS:
        return dataclasses.replace(base, outer=OuterConfig.for_method("independent", num_inner_steps=h))
    if v.method == DEFAULT_METHOD:  # a variant of it may change [outer] fields, nothing else
        outer = dataclasses.replace(base.outer, num_inner_steps=h, **v.outer)
        return dataclasses.replace(
            base, outer=outer, exchange=dataclasses.replace(base.exchange, timeout_s=timeout_s)
        )
    exchange_keys = {f.name for f in dataclasses.fields(ExchangeConfig)}
    network_keys = {f.name for f in dataclasses.fields(NetworkConfig)}
    knobs = {k: value for k, value in v.outer.items() if k not in exchange_keys | network_keys}
    rules = {k: value for k, value in v.outer.items() if k in exchange_keys}
    links = {k: value for k, value in v.outer.items() if k in network_keys}
    outer = OuterConfig.for_method(v.method, **{"num_inner_steps": h, **knobs})
    # every other arm states its own exchange rules on top of the plain ones, not the shipped
    # default's: "diloco" is DiLoCo as its users run it, whatever default.toml chooses
    exchange = dataclasses.replace(ExchangeConfig(), **{"timeout_s": timeout_s, **rules})
    network = dataclasses.replace(base.network, **links)
    return dataclasses.replace(base, outer=outer, exchange=exchange, network=network)


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
    # a safety cap only: the bench stops every peer at the shared budget
    minutes = f"{(spec.budget_s + spec.startup_timeout_s + 60) / 60:.4f}"
    common = [
        "--config",
        str(config),
        "--run-dir",
        str(peer_dir),
        "--data-key",
        f"slot{i}",
        "--minutes",
        minutes,
    ]
    if v.method == "bare":
        return [sys.executable, "-m", "bench.wan.bare_peer", *common]
    if v.method == "hivemind":
        argv = [
            sys.executable,
            "-m",
            "bench.wan.hivemind_peer",
            *common,
            "--initial-peers",
            initial.split()[1],
        ]
        argv += ["--host", tb.address(f"h{i}"), "--peers", str(spec.peers)]
        argv += ["--averaging-timeout-s", f"{spec.timeout_s:g}"]
        if not v.outer.get("delay_state_averaging", True):
            argv.append("--no-delay-state-averaging")
        return argv
    args = JoinArgs(
        config_path=config,
        identity=out / "keys" / f"peer{i}.key",
        run_dir=peer_dir,
        host=tb.address(f"h{i}"),
        wait_for_peers=spec.peers,
        data_key=f"slot{i}",
        extra=("--minutes", minutes, "--snapshot-every", "1"),
    )
    return join_argv(args, initial)


def _wait_for_training(out: Path, procs: list[subprocess.Popen[Any]], timeout_s: float) -> float | None:
    """t0: once every peer has logged a round, the latest of their first-round starts (None: timeout)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            starts = [
                training_start_unix(read_log(out / f"peer{i}" / "metrics.jsonl").rounds)
                for i in range(len(procs))
            ]
        except RoundLogError:  # a line still being written: look again
            starts = []
        t0 = swarm_t0(starts)
        if t0 is not None:
            return t0
        if any(p.poll() is not None for p in procs):
            return None
        time.sleep(0.5)
    return None


def _sleep_until(t_unix: float, procs: list[subprocess.Popen[Any]]) -> None:
    while time.time() < t_unix and any(p.poll() is None for p in procs):
        time.sleep(min(0.2, max(0.0, t_unix - time.time())))


def run_swarm(v: Variant, cfg: RunConfig, spec: SwarmSpec, out: Path) -> dict[str, Any]:
    """Run one arm to the shared budget; returns t0, interface byte counts, exit codes, machine load."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "keys").mkdir(exist_ok=True)
    config = out / "config.toml"
    config.write_text(to_toml(cfg))
    hosts = (
        HostSpec("boot", spec.rate_mbit, spec.rate_mbit, spec.boot_cpu_cores),
        *tuple(HostSpec(f"h{i}", spec.rate_mbit, spec.rate_mbit, spec.cpu_cores) for i in range(spec.peers)),
    )
    load_before = os.getloadavg()
    started = time.monotonic()
    with Testbed(TestbedConfig(hosts=hosts)) as tb:
        initial = "" if v.method == "bare" else _start_bootstrap(tb, out)[1]
        before = {f"h{i}": tb.counters(f"h{i}") for i in range(spec.peers)}
        launched_unix = time.time()
        procs = []
        for i in range(spec.peers):
            log = open(out / f"peer{i}.log", "wb")
            argv = _peer_argv(v, i, config, initial, tb, out, spec)
            procs.append(tb.run(f"h{i}", argv, env={"PYTHONPATH": str(REPO)}, stdout=log, stderr=log))
        t0 = _wait_for_training(out, procs, spec.startup_timeout_s)
        end = (t0 if t0 is not None else time.time()) + spec.budget_s
        if t0 is not None:
            _sleep_until(end, procs)
        else:
            logger.warning(
                "  %s: not every peer started training within %.0f s", v.name, spec.startup_timeout_s
            )
        end_unix = time.time()
        counters = {name: tb.counters(name) - c for name, c in before.items()}
        for p in procs:  # all at once: a peer waiting on a stopped partner would stall
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=90)
            except subprocess.TimeoutExpired:
                logger.warning("  %s: a peer did not stop within 90 s of SIGTERM", v.name)
        codes = [p.poll() for p in procs]
    result = {
        "variant": v.name,
        "wall_s": time.monotonic() - started,
        "t0_unix": t0,
        "budget_s": spec.budget_s,
        "launched_unix": launched_unix,
        "stopped_unix": end_unix,
        "window_s": end_unix - launched_unix,
        "startup_s": (t0 - launched_unix) if t0 is not None else None,
        "exit_codes": codes,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "iface": {f"peer{i}": dataclasses.asdict(counters[f"h{i}"]) for i in range(spec.peers)},
    }
    (out / "run.json").write_text(json.dumps(result, indent=2))
    return result
