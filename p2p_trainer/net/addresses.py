"""Multiaddr checks done before any process starts, so that a typo gives a message, not a p2pd crash."""

from __future__ import annotations

import ipaddress
import logging
import socket

from hivemind.utils.multiaddr import Multiaddr

logger = logging.getLogger(__name__)

EXAMPLE_INITIAL_PEER = "/ip4/203.0.113.5/tcp/31337/p2p/12D3KooWQnzt8fuWAkZdLjt9HiEYGPEP1oSy6yFy4TSk4nRr1ZUr"
_HOST_PROTOCOLS = ("ip4", "ip6", "dns", "dns4", "dns6")


class AddressError(ValueError):
    """A malformed address given by the user; the message names it and shows a good one."""


def _protocol_names(addr: Multiaddr) -> list[str]:
    return [proto.name for proto in addr.protocols()]


def validate_initial_peer(value: str) -> str:
    """Check one `--initial-peers` value: /ip4|ip6|dns*/<host>/tcp/<port>/p2p/<peer id>."""
    hint = f"expected a multiaddr like {EXAMPLE_INITIAL_PEER} (the value `p2p-trainer bootstrap` prints)"
    try:
        addr = Multiaddr(value.strip())
        names = _protocol_names(addr)
        peer_id = addr.value_for_protocol("p2p") if "p2p" in names else None
    except Exception as e:  # multiaddr raises several unrelated types for bad input
        raise AddressError(f"malformed initial peer {value!r}: {e}; {hint}") from None
    if not names or names[0] not in _HOST_PROTOCOLS or "tcp" not in names:
        raise AddressError(
            f"initial peer {value!r} needs a host (/ip4, /ip6 or /dns) and a /tcp port; {hint}"
        )
    if peer_id is None or names[-1] != "p2p":
        raise AddressError(f"initial peer {value!r} does not end with /p2p/<peer id>; {hint}")
    if int(addr.value_for_protocol("tcp")) == 0:
        raise AddressError(
            f"initial peer {value!r} has port 0; use the port the bootstrap node printed; {hint}"
        )
    return str(addr)


def validate_initial_peers(values: list[str] | tuple[str, ...]) -> list[str]:
    """Validate every value; the first bad one raises `AddressError`."""
    return [validate_initial_peer(value) for value in values]


def unreachable_message(initial_peers: tuple[str, ...], attempts: int, last_error: str) -> str:
    """Why no initial peer answered, and what to check: the address, the firewall, NAT."""
    return (
        f"none of the initial peers answered after {attempts} attempt(s): {', '.join(initial_peers)} "
        f"(last error: {last_error}). Check that a bootstrap node is running and that these are the "
        f"exact addresses its `p2p-trainer bootstrap` printed (the /p2p/ peer id changes if its identity "
        f"file changed); that its TCP port is open in firewalls between the machines; and, if it runs "
        f"behind NAT or in a container, that it was started with --announce-host"
    )


def _ip_protocol(host: str, option: str) -> str:
    try:
        return "ip6" if ipaddress.ip_address(host).version == 6 else "ip4"
    except ValueError:
        raise AddressError(
            f"{option} {host!r} is not an IP address; give an IPv4 or IPv6 address, e.g. 0.0.0.0 or 203.0.113.5"
        ) from None


def host_maddr(host: str, port: int) -> str:
    """The listen multiaddr for `--host`/`--port` (port 0 picks a free port)."""
    if not 0 <= port <= 65535:
        raise AddressError(f"--port {port} is out of range; use 0..65535 (0 picks a free port)")
    return f"/{_ip_protocol(host, '--host')}/{host}/tcp/{port}"


def resolve_host(host: str, option: str) -> str:
    """`host` as an IP address: an address as given, a name (a container's service name, say)
    resolved now, IPv4 first. The announced address must be an IP, since p2pd announces it as
    given, and other nodes dial what it announces."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise AddressError(
            f"{option} {host!r} does not resolve to an IP address ({exc}); give an IP address, e.g. "
            f"203.0.113.5, or a name this machine resolves (in Docker Compose: the service name)"
        ) from None
    ips = [str(info[4][0]) for info in infos]
    return next((ip for ip in ips if ":" not in ip), ips[0])


def announce_maddr(announce_host: str, port: int) -> str:
    """The multiaddr other machines should dial (behind NAT or in a container), at the bound `port`;
    a name is resolved to its IP address first."""
    if port == 0:
        raise AddressError(
            "the announced address needs the port the node listens on; pick it first (free_port)"
        )
    ip = resolve_host(announce_host, "--announce-host")
    return f"/{_ip_protocol(ip, '--announce-host')}/{ip}/tcp/{port}"


def check_announce_host(announce_host: str) -> str:
    """The IP address `--announce-host` stands for; raises `AddressError` when a name does not resolve."""
    ip = resolve_host(announce_host, "--announce-host")
    if ip != announce_host:
        logger.info("--announce-host %s resolves to %s: announcing that", announce_host, ip)
    return ip


def free_port(host: str) -> int:
    """A TCP port that is free on `host` now. With `--announce-host` and `--port 0` the node listens
    on it and announces it: p2pd takes its announced addresses at start, before it binds."""
    family = socket.AF_INET6 if _ip_protocol(host, "--host") == "ip6" else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])
