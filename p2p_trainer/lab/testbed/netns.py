"""Thin wrappers around `ip` and `tc`: namespaces, the switch bridge, veth links and their qdiscs.

Every link is a veth pair created inside the switch namespace with its peer end moved straight into
the host namespace, so no interface ever appears in the root namespace and interface names only
need to be unique inside one testbed (`v<i>` on the switch, `eth0` in every host).
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

BRIDGE = "br0"
HOST_IF = "eth0"
_CMD_TIMEOUT_S = 10.0
NETNS_RUN_DIR = Path("/var/run/netns")
"""Where `ip netns` binds named namespaces."""
RELAY_PATH = Path(__file__).with_name("relay.py")
ALLOWED_CONGESTION_CONTROL = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
AVAILABLE_CONGESTION_CONTROL = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")


class NetnsError(RuntimeError):
    """An `ip`/`tc` command failed; the message has the command and its stderr."""


def run_cmd(argv: list[str], check: bool = True, timeout_s: float = _CMD_TIMEOUT_S) -> str:
    """Run a short admin command and return its stdout; raise `NetnsError` on failure if `check`."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def support_problem() -> str | None:
    """Why namespaces cannot be used here (not root, no `ip`/`tc`, `ip netns` failing), else None."""
    if os.geteuid() != 0:
        return "the testbed needs root (network namespaces, tc, cgroups)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    try:
        run_cmd(["ip", "netns", "list"])
    except (NetnsError, OSError, subprocess.TimeoutExpired) as err:
        return f"`ip netns` is unavailable: {err}"
    return None


def list_namespaces() -> list[str]:
    """Names of all named network namespaces (`ip netns list`)."""
    return [line.split()[0] for line in run_cmd(["ip", "netns", "list"]).splitlines() if line.strip()]


def allow_congestion_control(algorithm: str) -> str | None:
    """Let namespaces pick `algorithm`: outside the root namespace the kernel refuses, even to root,
    any algorithm missing from the machine's allowed list, which often holds only the default and
    reno. Loads its module if the kernel has not, and adds it to the list (a machine-wide setting,
    kept: it only widens what namespaces may choose). Returns why that failed, or None."""
    try:
        if algorithm in ALLOWED_CONGESTION_CONTROL.read_text().split():
            return None
        if algorithm not in AVAILABLE_CONGESTION_CONTROL.read_text().split() and shutil.which("modprobe"):
            run_cmd(["modprobe", f"tcp_{algorithm}"], check=False)
        # read again just before the write: another testbed may have added one meanwhile
        allowed = ALLOWED_CONGESTION_CONTROL.read_text().split()
        if algorithm not in allowed:
            ALLOWED_CONGESTION_CONTROL.write_text(" ".join([*allowed, algorithm]))
    except OSError as exc:
        return f"cannot add it to {ALLOWED_CONGESTION_CONTROL}: {exc}"
    logger.info("allowed TCP congestion control %r in network namespaces", algorithm)
    return None


def add_namespace(name: str, congestion_control: str = "") -> None:
    """A new namespace with `lo` up and IPv6 off: hosts speak IPv4 only, and the counters then
    carry no neighbour-discovery or multicast-listener chatter (~0.5 kB/s per host otherwise).
    `congestion_control`: its TCP congestion control ("" keeps the one it inherits)."""
    run_cmd(["ip", "netns", "add", name])
    run_cmd(["ip", "-n", name, "link", "set", "lo", "up"])
    if congestion_control:
        not_allowed = allow_congestion_control(congestion_control)
        setting = f"net.ipv4.tcp_congestion_control={congestion_control}"
        try:
            run_cmd(["ip", "netns", "exec", name, "sysctl", "-q", "-w", setting])
        except NetnsError as exc:
            why = f"{exc}; {not_allowed}" if not_allowed else str(exc)
            raise NetnsError(
                f"cannot set TCP congestion control {congestion_control!r} in {name} ({why}); pick one of "
                f'{ALLOWED_CONGESTION_CONTROL}, or "" for the machine\'s'
            ) from exc
    sysctl = [
        "sysctl",
        "-q",
        "-w",
        "net.ipv6.conf.all.disable_ipv6=1",
        "net.ipv6.conf.default.disable_ipv6=1",
    ]
    run_cmd(["ip", "netns", "exec", name, *sysctl], check=False)  # a kernel without IPv6 is fine too


def delete_namespace(name: str) -> None:
    """Delete a namespace; its interfaces (and their veth peers and qdiscs) go with it."""
    run_cmd(["ip", "netns", "delete", name])


def namespace_pids(name: str) -> set[int]:
    """PIDs of all processes whose network namespace is `name`."""
    out = run_cmd(["ip", "netns", "pids", name], check=False)
    return {int(tok) for tok in out.split() if tok.isdigit()}


def add_bridge(switch_ns: str) -> None:
    run_cmd(["ip", "-n", switch_ns, "link", "add", BRIDGE, "type", "bridge"])
    run_cmd(["ip", "-n", switch_ns, "link", "set", BRIDGE, "up"])


def add_link(switch_ns: str, switch_if: str, host_ns: str, address: str, prefix_len: int) -> None:
    """Connect `host_ns` to the bridge: veth `switch_if` (switch side) <-> `eth0` (host side)."""
    run_cmd(
        [
            "ip",
            "-n",
            switch_ns,
            "link",
            "add",
            switch_if,
            "type",
            "veth",
            "peer",
            "name",
            HOST_IF,
            "netns",
            host_ns,
        ]
    )
    _attach(switch_ns, switch_if, host_ns, address, prefix_len)


def _attach(switch_ns: str, switch_if: str, host_ns: str, address: str, prefix_len: int) -> None:
    run_cmd(["ip", "-n", switch_ns, "link", "set", switch_if, "master", BRIDGE, "up"])
    run_cmd(["ip", "-n", host_ns, "addr", "add", f"{address}/{prefix_len}", "dev", HOST_IF])
    run_cmd(["ip", "-n", host_ns, "link", "set", HOST_IF, "up"])


def add_delayed_link(
    switch_ns: str, switch_if: str, host_ns: str, address: str, prefix_len: int, delay_ms: float
) -> subprocess.Popen[str]:
    """Like `add_link`, through a user-space relay (relay.py) that delays frames by `delay_ms`.

    Returns the relay process. It runs in the host namespace but outside the host's CPU cgroup:
    the delay line is part of the network, not of the peer.
    """
    argv = [sys.executable, str(RELAY_PATH), "--host-if", HOST_IF, "--switch-if", switch_if]
    argv += ["--delay-ms", str(delay_ms)]
    relay = subprocess.Popen(
        ["ip", "netns", "exec", host_ns, *argv],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert relay.stdout is not None
        ready, _, _ = select.select([relay.stdout], [], [], _CMD_TIMEOUT_S)
        line = relay.stdout.readline() if ready else ""
        if '"ready"' not in line:
            raise NetnsError(f"delay relay for {host_ns} did not start: {line!r}")
        # the TAP keeps working in its new namespace: the relay holds it by file descriptor
        run_cmd(["ip", "-n", host_ns, "link", "set", switch_if, "netns", switch_ns])
        _attach(switch_ns, switch_if, host_ns, address, prefix_len)
    except BaseException:
        relay.kill()
        relay.communicate()
        raise
    return relay


@dataclass(frozen=True)
class ShaperParams:
    """Token bucket sizes derived from a rate; see `TestbedConfig.queue_s` and `burst_s`."""

    burst_s: float
    queue_s: float

    def tbf_args(self, rate_mbit: float) -> list[str]:
        rate_bytes_per_s = rate_mbit * 1e6 / 8
        burst_bytes = max(int(rate_bytes_per_s * self.burst_s), 15_000)
        limit_bytes = max(int(rate_bytes_per_s * self.queue_s), 3 * burst_bytes)
        rate_kbit = max(round(rate_mbit * 1000), 1)
        return ["tbf", "rate", f"{rate_kbit}kbit", "burst", str(burst_bytes), "limit", str(limit_bytes)]


def set_egress(ns: str, dev: str, rate_mbit: float | None, shaper: ShaperParams) -> None:
    """Cap egress of `dev` in `ns` at `rate_mbit` (tbf); None restores the default, uncapped qdisc."""
    if rate_mbit is None:
        # `del` fails when only the default qdisc is there; that is already the uncapped state
        run_cmd(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
        return
    run_cmd(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *shaper.tbf_args(rate_mbit)])


def drop_egress(ns: str, dev: str) -> None:
    """Silently drop every packet leaving `dev` (a pfifo that holds zero packets): a blackhole.

    The link stays up and routes stay in place, so peers see what a WAN partition looks like
    (packets vanish, TCP retransmits and times out) instead of an immediate local error.
    """
    run_cmd(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "pfifo", "limit", "0"])


@dataclass(frozen=True)
class LinkCounters:
    """Byte and packet counters of a host's interface, as the host sees them."""

    tx_bytes: int
    """Bytes the host sent (uploaded) on its link."""
    rx_bytes: int
    """Bytes the host received (downloaded) on its link."""
    tx_packets: int
    rx_packets: int
    tcp_retrans_segs: int = 0
    """TCP segments the host sent again (the namespace's Tcp RetransSegs): the part of `tx_bytes`
    that a shaped link's drops cost, so byte overhead can be split into loss and framing."""

    def __sub__(self, other: LinkCounters) -> LinkCounters:
        return LinkCounters(
            self.tx_bytes - other.tx_bytes,
            self.rx_bytes - other.rx_bytes,
            self.tx_packets - other.tx_packets,
            self.rx_packets - other.rx_packets,
            self.tcp_retrans_segs - other.tcp_retrans_segs,
        )


_COUNTER_NAMES = ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets")


def _tcp_retrans_segs(snmp: str) -> int:
    """RetransSegs from /proc/net/snmp text: a "Tcp:" header line, then a "Tcp:" value line."""
    rows = [line.split()[1:] for line in snmp.splitlines() if line.startswith("Tcp:")]
    if len(rows) != 2 or "RetransSegs" not in rows[0]:
        raise NetnsError("no Tcp RetransSegs in /proc/net/snmp")
    return int(rows[1][rows[0].index("RetransSegs")])


def read_counters(ns: str, dev: str = HOST_IF) -> LinkCounters:
    """Read /sys/class/net/<dev>/statistics and /proc/net/snmp inside `ns` (both per namespace)."""
    paths = [f"/sys/class/net/{dev}/statistics/{name}" for name in _COUNTER_NAMES]
    values = [int(v) for v in run_cmd(["ip", "netns", "exec", ns, "cat", *paths]).split()]
    if len(values) != len(_COUNTER_NAMES):
        raise NetnsError(f"unexpected counter output in {ns}: {values}")
    retrans = _tcp_retrans_segs(run_cmd(["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"]))
    tx_bytes, rx_bytes, tx_packets, rx_packets = values
    return LinkCounters(tx_bytes, rx_bytes, tx_packets, rx_packets, retrans)
