"""Opt-in Prometheus endpoints: the HTTP server, the records-rejected counter, a bootstrap node's metrics.

A node serves its own registry (not prometheus_client's global one), so two registries in one
test process never collide. The server binds before the node starts: an occupied port is an
error naming the flag, with nothing started yet to clean up. A peer's training metrics are in
`run/peer_metrics.py`; they use the server and the counter from here.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Info, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from p2p_trainer import __version__
from p2p_trainer.net.envelope import READ_DROPS, REASONS

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from p2p_trainer.net.dht import NetNode

logger = logging.getLogger(__name__)

PREFIX = "p2pt_"


class MetricsPortError(RuntimeError):
    """The metrics endpoint cannot listen where it was asked to; the message names the flag."""


def new_registry() -> CollectorRegistry:
    """A registry with the process's CPU and memory (`process_*`), as every endpoint of ours has."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    return registry


class MetricsServer:
    """The HTTP endpoint (`/metrics`, any path answers) serving one registry from a daemon thread."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int, flag: str) -> None:
        try:
            server, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise MetricsPortError(
                    f"{flag} {port}: the port is already in use on {host}; pick a free port for {flag} "
                    f"or stop what listens on it"
                ) from None
            raise MetricsPortError(
                f"{flag} {port}: cannot listen on {host} (--metrics-host): {exc.strerror or exc}"
            ) from None
        self._server: WSGIServer = server
        self.host, self.port = host, port
        logger.info("metrics at http://%s:%d/metrics", host, port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class RejectedRecords(Collector):
    """`p2pt_records_rejected_total{source, reason}`: records dropped as unsigned, forged, malformed,
    implausible, replayed or not admitted. `read`: by this process when it read them (the swarm
    view, `records.py`); `stored`: by its DHT node's validator, when others stored them here or
    returned them. Every reason is listed from the start (0 until one is dropped), so an alert
    can rate() it before the first drop."""

    def __init__(self, sources: Mapping[str, Callable[[], dict[str, int]]]) -> None:
        self._sources = dict(sources)

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(
            f"{PREFIX}records_rejected",
            "DHT records dropped by this node, by where they were checked and why",
            labels=["source", "reason"],
        )

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for source, counts in self._sources.items():
            try:
                found = counts()
            except Exception as exc:  # a scrape must answer even while the node shuts down
                logger.debug("records-rejected counts of %s unavailable: %s", source, exc)
                continue
            for reason in REASONS:
                family.add_metric([source, reason], found.get(reason, 0))
        yield family


def rejected_records(node: NetNode) -> RejectedRecords:
    return RejectedRecords({"read": READ_DROPS.counts, "stored": node.record_drops})


class SampledGauge(Collector):
    """A gauge asked at scrape time; `sample()` raising `TimeoutError` or `RuntimeError` (a DHT
    that is shutting down) gives no sample rather than a failed scrape."""

    def __init__(self, name: str, documentation: str, sample: Callable[[], float]) -> None:
        self.name, self.documentation, self._sample = f"{PREFIX}{name}", documentation, sample

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.name, self.documentation)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.name, self.documentation)
        try:
            family.add_metric([], float(self._sample()))
        except (TimeoutError, RuntimeError) as exc:
            logger.debug("%s unavailable: %s", self.name, exc)
        yield family


class BootstrapMetrics:
    """A bootstrap node's endpoint: connected nodes, records rejected, uptime, its id and version."""

    def __init__(self, host: str, port: int, flag: str = "--metrics-port") -> None:
        self.registry = new_registry()
        self.server = MetricsServer(self.registry, host, port, flag)

    def watch(self, node: NetNode) -> None:
        """Start reporting on `node` (called once it runs)."""
        Info(f"{PREFIX}node", "This node's identity and software", registry=self.registry).info(
            {"peer_id": node.peer_id, "role": "bootstrap", "version": __version__}
        )
        connected = "Nodes connected to this bootstrap node now (peers and other nodes)"
        self.registry.register(SampledGauge("live_peers", connected, node.connected_peers))
        self.registry.register(rejected_records(node))
        uptime = "Seconds since the DHT node started"
        self.registry.register(
            SampledGauge("uptime_seconds", uptime, lambda: time.monotonic() - node.started_at)
        )

    def close(self) -> None:
        self.server.close()
