"""Configuration of the emulated WAN: one `HostSpec` per host, one frozen `TestbedConfig` per testbed."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,19}$")
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{1,9}$")
MAX_ROUTERS = 50
MAX_BEHIND = 200
"""Hosts behind one router: its LAN is a /24 (the router is .1, its hosts .2 onwards)."""


class TestbedConfigError(ValueError):
    """A config value the testbed cannot use; the message says what to change."""

    __test__ = False  # not a pytest test class, despite the name


@dataclass(frozen=True)
class HostSpec:
    """One host (a peer or a bootstrap node): its own network namespace, link and CPU cap."""

    name: str
    """Short name, unique in the testbed: lowercase letters, digits, '-' or '_', at most 20 chars."""
    up_rate_mbit: float | None = 10.0
    """Upload cap in Mbit/s (egress of the host's own interface); None leaves upload uncapped."""
    down_rate_mbit: float | None = 10.0
    """Download cap in Mbit/s (egress of the switch-side end of the host's link); None: uncapped."""
    cpu_cores: float | None = 0.45
    """CPU quota for all processes started in this host, in cores (cgroup cpu quota); None: none."""
    delay_ms: float = 0.0
    """One-way delay added in each direction of this host's link by a user-space relay (relay.py;
    costs ~0.05 s CPU per MB outside the host's quota); 0 uses a plain veth (~0.05 ms RTT). The
    round trip between hosts a and b is about 2 * (a.delay_ms + b.delay_ms)."""
    nat: bool = False
    """A NAT router: besides its own link to the switch it holds a private LAN (`nat.py`) for the
    hosts whose `behind` names it; it masquerades their connections and lets none in."""
    behind: str | None = None
    """Name of the `nat` host this host sits behind: its link goes to that router's LAN, not to
    the switch, so it can dial out but cannot be dialled from outside."""

    def validate(self) -> None:
        if not _NAME_RE.match(self.name):
            raise TestbedConfigError(
                f"host name {self.name!r}: use 1-20 chars of [a-z0-9_-], starting with a letter or digit"
            )
        for label, rate in (("up_rate_mbit", self.up_rate_mbit), ("down_rate_mbit", self.down_rate_mbit)):
            if rate is not None and not 0.01 <= rate <= 100_000:
                raise TestbedConfigError(
                    f"host {self.name}: {label}={rate} is outside 0.01..100000 Mbit/s; use None for no cap"
                )
        if not 0 <= self.delay_ms <= 5000:
            raise TestbedConfigError(f"host {self.name}: delay_ms={self.delay_ms} is outside 0..5000")
        if self.cpu_cores is not None and not 0.01 <= self.cpu_cores <= 64:
            raise TestbedConfigError(
                f"host {self.name}: cpu_cores={self.cpu_cores} is outside 0.01..64; use None for no quota"
            )
        if self.behind is not None and (self.nat or self.delay_ms > 0):
            raise TestbedConfigError(
                f"host {self.name}: a host behind a NAT can be neither a router nor delayed (delay_ms)"
            )


@dataclass(frozen=True)
class TestbedConfig:
    """An emulated WAN on one machine: hosts in network namespaces joined by a bridge.

    The bridge lives in its own "switch" namespace, so nothing is added to the root namespace and
    the hosts' addresses (from `subnet`) are routable only between the namespaces this testbed
    creates: the hosts have no default route and no other interface than `lo` and their link.
    """

    __test__ = False  # not a pytest test class, despite the name

    hosts: tuple[HostSpec, ...] = ()
    """The hosts to create at start; more can be added later with `Testbed.add_host`."""
    subnet: str = "10.213.0.0/24"
    """Private IPv4 /24 (or smaller prefix length) for the hosts; host i gets the (i+1)-th address."""
    name_prefix: str = "p2ptb"
    """Prefix of namespace and cgroup names; instance names are `<prefix>-<pid>-<n>`, so parallel
    testbeds never collide and `cleanup_stale` can recognise leftovers of dead processes."""
    queue_s: float = 0.03
    """Bytes a capped link may queue, as seconds at its rate (tbf `limit`); floored at 3 bursts.
    Shallow on purpose: with 4 hosts streaming in a ring at 10 Mbit/s, 2 MB transfers took
    1.06-1.11 x bytes/rate at 0.02-0.03 s, but up to 1.46 x at 0.1 s and 1.58 x at 0.3 s (acks
    queue behind data on the shared uplink, and loss recovery slows with the inflated RTT)."""
    burst_s: float = 0.01
    """Token bucket depth as seconds at the link rate (tbf `burst`); floored at 15000 bytes. On a
    loaded 2-core machine the qdisc timer fires late; a bucket shallower than that delay loses
    link time for good: at 40 Mbit/s, 4 MB took 1.05-1.17 x bytes/rate with 0.002 s and
    1.03-1.04 x with 0.01 s (load average 5). A 2 MB transfer gains at most one burst from it."""
    thread_env: dict[str, str] = field(
        default_factory=lambda: {
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "NUMEXPR_NUM_THREADS": "1",
            "VECLIB_MAXIMUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    """Environment added to every process started in a host, so a peer stays single-threaded."""
    congestion_control: str = "cubic"
    """TCP congestion control in every namespace (`net.ipv4.tcp_congestion_control`; "" keeps what
    a new namespace inherits from the machine). Pinned because it decides the results: new
    namespaces inherit the machine's default, bbr on this VM, and with this testbed's shallow
    queues (`queue_s`) bbr lost 13-29 % of the segments the exchange's parallel flows sent (an
    exchange at 1.49 x its bound against 1.11 x with cubic, plain TCP 1.06-1.07 x with either).
    cubic is Linux's own default, so what most peers run."""
    cpu_shares: int = 8192
    """CFS weight of each host against the machine's other processes (default weight 1024). High,
    so a host still gets its whole quota while other work loads the machine; the quota stays the
    cap. Hosts compete fairly among themselves; keep the sum of quotas below the core count."""
    kill_grace_s: float = 5.0
    """How long cleanup waits for killed processes to disappear before reporting them."""
    install_signal_handlers: bool = True
    """While the testbed is open, SIGINT/SIGTERM first clean up, then run the previous handler."""

    def validate(self) -> None:
        if self.congestion_control and not re.fullmatch(r"[a-z0-9_]{1,16}", self.congestion_control):
            raise TestbedConfigError(
                f"congestion_control {self.congestion_control!r}: use a name the kernel lists in "
                '/proc/sys/net/ipv4/tcp_available_congestion_control (e.g. cubic), or "" for the machine\'s'
            )
        if not _PREFIX_RE.match(self.name_prefix):
            raise TestbedConfigError(
                f"name_prefix {self.name_prefix!r}: use 2-10 chars of [a-z0-9], starting with a letter"
            )
        try:
            net = ipaddress.IPv4Network(self.subnet)
        except ValueError as err:
            raise TestbedConfigError(f"subnet {self.subnet!r} is not an IPv4 network: {err}") from err
        if not net.is_private or net.is_loopback or net.prefixlen > 28:
            raise TestbedConfigError(
                f"subnet {self.subnet}: use a private network of /28 or larger (e.g. 10.213.0.0/24)"
            )
        if len(self.hosts) > net.num_addresses - 2:
            raise TestbedConfigError(f"{len(self.hosts)} hosts do not fit in {self.subnet}; widen it")
        names = [h.name for h in self.hosts]
        if len(set(names)) != len(names):
            raise TestbedConfigError(f"host names must be unique, got {names}")
        for i, host in enumerate(self.hosts):
            host.validate()
            routers = {h.name for h in self.hosts[:i] if h.nat}
            if host.behind is not None and host.behind not in routers:
                raise TestbedConfigError(
                    f"host {host.name}: behind={host.behind!r} must name a host with nat=True listed before it"
                )
        if sum(h.nat for h in self.hosts) > MAX_ROUTERS:
            raise TestbedConfigError(f"at most {MAX_ROUTERS} NAT routers per testbed")
        if not 2 <= self.cpu_shares <= 262_144:
            raise TestbedConfigError(f"cpu_shares={self.cpu_shares}: use 2..262144 (1024 is the default)")
        if not 0.001 <= self.queue_s <= 10 or not 0.0001 <= self.burst_s <= 1:
            raise TestbedConfigError("queue_s must be in 0.001..10 and burst_s in 0.0001..1 seconds")

    def host_address(self, index: int) -> str:
        """The IPv4 address of the host created `index`-th (0-based)."""
        net = ipaddress.IPv4Network(self.subnet)
        if not 0 <= index < net.num_addresses - 2:
            raise TestbedConfigError(f"host index {index} does not fit in {self.subnet}")
        return str(net.network_address + 1 + index)

    @staticmethod
    def lan_address(router_ordinal: int, index: int) -> str:
        """Address `index` (0: the router itself) on the LAN of the `router_ordinal`-th NAT router
        (0-based); each router has its own 192.168.<100 + ordinal>.0/24."""
        if not 0 <= router_ordinal < MAX_ROUTERS or not 0 <= index <= MAX_BEHIND:
            raise TestbedConfigError(f"no LAN address {index} behind router {router_ordinal}")
        return f"192.168.{100 + router_ordinal}.{index + 1}"

    @property
    def prefix_len(self) -> int:
        return ipaddress.IPv4Network(self.subnet).prefixlen


def uniform_hosts(
    n_hosts: int,
    rate_mbit: float | None = 10.0,
    cpu_cores: float | None = 0.45,
    name_format: str = "h{}",
) -> tuple[HostSpec, ...]:
    """`n_hosts` hosts named h0, h1, ... with the same symmetric link rate and CPU quota."""
    return tuple(
        HostSpec(name_format.format(i), up_rate_mbit=rate_mbit, down_rate_mbit=rate_mbit, cpu_cores=cpu_cores)
        for i in range(n_hosts)
    )
