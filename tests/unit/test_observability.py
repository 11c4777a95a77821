"""Per-round log lines (text and JSON), a peer's Prometheus metrics and `status`'s reading of heartbeats."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import logging
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nacl.signing
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from bench.fuzz.fakes import DictDHT
from p2p_trainer.config import RunConfig
from p2p_trainer.logs import CONTEXT, ContextFilter, formatter
from p2p_trainer.net import records
from p2p_trainer.net.direct import DirectError, DirectPlane, Receiver
from p2p_trainer.net.envelope import REASONS, Signer
from p2p_trainer.net.node_metrics import MetricsPortError, RejectedRecords
from p2p_trainer.net.records import Heartbeat
from p2p_trainer.net.status_client import read_status
from p2p_trainer.net.status_command import status_dict, status_table
from p2p_trainer.net.transport import Transport
from p2p_trainer.round_log import ExchangeRecord, FinalRecord, RoundRecord, StartRecord
from p2p_trainer.run.launcher import check_metrics_ports, local_options
from p2p_trainer.run.peer_metrics import PEER_METRICS, PeerMetrics, RefusedConnections
from p2p_trainer.run.round_lines import ObservedWriter, exchange_outcome, log_record
from tests.unit.test_record_bounds import SIGNERS

pytestmark = pytest.mark.timeout(30)

OK = ExchangeRecord("outer", True, 3, 0.5, 0.1, bytes_sent=100, bytes_received=120)


def a_round(n: int, *exchanges: ExchangeRecord) -> RoundRecord:
    return RoundRecord(
        peer="12D3KooWpeer00000000abcdefgh",
        time_s=1.0 + n,
        unix_time=1e9,
        round=n,
        step=5 * (n + 1),
        tokens=640 * (n + 1),
        train_loss=3.0 - 0.1 * n,
        val_loss=None,
        compute_s=0.6,
        blocked_s=0.2,
        wall_s=0.8,
        round_tokens=640,
        bytes_sent=sum(e.bytes_sent for e in exchanges),
        bytes_received=sum(e.bytes_received for e in exchanges),
        exchanges=exchanges,
    )


@pytest.fixture
def log_lines() -> Iterator[tuple[logging.Handler, io.StringIO]]:
    """A handler on the round logger with the CLI's context filter; the format is set by the test."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(ContextFilter())
    logger = logging.getLogger("p2p_trainer.round")
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.INFO
    saved = (CONTEXT.peer, CONTEXT.round, CONTEXT.step)
    CONTEXT.peer = "12D3KooWpeer00000000abcdefgh"
    yield handler, out
    logger.removeHandler(handler)
    logger.setLevel(level)
    CONTEXT.peer, CONTEXT.round, CONTEXT.step = saved


def test_exchange_outcomes() -> None:
    assert exchange_outcome(OK) == "ok"
    assert exchange_outcome(ExchangeRecord("outer", True, 0, 0.1, 0.1)) == "ok"  # 0: not counted, all
    assert exchange_outcome(ExchangeRecord("mix1", True, 2, 0.1, 0.1, left_out=("x",))) == "partial"
    assert exchange_outcome(ExchangeRecord("mix1", True, 1, 0.1, 0.1, own_parts=2)) == "partial"
    assert exchange_outcome(ExchangeRecord("outer", True, 1, 0.1, 0.1)) == "alone"
    assert exchange_outcome(ExchangeRecord("outer", False, 0, 0.1, 0.1, reason="timeout")) == "failed"


def test_a_round_line_names_peer_round_step_loss_throughput_and_exchanges(
    log_lines: tuple[logging.Handler, io.StringIO],
) -> None:
    handler, out = log_lines
    handler.setFormatter(formatter("text"))
    failed = ExchangeRecord("mix2", False, 0, 2.0, 2.0, reason="timeout")
    log_record(a_round(7, OK, failed))
    line = out.getvalue().strip()
    assert "[abcdefgh r7 s40] p2p_trainer.round: round 7 done: step 40, loss 2.300, 800 tokens/s" in line
    assert line.endswith("exchanges: outer ok(3) 0.50s, mix2 failed(0) 2.00s [timeout]")


def test_json_lines_parse_and_carry_the_round_fields(log_lines: tuple[logging.Handler, io.StringIO]) -> None:
    handler, out = log_lines
    handler.setFormatter(formatter("json"))
    log_record(StartRecord("12D3KooWpeer00000000abcdefgh", 1e9, "r" * 64, "diloco"))
    log_record(a_round(2, OK))
    log_record(FinalRecord("12D3KooWpeer00000000abcdefgh", 3, 1920, 2.5, 4.0, stopped=True, step=15))
    start, rnd, final = (json.loads(line) for line in out.getvalue().splitlines())
    assert start["event"] == "start" and start["method"] == "diloco"
    assert rnd["peer"] == "abcdefgh" and (rnd["round"], rnd["step"]) == (2, 15)
    assert rnd["loss"] == pytest.approx(2.8) and rnd["tokens_per_s"] == pytest.approx(800.0)
    assert rnd["exchanges"] == [
        {"tag": "outer", "outcome": "ok", "group_size": 3, "elapsed_s": 0.5, "reason": ""}
    ]
    assert rnd["level"] == "INFO" and rnd["message"].startswith("round 2 done")
    assert final["event"] == "final" and final["stopped"] is True and final["round"] == 3


def test_json_lines_keep_the_context_keys_and_exceptions() -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "boom %d", (1,), None)
    record.fields = {"peer": "forged", "extra": 1}
    CONTEXT.round = 4
    ContextFilter().filter(record)
    data = json.loads(formatter("json").format(record))
    assert data["peer"] != "forged" and data["extra"] == 1 and data["round"] == 4
    assert data["message"] == "boom 1"
    with pytest.raises(ValueError, match="unknown log format 'xml'"):
        formatter("xml")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_peer_metrics_follow_the_records_and_serve_over_http(tmp_path: Path) -> None:
    port = _free_port()
    metrics = PeerMetrics("127.0.0.1", port)
    try:
        metrics.registry.register(RejectedRecords({"read": lambda: {"bad-signature": 2}}))
        writer = ObservedWriter(tmp_path / "metrics.jsonl", [metrics.observe])
        writer.write(StartRecord("12D3KooWpeer", 1e9, "abc", "diloco"))
        failed = ExchangeRecord("outer", False, 0, 30.0, 30.0, reason="timeout")
        for n, ex in enumerate([OK, OK, failed]):
            writer.write(a_round(n, ex))
        writer.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    finally:
        metrics.close()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    names = {name for name, _ in samples}
    # all but those that need a running node (`watch`) are there from the records alone
    assert set(PEER_METRICS) - names - {"p2pt_exchange_duration_seconds"} == {
        "p2pt_live_peers",
        "p2pt_refused_total",
    }
    assert samples[("p2pt_rounds_total", ())] == 3 and samples[("p2pt_round", ())] == 3
    assert samples[("p2pt_tokens_total", ())] == 3 * 640 and samples[("p2pt_step", ())] == 15
    assert samples[("p2pt_utilisation", ())] == pytest.approx(0.75)
    assert samples[("p2pt_exchanges_total", (("outcome", "ok"), ("tag", "outer")))] == 2
    assert samples[("p2pt_exchanges_total", (("outcome", "failed"), ("tag", "outer")))] == 1
    assert samples[("p2pt_exchange_duration_seconds_count", (("tag", "outer"),))] == 3
    assert samples[("p2pt_sent_bytes_total", ())] == 200
    rejected = {labels: v for (name, labels), v in samples.items() if name == "p2pt_records_rejected_total"}
    assert len(rejected) == len(REASONS) and rejected[(("reason", "bad-signature"), ("source", "read"))] == 2
    info = next(labels for (name, labels) in samples if name == "p2pt_node_info")
    assert ("method", "diloco") in info and ("role", "peer") in info


def test_an_occupied_port_names_the_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MetricsPortError, match=rf"--metrics-port {port}: the port is already in use"):
            PeerMetrics("127.0.0.1", port)
    with pytest.raises(MetricsPortError, match=r"--metrics-port 9: cannot listen on 203\.0\.113\.9"):
        PeerMetrics("203.0.113.9", 9)  # an address this machine does not have


def test_local_checks_its_metrics_ports_before_it_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        opts = dataclasses.replace(local_options(tmp_path, RunConfig(), 2), metrics_port_base=port)
        with pytest.raises(RuntimeError, match=rf"--metrics-port-base {port}: port {port} for peer0"):
            check_metrics_ports(opts)
    too_high = dataclasses.replace(opts, metrics_port_base=65535)
    with pytest.raises(RuntimeError, match="peer1 would need port 65536"):
        check_metrics_ports(too_high)


def test_status_shows_the_checked_heartbeats_only() -> None:
    dht, now = DictDHT(), records.now()
    a, b, c, forger = SIGNERS
    records.publish_heartbeat(
        dht, "run", Heartbeat(a.peer_id, 12, 7680, 2.5, 4000.0, "0.1.0", now, round_started=now - 3), 30, a
    )
    records.publish_heartbeat(dht, "run", Heartbeat(b.peer_id, 11, 7040, None, 0.0, "0.1.0", now), 30, b)
    records.publish_heartbeat(dht, "run", Heartbeat(c.peer_id, 5, 0, None, 0.0, "0.1.0", now, True), 30, c)
    key, expiration = records.heartbeat_key("run"), now + 30
    forged = Heartbeat(a.peer_id, 10**6, 0, None, 0.0, "0.1.0", now)
    dht.store(key, forger.seal(key, forger.peer_id, expiration, forged.encode()), expiration, forger.peer_id)
    status = read_status(dht, "run", {"bad-signature": 1})
    assert [p.heartbeat.peer_id for p in status.peers] == sorted([a.peer_id, b.peer_id])
    assert status.left == (c.peer_id,) and status.rejected.get("body", 0) >= 1
    assert status.rejected["bad-signature"] >= 1
    shown = status_dict(status)
    row = next(p for p in shown["peers"] if p["peer_id"] == a.peer_id)
    assert row["round"] == 12 and row["loss"] == 2.5 and row["throughput_tokens_per_s"] == 4000.0
    assert row["software_version"] == "0.1.0" and row["in_round_s"] == pytest.approx(3, abs=1)
    assert json.loads(json.dumps(shown)) == shown
    table = status_table(status)
    assert table.row_count == 2 and "left" in str(table.caption)


def test_refused_streams_and_direct_connections_are_counted_by_route() -> None:
    async def refuse_one() -> DirectPlane:
        listener = DirectPlane(Signer(nacl.signing.SigningKey.generate()), _refusing_receiver())
        port = await listener.listen("127.0.0.1")
        dialler = DirectPlane(Signer(nacl.signing.SigningKey.generate()), _refusing_receiver())
        with pytest.raises(DirectError, match="not admitted"):
            await dialler.send(listener.peer_id, f"127.0.0.1:{port}", b"h", b"x")
        await dialler.close()
        await listener.close()
        return listener

    listener = asyncio.run(asyncio.wait_for(refuse_one(), 30))

    class Counters:
        """A Transport's two refusal counters, read as a Transport reads them (no p2pd needed)."""

        refused = 3
        direct: DirectPlane | None = listener
        direct_refused = Transport.direct_refused

    transport = Counters()
    registry = CollectorRegistry()
    registry.register(RefusedConnections(transport))  # type: ignore[arg-type]
    assert registry.get_sample_value("p2pt_refused_total", {"route": "p2pd"}) == 3
    assert registry.get_sample_value("p2pt_refused_total", {"route": "direct"}) == 1
    transport.direct = None  # the direct plane is off
    assert registry.get_sample_value("p2pt_refused_total", {"route": "direct"}) == 0


def _refusing_receiver() -> Receiver:
    async def admit(_sender: str) -> bool:
        return False

    return Receiver(admit, lambda _s: False, lambda *_: None, 1024, 1024, 2.0, 2)
