"""Can other peers dial this one? A dial-back check at start, and what to do when they cannot.

A node asks a bootstrap node (DIALBACK_PROTOCOL) to open a plain TCP connection to the port it
listens on, at the address the bootstrap node sees its connection come from; the answer says
where it was seen from and whether that connection got through. Seen from an address that is
none of its own means NAT; a port that does not answer there means nobody can dial it.

libp2p's own AutoNAT cannot answer this here: its service refuses to dial private addresses
(so it never concludes on a LAN or in the NAT testbed), and p2pd does not tell its client what
it concluded. The checker dials back only the address the request came from, so it cannot be
asked to connect anywhere else.

`advice` turns the result into the lines `join` prints: reachable; or behind NAT and reached
through relays and the connections it opens itself (`keeper.py`); and how to become directly
reachable (`--announce-host` with a port forward).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
from dataclasses import dataclass

import msgpack
from hivemind.p2p import P2P, PeerID
from hivemind.utils.multiaddr import Multiaddr

from p2p_trainer.net.stream_gate import StreamGate
from p2p_trainer.net.transport import read_frame

logger = logging.getLogger(__name__)

DIALBACK_PROTOCOL = "p2p-trainer/dialback/1"
DIAL_TIMEOUT_S = 3.0
_MAX_REQUEST_BYTES = 256


def ip_of(maddr: object) -> str | None:
    """The IP address in a multiaddr (its /ip4 or /ip6 part), or None (a relayed address, say)."""
    try:
        addr = maddr if isinstance(maddr, Multiaddr) else Multiaddr(str(maddr))
        names = [proto.name for proto in addr.protocols()]
        for name in ("ip4", "ip6"):
            if name in names and "p2p-circuit" not in names:
                return str(addr.value_for_protocol(name))
    except Exception:  # multiaddr raises several unrelated types for bad input
        return None
    return None


def port_of(maddr: str) -> int | None:
    try:
        return int(Multiaddr(maddr).value_for_protocol("tcp"))
    except Exception:  # no /tcp part, or not a multiaddr
        return None


async def _dial(ip: str, port: int) -> str:
    """Empty if a TCP connection to ip:port opens within DIAL_TIMEOUT_S, else why not."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), DIAL_TIMEOUT_S)
    except asyncio.TimeoutError:
        return f"no answer within {DIAL_TIMEOUT_S:.0f} s"
    except OSError as exc:  # asyncio words it "Connect call failed (addr)": the errno says why
        return os.strerror(exc.errno) if exc.errno else str(exc)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return ""


async def serve_dialback(info: object, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The checker's side: dial the requester back at the address its stream came from."""
    try:
        request = msgpack.unpackb(await asyncio.wait_for(read_frame(reader, _MAX_REQUEST_BYTES), 10.0))
        port = request.get("port") if isinstance(request, dict) else None
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            return  # a bool is an int to Python: true would have us dial port 1
        seen = info.addr  # type: ignore[attr-defined]
        ip = ip_of(seen)
        error = "its connection here is relayed, not direct" if ip is None else await _dial(ip, port)
        reply = {"seen": str(seen), "ip": ip or "", "port": port, "error": error}
        await P2P.send_raw_data(bytes(msgpack.packb(reply)), writer)
    except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
        logger.debug("dial-back request dropped: %s", exc)
    finally:
        writer.close()


DIALBACKS_PER_SENDER = 2
"""Dial-back requests one peer may have open here at once (a check asks once per checker)."""


async def add_dialback(gate: StreamGate) -> None:
    await gate.add_handler(DIALBACK_PROTOCOL, serve_dialback, DIALBACKS_PER_SENDER)


@dataclass(frozen=True)
class Reachability:
    """What the dial-back check found."""

    dialable: bool | None
    """True: a checker connected to our port; False: it could not; None: no checker answered."""
    port: int
    """The TCP port this node listens on."""
    own_ips: tuple[str, ...]
    """The addresses this node lists for itself (its interfaces, or --announce-host)."""
    seen_ip: str = ""
    """Where the checker saw this node's connection come from."""
    checker: str = ""
    detail: str = ""
    """The checker's error (dialable False), or why nobody checked (dialable None)."""

    @property
    def behind_nat(self) -> bool:
        return bool(self.seen_ip) and self.seen_ip not in self.own_ips

    @property
    def verdict(self) -> str:
        """One word of `records.REACHABILITY` for the heartbeat, which `status` shows."""
        if self.dialable is None:
            return "unchecked"
        if self.dialable:
            return "reachable"
        return "behind-nat" if self.behind_nat else "unreachable"


async def _ask(p2p: P2P, checker: str, port: int, timeout_s: float) -> dict[str, object]:
    async def ask() -> dict[str, object]:
        _, reader, writer = await p2p.call_binary_stream_handler(
            PeerID.from_base58(checker), DIALBACK_PROTOCOL
        )
        try:
            await P2P.send_raw_data(bytes(msgpack.packb({"port": port})), writer)
            reply = msgpack.unpackb(await read_frame(reader, 4096), raw=False)
        finally:
            writer.close()
        if not isinstance(reply, dict):
            raise ValueError(f"malformed dial-back reply {reply!r}")
        return reply

    return await asyncio.wait_for(ask(), timeout_s)


async def check(
    p2p: P2P, checkers: list[str], own_maddrs: list[str], timeout_s: float = 10.0
) -> Reachability:
    """Ask the checkers in turn until one answers; `own_maddrs` are this node's visible multiaddrs."""
    ports = [port for port in map(port_of, own_maddrs) if port]
    own_ips = tuple(dict.fromkeys(ip for ip in map(ip_of, own_maddrs) if ip))
    if not ports:
        return Reachability(None, 0, own_ips, detail=f"no TCP port among this node's addresses {own_maddrs}")
    errors = []
    for checker in checkers:
        try:
            reply = await _ask(p2p, checker, ports[0], timeout_s)
        except Exception as exc:  # a checker that is down or too old to know the protocol: the next
            errors.append(f"{checker[-8:]}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
            continue
        error = str(reply.get("error", ""))
        return Reachability(not error, ports[0], own_ips, str(reply.get("ip", "")), checker, error)
    detail = "; ".join(errors) if errors else "no bootstrap node to ask"
    return Reachability(None, ports[0], own_ips, detail=f"no dial-back answer ({detail})")


def _is_private(ip: str) -> bool:
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(ip).is_private
    return False


def advice(reach: Reachability, relay: str) -> list[str]:
    """The lines `join` prints about reachability: what was found and what the user can do."""
    port, who = reach.port, f"bootstrap node {reach.checker[-8:]}"
    if reach.dialable is None:
        return [
            f"reachability: not checked: {reach.detail}. If other peers cannot reach this one, "
            f"see `--announce-host` and forward TCP port {port} to this machine"
        ]
    if reach.dialable:
        return [f"reachability: {who} dialled {reach.seen_ip}:{port}: peers reach this node directly"]
    where = (
        f"behind NAT: {who} sees it as {reach.seen_ip}, which is none of its own addresses "
        f"({', '.join(reach.own_ips) or 'none'})"
        if reach.behind_nat
        else f"{who} sees it at {reach.seen_ip}"
    )
    found = f"reachability: other peers cannot dial this node ({where}; TCP port {port}: {reach.detail})"
    if relay == "off":
        using = (
            "with --relay off, peers that are not connected to it cannot send to it; "
            "use --relay auto to be reached through the bootstrap nodes"
        )
    else:
        using = (
            "it keeps connections open to the peers it can dial, and the others reach it "
            "through the bootstrap nodes' relay (--relay auto)"
        )
    public = reach.seen_ip if reach.seen_ip and not _is_private(reach.seen_ip) else "<public ip>"
    direct = (
        f"to be reached directly: forward TCP port {port} on the router to this machine and "
        f"start with --port {port} --announce-host {public}"
    )
    return [found, f"reachability: {using}", f"reachability: {direct}"]
