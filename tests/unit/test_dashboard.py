"""The dashboard without a swarm: its history, its JSON endpoint, its page and its port checks."""

from __future__ import annotations

import dataclasses
import json
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from p2p_trainer.dashboard.exchanges import RunDirExchanges
from p2p_trainer.dashboard.history import SwarmHistory
from p2p_trainer.dashboard.poller import Poller
from p2p_trainer.dashboard.server import API_PATH, DashboardPortError, DashboardServer
from p2p_trainer.round_log import ExchangeRecord, RoundRecord
from p2p_trainer.run.launcher import LOOPBACK, LocalOptions, check_dashboard_port
from tests.conftest import ManualClock, tiny_config, wait_until

A, B = (
    "12D3KooWAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAaaaa",
    "12D3KooWBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBbbbb",
)


def peer(pid: str, age_s: float, round_: int, loss: float | None = 3.0, tps: float = 100.0) -> dict[str, Any]:
    """One peer of a `status_dict` object."""
    return {
        "peer_id": pid,
        "round": round_,
        "tokens_processed": 1000 * round_,
        "loss": loss,
        "throughput_tokens_per_s": tps,
        "software_version": "0.1.0",
        "heartbeat_age_s": age_s,
        "in_round_s": 1.0,
        "suspects": [],
    }


def read(now: float, *peers: dict[str, Any], left: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "swarm": "s",
        "unix_time": now,
        "peers": list(peers),
        "left": list(left),
        "records_rejected": {"body": 1},
    }


def test_each_heartbeat_is_one_point_and_each_read_one_swarm_point() -> None:
    clock = ManualClock(1000.0)
    history = SwarmHistory("s", clock=clock)
    assert history.snapshot()["state"] == "connecting"
    history.add_read(read(1000.5, peer(A, 0.5, 0, loss=None), peer(B, 0.2, 0)))
    history.add_read(read(1001.5, peer(A, 1.5, 0, loss=None), peer(B, 1.2, 0)))  # the same heartbeats
    history.add_read(read(1002.5, peer(A, 0.5, 1, loss=2.5), peer(B, 2.2, 0)))  # A's next one
    clock.now = 1003.0
    snap = history.snapshot()
    json.dumps(snap, allow_nan=False)  # what the endpoint sends
    assert snap["state"] == "live" and snap["reads"] == 3 and snap["error"] is None
    a, b = snap["history"]["peers"][A], snap["history"]["peers"][B]
    assert a == {
        "t": [0.0, 2.0],
        "round": [0, 1],
        "loss": [None, 2.5],
        "tokens_per_s": [100.0, 100.0],
        "tokens": [0, 1000],
    }
    assert b["t"] == [0.3] and snap["points"] == 3
    swarm = snap["history"]["swarm"]
    assert swarm["t"] == [0.5, 1.5, 2.5] and swarm["live_peers"] == [2, 2, 2]
    assert swarm["tokens_per_s"] == [200.0] * 3 and swarm["tokens"] == [0, 0, 1000]
    assert snap["history"]["index"] == {A: 0, B: 1}
    rows = {p["peer_id"]: p for p in snap["peers"]}
    assert rows[A]["index"] == 0 and rows[A]["round"] == 1 and rows[A]["heartbeat_age_s"] == 1.0
    assert rows[B]["heartbeat_age_s"] == 2.7 and rows[B]["exchanges"] is None
    assert snap["records_rejected"] == {"body": 1} and snap["exchanges"] is None
    assert set(snap) == {
        *("swarm", "state", "error", "unix_time", "started_unix", "updated_unix", "reads", "peers"),
        *("left", "records_rejected", "points", "history", "exchanges"),
    }


def test_a_peer_that_left_keeps_its_curve_and_errors_show_until_the_next_read() -> None:
    history = SwarmHistory("s", clock=ManualClock(1000.0))
    history.add_read(read(1001.0, peer(A, 0.0, 1), peer(B, 0.0, 1)))
    history.add_read(read(1003.0, peer(A, 0.0, 2), left=(B,)))
    history.note_error("reading swarm 's' failed: timeout")
    snap = history.snapshot()
    assert snap["state"] == "error" and "timeout" in snap["error"]
    assert [p["peer_id"] for p in snap["peers"]] == [A] and snap["left"] == [B]
    assert len(snap["history"]["peers"][B]["t"]) == 1 and snap["history"]["index"][B] == 1
    history.add_read(read(1005.0, peer(A, 0.0, 3)))
    assert history.snapshot()["state"] == "live" and history.snapshot()["error"] is None


def test_a_long_history_is_thinned_but_spans_the_whole_run() -> None:
    history = SwarmHistory("s", max_points=8, clock=ManualClock(0.0))
    for i in range(1, 101):
        history.add_read(read(2.0 * i, peer(A, 0.0, i)))
    snap = history.snapshot()
    a, swarm = snap["history"]["peers"][A], snap["history"]["swarm"]
    for series in (a, swarm):
        assert 4 <= len(series["t"]) <= 8 and series["t"] == sorted(series["t"])
        assert series["t"][-1] == 200.0 and series["t"][0] <= 20.0  # the newest point, and an early one
    assert a["round"][-1] == 100 and len(a["round"]) == len(a["t"])


def _metrics_line(pid: str, round_: int, exchanges: tuple[ExchangeRecord, ...]) -> str:
    r = RoundRecord(
        peer=pid,
        time_s=float(round_),
        unix_time=1000.0 + round_,
        round=round_,
        step=5 * round_,
        tokens=100 * round_,
        train_loss=3.0,
        val_loss=None,
        compute_s=1.0,
        blocked_s=0.1,
        wall_s=1.2,
        exchanges=exchanges,
    )
    return r.to_json() + "\n"


def test_exchanges_come_from_the_run_directory_metrics_files(tmp_path: Path) -> None:
    ok = ExchangeRecord("outer", True, 3, 0.5, 0.1, started_unix=1001.0)
    partial = dataclasses.replace(ok, left_out=("abcd1234",), started_unix=1002.0)
    failed = ExchangeRecord("outer", False, 0, 2.0, 2.0, reason="timeout", started_unix=1003.0)
    (tmp_path / "peer0").mkdir()
    path = tmp_path / "peer0" / "metrics.jsonl"
    path.write_text(_metrics_line(A, 0, (ok,)) + _metrics_line(A, 1, (partial,)))
    (tmp_path / "metrics.jsonl").write_text(_metrics_line(B, 0, (failed,)))
    source = RunDirExchanges(tmp_path)
    view = source.read()
    assert (
        view.per_peer[A]["ok"] == 1 and view.per_peer[A]["partial"] == 1 and view.per_peer[A]["failed"] == 0
    )
    assert view.per_peer[A]["last"]["outcome"] == "partial" and view.per_peer[A]["last"]["round"] == 1
    assert view.per_peer[B]["failed"] == 1 and view.per_peer[B]["last"]["reason"] == "timeout"
    assert [e["unix_time"] for e in view.recent] == [1001.0, 1002.0, 1003.0]
    with path.open("a") as f:  # followed: a line added later shows on the next read
        f.write(_metrics_line(A, 2, (ok,)))
    assert source.read().per_peer[A]["ok"] == 2

    history = SwarmHistory("s", clock=ManualClock(1000.0))
    history.add_read(read(1004.0, peer(A, 0.0, 2)))
    history.set_exchanges(source.read())
    snap = history.snapshot()
    assert snap["peers"][0]["exchanges"]["ok"] == 2
    assert snap["exchanges"]["source"] == str(tmp_path)
    assert [e["t"] for e in snap["exchanges"]["recent"]] == [1.0, 1.0, 2.0, 3.0]


def _get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def test_the_server_serves_the_page_and_the_json_and_names_an_occupied_port() -> None:
    history = SwarmHistory("s")
    history.add_read(read(time.time(), peer(A, 0.0, 1)))
    server = DashboardServer(LOOPBACK, 0, history.snapshot)
    server.start()
    try:
        code, kind, body = _get(server.url)
        page = body.decode()
        assert code == 200 and kind.startswith("text/html") and API_PATH in page
        # nothing from elsewhere: the page must work without internet access
        assert "src=" not in page and "<link" not in page and "@import" not in page and "//cdn" not in page
        code, kind, body = _get(server.url.rstrip("/") + API_PATH)
        assert code == 200 and kind == "application/json"
        assert json.loads(body)["peers"][0]["peer_id"] == A
        assert _get(server.url + "favicon.ico")[0] == 404
        with pytest.raises(DashboardPortError, match=rf"^--port {server.port}: the port is already in use"):
            DashboardServer(LOOPBACK, server.port, history.snapshot)
    finally:
        server.close()


def test_the_poller_shows_a_failed_read_and_recovers() -> None:
    history = SwarmHistory("s")
    answers: list[Any] = [RuntimeError("DHT get timed out"), read(time.time(), peer(A, 0.0, 1))]

    def next_read() -> dict[str, Any]:
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return dict(answer, unix_time=time.time())

    poller = Poller(next_read, history, interval_s=0.05)
    poller.start()
    try:
        assert wait_until(lambda: history.snapshot()["reads"] >= 2, 10, poll_s=0.05)
    finally:
        poller.stop()
    snap = history.snapshot()
    assert snap["state"] == "live" and snap["peers"][0]["peer_id"] == A


def test_local_names_an_occupied_dashboard_port_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        port = taken.getsockname()[1]
        opts = LocalOptions(tmp_path / "c.toml", tiny_config("diloco", 1), 2, tmp_path, dashboard_port=port)
        with pytest.raises(RuntimeError, match=rf"^--dashboard-port {port}: the port is not free"):
            check_dashboard_port(opts)
    check_dashboard_port(opts)  # free again
