"""Start a peer's direct data plane (`direct.py`) and tell the swarm where it listens."""

from __future__ import annotations

import ipaddress
import logging

from p2p_trainer.net.dht import NetNode
from p2p_trainer.net.direct import format_address
from p2p_trainer.net.transport import Transport

logger = logging.getLogger(__name__)


def _ip(text: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text or "")
    except ValueError:
        return None


def data_host(host: str, announce_host: str | None, visible_maddrs: list[str]) -> str | None:
    """The IP other peers should dial: the announced one, else the one listened on, else (listening
    on every interface) the first address p2pd sees itself at that the listener can answer on,
    preferring one not on loopback.

    Listening on 0.0.0.0 takes IPv4 only, so an IPv6 address is never announced for it; link-local
    addresses (169.254/16, fe80::/10) are left out, as they mean nothing off the local link and an
    IPv6 one cannot even be dialled without its interface."""
    for candidate in (announce_host, host):
        ip = _ip(candidate)
        if ip is not None and not ip.is_unspecified:
            return str(ip)
    listen = _ip(host)
    families = {4} if listen is not None and listen.version == 4 else {4, 6}
    # a multiaddr reads /ip4/<address>/tcp/<port>/...: the address is the third part
    parts = [maddr.split("/") for maddr in visible_maddrs]
    seen = [
        ip
        for p in parts
        if len(p) > 2
        and (ip := _ip(p[2])) is not None
        and not ip.is_unspecified
        and not ip.is_link_local
        and ip.version in families
    ]
    seen.sort(key=lambda ip: ip.is_loopback)
    return str(seen[0]) if seen else None


def start_data_plane(node: NetNode, transport: Transport, port: int) -> str:
    """Listen for direct connections; the address to publish in this peer's heartbeat, or "" where
    none can be told (the peer then still sends directly, but receives through p2pd only)."""
    cfg = node.config
    host = data_host(cfg.host, cfg.announce_host, node.visible_maddrs())
    bound = transport.start_direct(cfg.host, port)
    if host is None:
        logger.warning("direct data plane: no address to announce (use --announce-host); receiving via p2pd")
        return ""
    address = format_address(host, bound)
    logger.info("direct data plane listening on %s", address)
    return address
