"""Watching a running swarm: Prometheus endpoints, `p2p-trainer status`, per-round log lines.

One 2-peer swarm serves all the checks of a live swarm (each swarm costs the shared CPUs more
than its assertions); the bad-input checks need none and run alone.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from p2p_trainer.net.addresses import EXAMPLE_INITIAL_PEER
from p2p_trainer.net.records import REACHABILITY
from p2p_trainer.round_log import EXCHANGE_OUTCOMES, read_log
from p2p_trainer.run.launcher import LOOPBACK, LocalSwarm, local_options
from p2p_trainer.run.local_swarm import peer_rows
from p2p_trainer.run.peer_metrics import PEER_METRICS
from tests.conftest import Tracker, rounds_of, tiny_config, wait_until

pytestmark = pytest.mark.timeout(300)

BOOTSTRAP_METRICS = (
    "p2pt_node_info",
    "p2pt_live_peers",
    "p2pt_records_rejected_total",
    "p2pt_uptime_seconds",
)


def free_port_base(n: int) -> int:
    """The first of `n` consecutive ports free on loopback now."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((LOOPBACK, 0))
            base = int(probe.getsockname()[1])
        if base + n > 65535:
            continue
        try:
            held = []
            for port in range(base, base + n):
                s = socket.socket()
                held.append(s)
                s.bind((LOOPBACK, port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise AssertionError("no run of free ports")


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] of one scrape of http://127.0.0.1:port/metrics."""
    with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    return sum(v for _, v in samples.get(name, []))


def missing(samples: dict[str, list[tuple[dict[str, str], float]]], names: tuple[str, ...]) -> list[str]:
    """Names without a sample (a histogram by its `_count`)."""
    return [n for n in names if n not in samples and f"{n}_count" not in samples]


def status_argv(initial_peers: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "p2p_trainer", "status", *initial_peers.split(), *extra]


def popen(argv: list[str], tracked: Tracker) -> subprocess.Popen[str]:
    return tracked(
        subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
    )


def nothing_left(tracked: Tracker, proc: subprocess.Popen[str]) -> bool:
    return not tracked.left(proc)


def test_metrics_status_and_round_lines_of_a_running_swarm(tmp_path: Path, tracked: Tracker) -> None:
    base = free_port_base(3)
    opts = dataclasses.replace(
        local_options(tmp_path, tiny_config("diloco", rounds=100_000), 2), metrics_port_base=base
    )
    limit = ["--minutes", "3"]  # stopped by the test; the bound only ends a test that hangs
    with LocalSwarm(opts) as swarm:
        swarm.start_bootstrap()
        swarm.start_peer(0, [*limit, "--log-format", "json"])
        swarm.start_peer(1, limit)
        assert wait_until(lambda: all(len(rounds_of(tmp_path, i)) >= 2 for i in range(2)), 180)
        ids = [read_log(tmp_path / f"peer{i}" / "metrics.jsonl").starts[0].peer for i in range(2)]

        first = [scrape(base + i) for i in range(2)]
        for i, samples in enumerate(first):
            assert not missing(samples, PEER_METRICS), f"peer{i}: {missing(samples, PEER_METRICS)}"
            info = samples["p2pt_node_info"][0][0]
            assert info["peer_id"] == ids[i] and info["role"] == "peer" and info["method"] == "diloco"
            outcomes = {labels["outcome"] for labels, v in samples["p2pt_exchanges_total"] if v > 0}
            assert outcomes and outcomes <= {"ok", "partial", "alone", "failed"}, outcomes
            assert value(samples, "p2pt_exchange_duration_seconds_count") > 0
            assert value(samples, "p2pt_sent_bytes_total") > 0 and value(samples, "p2pt_tokens_total") > 0
            sources = {labels["source"] for labels, _ in samples["p2pt_records_rejected_total"]}
            assert sources == {"read", "stored"}
        # rounds advance between scrapes, and both peers see each other
        assert wait_until(
            lambda: value(scrape(base), "p2pt_rounds_total") > value(first[0], "p2pt_rounds_total"), 60
        )
        assert wait_until(lambda: value(scrape(base + 1), "p2pt_live_peers") == 2, 60)
        boot = scrape(base + 2)
        assert not missing(boot, BOOTSTRAP_METRICS), missing(boot, BOOTSTRAP_METRICS)
        assert boot["p2pt_node_info"][0][0]["role"] == "bootstrap" and value(boot, "p2pt_live_peers") >= 2

        # status: both peers with their rounds; it is no peer (the peers still see two)
        proc = popen(status_argv(swarm.initial_peers, "--json"), tracked)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        shown = json.loads(out)
        assert sorted(p["peer_id"] for p in shown["peers"]) == sorted(ids), shown
        assert all(p["round"] >= 1 and p["software_version"] for p in shown["peers"]), shown
        # the heartbeat's progress: inner steps, bytes moved, the reachability check, last exchange
        for p in shown["peers"]:
            assert p["round_steps"] == 5 and 0 <= p["round_step"] <= 5 and p["step"] >= 5, p
            assert p["bytes_sent"] > 0 and p["bytes_received"] > 0, p
            assert p["reachability"] in REACHABILITY and p["last_exchange"] in EXCHANGE_OUTCOMES, p
        # and `local`'s table reads each peer's phase from its run directory, mid-round
        states = [row["state"] for row in peer_rows(tmp_path, 2)]
        assert all(s.startswith("training ") or s == "exchanging" for s in states), states
        assert wait_until(lambda: not tracked.left(proc), 15), tracked.left(proc)
        assert value(scrape(base), "p2pt_live_peers") == 2

        # --watch --json: one object per read, until Ctrl-C (exit 130), nothing left behind
        watcher = popen(status_argv(swarm.initial_peers, "--json", "--watch", "--interval-s", "1"), tracked)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(watcher.stdout.readline() for _ in range(2)))  # type: ignore[union-attr]
        reader.start()
        reader.join(120)
        assert len(lines) == 2 and all(len(json.loads(line)["peers"]) == 2 for line in lines), lines
        watcher.send_signal(signal.SIGINT)
        _, err = watcher.communicate(timeout=60)
        assert watcher.returncode == 130, err[-2000:]
        assert wait_until(lambda: not tracked.left(watcher), 15), tracked.left(watcher)

    # one log line per round record, carrying the peer's short id and the round
    text = (tmp_path / "peer1" / "log.txt").read_text()
    done = re.findall(rf"\[{ids[1][-8:]} r(\d+) s(\d+)\] \S+: round (\d+) done: step (\d+), loss ", text)
    rounds = rounds_of(tmp_path, 1)
    assert [int(d[2]) for d in done] == [r.round for r in rounds]
    assert all(d[0] == d[2] and d[1] == d[3] for d in done)
    objects = [json.loads(line) for line in (tmp_path / "peer0" / "log.txt").read_text().splitlines()]
    round_lines = [o for o in objects if o.get("event") == "round"]
    assert [o["round"] for o in round_lines] == [r.round for r in rounds_of(tmp_path, 0)]
    assert all(o["peer"] == ids[0][-8:] and o["loss"] > 0 and o["tokens_per_s"] > 0 for o in round_lines)
    assert all(
        e["outcome"] in {"ok", "partial", "alone", "failed"} for o in round_lines for e in o["exchanges"]
    )


def test_status_names_a_malformed_or_unreachable_initial_peer(tracked: Tracker) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind((LOOPBACK, 0))
        port = probe.getsockname()[1]
    unreachable = f"/ip4/{LOOPBACK}/tcp/{port}/p2p/{EXAMPLE_INITIAL_PEER.rsplit('/', 1)[1]}"
    for bad in ("/ip4/127.0.0.1/tcp/31337", unreachable):
        proc = popen(status_argv(f"--initial-peers {bad}", "--json"), tracked)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 1 and not out, (out, err[-2000:])
        assert bad in err, err[-2000:]
        assert wait_until(functools.partial(nothing_left, tracked, proc), 15), tracked.left(proc)


@pytest.mark.parametrize("command", ["join", "bootstrap"])
def test_an_occupied_metrics_port_is_named_and_nothing_starts(
    tmp_path: Path, tracked: Tracker, command: str
) -> None:
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [sys.executable, "-m", "p2p_trainer", command, "--identity", str(tmp_path / "node.key")]
        argv += ["--metrics-port", str(port), "--metrics-host", LOOPBACK]
        if command == "join":
            argv += ["--initial-peers", EXAMPLE_INITIAL_PEER, "--run-dir", str(tmp_path / "run")]
        proc = popen(argv, tracked)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-2000:]
    assert f"--metrics-port {port}: the port is already in use" in err, err[-2000:]
    assert not tracked.left(proc), tracked.left(proc)
    assert not (tmp_path / "node.key").exists()  # refused before the node (its identity) was made
