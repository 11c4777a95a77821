"""NAT routers for the testbed: a private LAN behind a host that masquerades onto the switch.

A router is an ordinary testbed host (`HostSpec(nat=True)`: its `eth0` on the switch, a switch
address) that also holds a bridge, `lan0`, with its own private /24. A host whose `behind` names
the router hangs off that bridge with the router as its default gateway. iptables in the router's
namespace rewrites the LAN's outgoing connections to the router's address (MASQUERADE) and drops
every new connection that comes in from the switch, so a host behind it can dial out but nothing
outside can dial it: a home router without port forwards. The rules live in the router's
namespace and go with it when the testbed deletes it (`cleanup_stale` included).
"""

from __future__ import annotations

import shutil
import subprocess

from p2p_trainer.lab.testbed.netns import HOST_IF, NetnsError, run_cmd

LAN_BRIDGE = "lan0"


def support_problem() -> str | None:
    """Why NAT routers cannot be built here (no iptables, or its nat table unusable), else None."""
    if shutil.which("iptables") is None:
        return "`iptables` is not installed (Debian: apt-get install iptables)"
    try:
        run_cmd(["iptables", "-w", "5", "-t", "nat", "-S", "POSTROUTING"])
    except (NetnsError, OSError, subprocess.TimeoutExpired) as err:
        return f"iptables cannot use its nat table: {err}"
    return None


def _iptables(ns: str, *rule: str) -> None:
    run_cmd(["ip", "netns", "exec", ns, "iptables", "-w", "5", *rule])


def setup_router(ns: str, lan_address: str, prefix_len: int = 24) -> None:
    """Give host `ns` a LAN bridge at `lan_address` and make it a NAT router for that LAN."""
    run_cmd(["ip", "-n", ns, "link", "add", LAN_BRIDGE, "type", "bridge"])
    run_cmd(["ip", "-n", ns, "link", "set", LAN_BRIDGE, "up"])
    run_cmd(["ip", "-n", ns, "addr", "add", f"{lan_address}/{prefix_len}", "dev", LAN_BRIDGE])
    run_cmd(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
    _iptables(ns, "-t", "nat", "-A", "POSTROUTING", "-o", HOST_IF, "-j", "MASQUERADE")
    # replies to what the LAN opened pass; anything new from the switch side never reaches the LAN
    established = ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"]
    _iptables(ns, "-A", "FORWARD", "-i", HOST_IF, *established)
    _iptables(ns, "-A", "FORWARD", "-i", HOST_IF, "-j", "DROP")


def add_lan_link(router_ns: str, lan_if: str, host_ns: str, address: str, gateway: str) -> None:
    """Connect `host_ns` to the router's LAN: veth `lan_if` (router side) <-> `eth0` (host side),
    with the router as the host's default route."""
    veth = ["type", "veth", "peer", "name", HOST_IF, "netns", host_ns]
    run_cmd(["ip", "-n", router_ns, "link", "add", lan_if, *veth])
    run_cmd(["ip", "-n", router_ns, "link", "set", lan_if, "master", LAN_BRIDGE, "up"])
    run_cmd(["ip", "-n", host_ns, "addr", "add", f"{address}/24", "dev", HOST_IF])
    run_cmd(["ip", "-n", host_ns, "link", "set", HOST_IF, "up"])
    run_cmd(["ip", "-n", host_ns, "route", "add", "default", "via", gateway])


def rules(ns: str) -> str:
    """The router's iptables rules (filter and nat tables), as `iptables -S` prints them."""
    out = run_cmd(["ip", "netns", "exec", ns, "iptables", "-w", "5", "-S"])
    return out + run_cmd(["ip", "netns", "exec", ns, "iptables", "-w", "5", "-t", "nat", "-S"])


def forward_port(router_ns: str, port: int, host_address: str) -> None:
    """A port forward: TCP `port` on the router's own address goes to `host_address`, same port."""
    dnat = ["-p", "tcp", "--dport", str(port), "-j", "DNAT", "--to-destination", f"{host_address}:{port}"]
    _iptables(router_ns, "-t", "nat", "-A", "PREROUTING", "-i", HOST_IF, *dnat)
    # before the rule that drops everything new from outside
    accept = ["-p", "tcp", "-d", host_address, "--dport", str(port), "-j", "ACCEPT"]
    _iptables(router_ns, "-I", "FORWARD", "1", "-i", HOST_IF, *accept)
