"""What p2pd's own circuit relay (libp2p circuit v2) carries: one role per testbed host.

    python circuit_probe.py relay  --host H --port P
    python circuit_probe.py target --host H --relay MADDR      (behind NAT)
    python circuit_probe.py sender --host H --relay MADDR --target ID --bytes N

Each prints {"ready": ..., "peer_id": ...} once its daemon runs. The target reserves a slot on the
relay (autorelay with the relay as its only static relay) and counts what arrives on a "sink"
stream; the sender connects to it through `<relay>/p2p-circuit`, writes `--bytes` and prints
how far it got, and the target prints what it received. hivemind's P2P.create cannot switch
p2pd's relay discovery off (its use_relay_discovery is a no-op); with discovery on, autorelay
waits its boot delay of 3 minutes before it reserves a slot, so this probe adds
-relayDiscovery=0 to the daemon's arguments itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from hivemind.p2p import P2P, PeerID

from p2p_trainer.net.identity import B58_ALPHABET

SINK = "probe/sink"


def _say(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _varint(n: int) -> bytes:
    out = b""
    while True:
        low, n = n & 0x7F, n >> 7
        if not n:
            return out + bytes([low])
        out += bytes([low | 0x80])


def _b58decode(text: str) -> bytes:
    number = 0
    for char in text:
        number = number * 58 + B58_ALPHABET.index(char)
    raw = number.to_bytes((number.bit_length() + 7) // 8, "big")
    return b"\x00" * (len(text) - len(text.lstrip("1"))) + raw


class CircuitAddr:
    """`<relay maddr>/p2p-circuit` in go-multiaddr's binary form. hivemind's Multiaddr writes
    /p2p/ as a CID, which p2pd refuses ("length greater than remaining number of bytes")."""

    def __init__(self, relay: str) -> None:
        head, relay_id = relay.rsplit("/p2p/", 1)
        from hivemind.utils.multiaddr import Multiaddr

        peer = _b58decode(relay_id)
        self._bytes = (
            Multiaddr(head).to_bytes() + _varint(0x01A5) + _varint(len(peer)) + peer + _varint(0x0122)
        )

    def to_bytes(self) -> bytes:
        return self._bytes


def _static_relays_only() -> None:
    original = P2P._make_process_args

    def patched(*args: Any, **kwargs: Any) -> list[str]:
        return original(*args, **kwargs, relayDiscovery=False)

    P2P._make_process_args = staticmethod(patched)  # type: ignore[method-assign]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["relay", "target", "sender"])
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--relay", default="")
    parser.add_argument("--target", default="")
    parser.add_argument("--bytes", type=int, default=0)
    args = parser.parse_args()
    kwargs: dict[str, Any] = {"host_maddrs": [f"/ip4/{args.host}/tcp/{args.port}"]}
    if args.role != "relay":
        kwargs["initial_peers"] = [args.relay]
    if args.role == "target":
        _static_relays_only()
        kwargs.update(use_auto_relay=True, force_reachability="private", trusted_relays=[args.relay])
    p2p = await P2P.create(**kwargs)
    received: list[int] = [0]

    async def sink(_info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(1 << 16):
            received[0] += len(chunk)
        writer.close()

    await p2p.add_binary_stream_handler(SINK, sink)
    maddrs = [str(m) for m in await p2p.get_visible_maddrs()]
    _say({"ready": True, "peer_id": p2p.peer_id.to_base58(), "maddrs": maddrs})
    if args.role == "sender":
        await _send(p2p, args)
    else:
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until told to stop
        _say({"received": received[0]})
    await p2p.shutdown()


async def _send(p2p: P2P, args: argparse.Namespace) -> None:
    target, written, error = PeerID.from_base58(args.target), 0, ""
    try:
        for attempt in range(30):  # the target's reservation may still be on its way
            try:
                await p2p._client.connect(target, [CircuitAddr(args.relay)])  # type: ignore[list-item]
                break
            except Exception:  # NO_RESERVATION until the target holds a slot; the last try raises
                if attempt == 29:
                    raise
                await asyncio.sleep(1.0)
        _, _, writer = await p2p.call_binary_stream_handler(target, SINK)
        chunk = b"x" * (1 << 14)
        while written < args.bytes:
            writer.write(chunk)
            await asyncio.wait_for(writer.drain(), 20)
            written += len(chunk)
            await asyncio.sleep(0)  # the daemon's reset arrives between writes
        writer.close()
    except Exception as exc:  # what ended the transfer is the result
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
    _say({"written": written, "error": error})


if __name__ == "__main__":
    asyncio.run(main())
