"""A training peer's Prometheus endpoint (`p2p-trainer join --metrics-port N`).

Updated from the peer's records as `round_lines.ObservedWriter` writes them (`observe`), so the
endpoint counts what metrics.jsonl says; what no record carries (the live peers, the records
rejected) is asked of the swarm view and the DHT node at scrape time (`watch`). Every name
starts with `p2pt_`; counters end in `_total`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram, Info
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from p2p_trainer import __version__
from p2p_trainer.net.node_metrics import PREFIX, MetricsServer, SampledGauge, new_registry, rejected_records
from p2p_trainer.round_log import FinalRecord, LogRecord, RejoinRecord, RoundRecord, StartRecord
from p2p_trainer.run.round_lines import exchange_outcome, tokens_per_s, utilisation

if TYPE_CHECKING:
    from p2p_trainer.net.dht import NetNode
    from p2p_trainer.net.swarm_view import SwarmView
    from p2p_trainer.net.transport import Transport

EXCHANGE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Seconds: a loopback exchange of a tiny model takes tens of ms, a WAN one of a real model minutes."""

PEER_METRICS = (
    "p2pt_node_info",
    "p2pt_rounds_total",
    "p2pt_round",
    "p2pt_step",
    "p2pt_tokens_total",
    "p2pt_train_loss",
    "p2pt_val_loss",
    "p2pt_utilisation",
    "p2pt_throughput_tokens_per_second",
    "p2pt_compute_seconds_total",
    "p2pt_blocked_seconds_total",
    "p2pt_sent_bytes_total",
    "p2pt_received_bytes_total",
    "p2pt_exchanges_total",
    "p2pt_exchange_duration_seconds",
    "p2pt_rejoins_total",
    "p2pt_live_peers",
    "p2pt_records_rejected_total",
    "p2pt_refused_total",
)
"""Every metric a peer's endpoint serves (the histogram as its `_bucket`, `_sum` and `_count`)."""


class PeerMetrics:
    """The endpoint and its metrics; `observe` each record, `watch` the node and view once they run."""

    def __init__(self, host: str, port: int, flag: str = "--metrics-port") -> None:
        r = self.registry = new_registry()
        self._info = Info(f"{PREFIX}node", "This node's identity, software and run", registry=r)
        self._labels = {"role": "peer", "version": __version__}
        self._info.info(self._labels)
        self.rounds = Counter(f"{PREFIX}rounds", "Outer rounds this peer process completed", registry=r)
        self.round = Gauge(f"{PREFIX}round", "Outer rounds the peer's state has reached", registry=r)
        self.step = Gauge(f"{PREFIX}step", "Inner steps the peer has done", registry=r)
        self.tokens = Counter(f"{PREFIX}tokens", "Tokens this peer process trained on", registry=r)
        self.train_loss = Gauge(f"{PREFIX}train_loss", "Last round's training loss (nats/byte)", registry=r)
        self.val_loss = Gauge(f"{PREFIX}val_loss", "Latest validation loss (NaN before one)", registry=r)
        self.val_loss.set(math.nan)
        self.utilisation = Gauge(
            f"{PREFIX}utilisation", "Share of the last round's wall time spent in inner steps", registry=r
        )
        self.throughput = Gauge(
            f"{PREFIX}throughput_tokens_per_second", "This peer's tokens per second, last round", registry=r
        )
        self.compute_s = Counter(f"{PREFIX}compute_seconds", "Time spent in inner steps", registry=r)
        self.blocked_s = Counter(f"{PREFIX}blocked_seconds", "Time training waited for exchanges", registry=r)
        self.sent = Counter(f"{PREFIX}sent_bytes", "Bytes this peer's exchanges sent", registry=r)
        self.received = Counter(f"{PREFIX}received_bytes", "Bytes its exchanges received", registry=r)
        self.exchanges = Counter(
            f"{PREFIX}exchanges",
            "Exchanges by tag and outcome (ok, partial, alone, failed)",
            ["tag", "outcome"],
            registry=r,
        )
        self.exchange_s = Histogram(
            f"{PREFIX}exchange_duration_seconds",
            "How long each exchange took, by tag",
            ["tag"],
            buckets=EXCHANGE_BUCKETS,
            registry=r,
        )
        self.rejoins = Counter(
            f"{PREFIX}rejoins", "Times the peer fell behind and adopted the swarm's state", registry=r
        )
        self.server = MetricsServer(r, host, port, flag)

    def watch(self, node: NetNode, view: SwarmView, transport: Transport | None = None) -> None:
        """Report the live peers (as the exchanges see them), the records rejected and the
        connections refused from now on."""
        self._labels["peer_id"] = node.peer_id
        self._info.info(self._labels)
        live = "Peers in this peer's live view (itself included), whom its exchanges group"
        self.registry.register(SampledGauge("live_peers", live, lambda: len(view.live_peers())))
        self.registry.register(rejected_records(node))
        if transport is not None:
            self.registry.register(RefusedConnections(transport))

    def observe(self, record: LogRecord) -> None:
        if isinstance(record, RoundRecord):
            self._round(record)
        elif isinstance(record, StartRecord):
            self._labels.update(peer_id=record.peer, method=record.method, run_id=record.run_id[:16])
            self._info.info(self._labels)
        elif isinstance(record, RejoinRecord):
            self.rejoins.inc()
            self.round.set(record.to_round)
        elif isinstance(record, FinalRecord):
            self.round.set(record.round)
            if record.val_loss is not None:
                self.val_loss.set(record.val_loss)

    def _round(self, r: RoundRecord) -> None:
        self.rounds.inc()
        self.round.set(r.round + 1)
        self.step.set(r.step)
        self.tokens.inc(max(0, r.round_tokens))
        self.train_loss.set(r.train_loss)
        if r.val_loss is not None:
            self.val_loss.set(r.val_loss)
        self.utilisation.set(utilisation(r))
        self.throughput.set(tokens_per_s(r))
        self.compute_s.inc(max(0.0, r.compute_s))
        self.blocked_s.inc(max(0.0, r.blocked_s))
        self.sent.inc(max(0, r.bytes_sent))
        self.received.inc(max(0, r.bytes_received))
        for e in r.exchanges:
            self.exchanges.labels(tag=e.tag, outcome=exchange_outcome(e)).inc()
            self.exchange_s.labels(tag=e.tag).observe(max(0.0, e.elapsed_s))

    def close(self) -> None:
        self.server.close()


class RefusedConnections(Collector):
    """`p2pt_refused_total{route}`: what this peer's transport closed before delivering anything.
    `p2pd`: message streams closed unread (the sender out of the live view, or over its bound of
    open streams) or not whole within the read timeout; `direct`: direct-plane connections refused
    in their handshake (failed, timed out, too many at once, or the sender not admitted). Both
    rise under a flood; either rising in a quiet swarm means peers disagree about who is in it."""

    NAME = f"{PREFIX}refused"
    HELP = "Streams and direct connections this peer refused before delivering anything, by route"

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.NAME, self.HELP, labels=["route"])

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.NAME, self.HELP, labels=["route"])
        family.add_metric(["p2pd"], self._transport.refused)
        family.add_metric(["direct"], self._transport.direct_refused)
        yield family
