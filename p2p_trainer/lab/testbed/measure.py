"""Measurements on a running testbed with the probe program: TCP transfers and CPU share."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2p_trainer.lab.testbed.testbed import Testbed, TestbedError

PROBE_PATH = Path(__file__).with_name("probe.py")
PROBE_PORT = 5001
"""Every host has its own port space, so a fixed port never collides with another testbed."""


@dataclass(frozen=True)
class TransferResult:
    """One timed TCP transfer from `src` to `dst`."""

    src: str
    dst: str
    n_bytes: int
    """Payload bytes the sender wrote (all of them unless `error`)."""
    elapsed_s: float
    bound_s: float | None
    """Payload bytes / the tighter of src's upload and dst's download cap; None if both uncapped."""
    error: str | None

    @property
    def rate_mbit(self) -> float:
        return self.n_bytes * 8 / 1e6 / self.elapsed_s if self.elapsed_s > 0 else float("inf")

    @property
    def ratio_to_bound(self) -> float | None:
        """elapsed / bound: 1.0 is the wire speed, headers make it a few percent more."""
        return None if self.bound_s is None else self.elapsed_s / self.bound_s


def _probe(tb: Testbed, host: str, *args: str) -> subprocess.Popen[str]:
    argv = [sys.executable, str(PROBE_PATH), *args]
    return tb.run(host, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result_line(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise TestbedError(f"probe {proc.pid} did not finish within {timeout_s} s") from None
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise TestbedError(f"probe {proc.pid} failed ({proc.returncode}): {err.strip()[-500:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def link_bound_s(tb: Testbed, src: str, dst: str, n_bytes: int) -> float | None:
    """Seconds `n_bytes` of payload need on the path src -> dst at its tightest cap."""
    rates = [r for r in (tb.host(src).up_rate_mbit, tb.host(dst).down_rate_mbit) if r is not None]
    return n_bytes * 8 / (min(rates) * 1e6) if rates else None


def measure_transfer(
    tb: Testbed, src: str, dst: str, n_bytes: int, timeout_s: float = 30.0, port: int = PROBE_PORT
) -> TransferResult:
    """Send `n_bytes` over TCP from host `src` to host `dst` and time it (sender side, until ack)."""
    sink = _probe(tb, dst, "sink", "--port", str(port), "--timeout-s", str(timeout_s))
    sent: dict[str, Any] | None = None
    try:
        assert sink.stdout is not None
        ready = sink.stdout.readline()
        if '"ready"' not in ready:
            raise TestbedError(f"sink in {dst} did not start: {ready!r}")
        sender = _probe(
            tb, src, "send", "--host", tb.address(dst), "--port", str(port),
            "--bytes", str(n_bytes), "--timeout-s", str(timeout_s),
        )  # fmt: skip
        sent = _result_line(sender, timeout_s + 10)
    finally:
        if (sent is None or sent["error"] is not None) and sink.poll() is None:
            sink.kill()  # the sink would otherwise wait for a sender that gave up
        sink.communicate(timeout=timeout_s + 10)
    return TransferResult(
        src=src,
        dst=dst,
        n_bytes=int(sent["bytes"]),
        elapsed_s=float(sent["elapsed_s"]),
        bound_s=link_bound_s(tb, src, dst, n_bytes),
        error=sent["error"],
    )


def measure_rtt_ms(
    tb: Testbed, src: str, dst: str, count: int = 20, port: int = PROBE_PORT + 1
) -> list[float]:
    """Round trips of 1-byte TCP messages from `src` to an echo server in `dst`, in ms, in order."""
    echo = _probe(tb, dst, "echo", "--port", str(port), "--timeout-s", "30")
    try:
        assert echo.stdout is not None
        ready = echo.stdout.readline()
        if '"ready"' not in ready:
            raise TestbedError(f"echo server in {dst} did not start: {ready!r}")
        client = _probe(tb, src, "rtt", "--host", tb.address(dst), "--port", str(port), "--count", str(count))
        samples_ms: list[float] = _result_line(client, 60.0)["rtt_ms"]
    finally:
        if echo.poll() is None:
            echo.kill()
        echo.communicate(timeout=10)
    return samples_ms


@dataclass(frozen=True)
class CpuShare:
    cpu_s: float
    wall_s: float

    @property
    def cores(self) -> float:
        """Cores the busy loop got on average (the quota, when the cap works)."""
        return self.cpu_s / self.wall_s


def measure_cpu_share(tb: Testbed, host: str, seconds: float = 2.0) -> CpuShare:
    """Run a single-threaded busy loop in `host` for `seconds` and report the CPU it got."""
    result = _result_line(_probe(tb, host, "spin", "--seconds", str(seconds)), seconds + 30)
    return CpuShare(cpu_s=float(result["cpu_s"]), wall_s=float(result["wall_s"]))
