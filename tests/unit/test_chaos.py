"""Chaos scenarios (every shipped file loads), donor choice and retry, stale identity records, report."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from p2p_trainer.exchange.interface import Failed
from p2p_trainer.lab.chaos.report import peer_summary, tokens_per_round
from p2p_trainer.lab.chaos.timeline import ChaosScenarioError, chaos_scenario_from_dict, load_chaos_scenario
from p2p_trainer.net.dht import left_by_dead_process
from p2p_trainer.net.records import Liveness
from p2p_trainer.net.state_sync import DonorState, donor_order, first_download, heartbeat_lag_rounds
from p2p_trainer.round_log import ExchangeRecord, LogRecord, RoundRecord, StartRecord

SCENARIOS = sorted((Path(__file__).resolve().parents[2] / "bench" / "chaos").glob("*.toml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_every_shipped_scenario_loads(path: Path) -> None:
    scenario = load_chaos_scenario(path)
    assert scenario.events and scenario.peers >= 2
    assert list(scenario.events) == sorted(scenario.events, key=lambda e: e.at_s)
    assert scenario.needs_testbed == any(e.action in ("throttle", "cut", "heal") for e in scenario.events)


def test_shipped_scenarios_cover_the_faults() -> None:
    assert len(SCENARIOS) >= 3
    actions = {e.action for p in SCENARIOS for e in load_chaos_scenario(p).events}
    assert actions == {"kill", "stall", "resume", "restart", "kill_bootstrap", "throttle", "cut", "heal"}


@pytest.mark.parametrize(
    ("events", "match"),
    [
        ([{"at_s": 1, "action": "explode", "peer": 0}], "choose one of"),
        ([{"at_s": 1, "action": "restart", "peer": 0}], "was not killed"),
        ([{"at_s": 1, "action": "kill", "peer": 5}], "index in 0..1"),
        ([{"at_s": 1, "action": "throttle", "peer": 0}], "rate_mbit"),
        ([{"at_s": 1, "action": "stall", "peer": 0, "phase": "inner"}], "only kill takes a phase"),
        ([{"at_s": 1, "action": "kill", "peer": 0, "when": 3}], "unknown key"),
    ],
)
def test_bad_scenarios_say_what_to_change(events: list[dict[str, object]], match: str) -> None:
    with pytest.raises(ChaosScenarioError, match=match):
        chaos_scenario_from_dict({"peers": 2, "events": events})


def test_joiners_spread_over_the_freshest_donors() -> None:
    donors = [(f"d{i}", 10) for i in range(4)] + [("old", 3), ("new", 0)]
    firsts = {donor_order(f"joiner{j}", donors)[0] for j in range(40)}
    assert firsts == {"d0", "d1", "d2", "d3"}  # 40 joiners at once do not all hit one donor
    order = donor_order("joiner0", [*donors, ("joiner0", 11)])
    assert order[-1] == "old" and "new" not in order and "joiner0" not in order
    assert donor_order("x", [("y", 0)]) == []


def test_short_rounds_widen_the_fresh_donors() -> None:
    # 12 rounds/s read through a heartbeat up to 4 s old: a donor showing 40 rounds less may be level
    slack = heartbeat_lag_rounds(12.0, 4.0)
    assert slack == 49 and heartbeat_lag_rounds(1 / 60, 4.0) == 2 and heartbeat_lag_rounds(0.0, 4.0) == 1
    # a peer's heartbeat may claim any finite throughput: the slack saturates instead of overflowing
    assert heartbeat_lag_rounds(1e308, 4.0) == heartbeat_lag_rounds(float("inf"), 4.0) == 1 + 10**9
    donors = [("ahead", 81), ("lagging", 41), ("stuck", 3)]
    assert donor_order("j", donors, slack)[-1] == "stuck"
    assert set(donor_order("j", donors, slack)[:2]) == {"ahead", "lagging"}
    assert donor_order("j", donors) == ["ahead", "lagging", "stuck"]  # one round of slack: by round


def test_a_failed_donor_is_followed_by_the_next() -> None:
    state = DonorState(anchor=[torch.zeros(2)], momentum=[torch.zeros(2)], round=7)
    tried: list[str] = []

    def download(donor: str) -> DonorState | Failed:
        tried.append(donor)
        return Failed("connection reset mid-transfer") if donor == "a" else state

    assert first_download(["a", "b", "c"], download) == (state, "b")
    assert tried == ["a", "b"]
    assert first_download(["a"], download) == ["connection reset mid-transfer"]


def test_a_live_record_left_by_a_killed_process_on_this_host_is_stale() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()
    assert left_by_dead_process(Liveness("p", "i", "live", host, gone.pid))

    assert not left_by_dead_process(Liveness("p", "i", "live", host, os.getpid()))
    assert not left_by_dead_process(Liveness("p", "i", "live", host + "-elsewhere", gone.pid))


def _write(path: Path, records: list[LogRecord]) -> None:
    path.parent.mkdir(parents=True)
    path.write_text("".join(r.to_json() + "\n" for r in records))


def _round(rnd: int, t: float, tokens: int) -> RoundRecord:
    exchange = ExchangeRecord("noloco", ok=rnd != 1, group_size=2, elapsed_s=0.5, blocked_s=0.5)
    return RoundRecord(
        peer="p",
        time_s=t,
        unix_time=t,
        round=rnd,
        step=rnd,
        tokens=tokens,
        train_loss=1.0,
        val_loss=None,
        compute_s=1.0,
        blocked_s=0.5,
        wall_s=1.5,
        round_tokens=tokens,
        exchanges=(exchange,),
    )


def test_report_counts_lives_pauses_and_swarm_tokens_per_round(tmp_path: Path) -> None:
    start = StartRecord("p", 0.0)
    _write(
        tmp_path / "peer0" / "metrics.jsonl",
        [start, _round(0, 1, 50), _round(1, 2, 50), _round(2, 6, 100), _round(3, 7, 100)],
    )
    _write(
        tmp_path / "peer1" / "metrics.jsonl",
        [start, _round(0, 1, 50), _round(1, 2, 50), start, _round(3, 30, 1)],
    )
    p1 = peer_summary(tmp_path, 1)
    assert (
        p1["lives"] == 2 and p1["failed_exchanges"] == 1 and p1["longest_pause_s"] == 0.0
    )  # no gap across lives
    p0 = peer_summary(tmp_path, 0)
    assert p0["longest_pause_s"] == 3.0 and p0["tokens"] == 300
    tpr = tokens_per_round(tmp_path, 2, target=100)
    assert tpr["rounds"] == {0: 100, 1: 100, 2: 100, 3: 101}
    assert tpr["within_5pct"] == 4 and tpr["max_abs_deviation"] == pytest.approx(0.01)
