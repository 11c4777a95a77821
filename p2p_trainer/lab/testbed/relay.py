"""User-space delay line for one host's link (netem is not available on these kernels).

    ip netns exec HOST python relay.py --host-if eth0 --switch-if v3 --delay-ms 20

Creates two TAP devices in the current (host) namespace and copies Ethernet frames between them,
each frame released `delay_ms` after it was read, in both directions. The testbed then moves the
switch-side TAP into the switch namespace and attaches it to the bridge; the file descriptors
stay valid across the move. Shaping (tbf) stays on the devices' egress as for veth links, so a
frame is first rate-limited, then delayed, like on a real access link followed by a long path.

Cost: every frame passes through Python, about 0.05 s of CPU per MB relayed (2 MB at 10 Mbit/s
in both relays of a path took ~0.2 s of CPU each), so use it for RTT-sensitive tests, not by
default. Prints {"ready": true} once both devices exist; runs until killed. Standard library only.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import json
import os
import select
import struct
import sys
import time

_TUNSETIFF = 0x400454CA
_IFF_TAP = 0x0002
_IFF_NO_PI = 0x1000
_MAX_FRAME_BYTES = 65_536


def open_tap(name: str) -> int:
    """Create TAP device `name` (Ethernet frames, no packet-info header); return its fd."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH22x", name.encode(), _IFF_TAP | _IFF_NO_PI))
    return fd


def relay(fd_a: int, fd_b: int, delay_s: float) -> None:
    """Forever: frames read from one fd are written to the other `delay_s` later, in order."""
    pending: dict[int, collections.deque[tuple[float, bytes]]] = {
        fd_a: collections.deque(),
        fd_b: collections.deque(),
    }
    other = {fd_a: fd_b, fd_b: fd_a}
    while True:
        due = [queue[0][0] for queue in pending.values() if queue]
        timeout_s = max(0.0, min(due) - time.monotonic()) if due else None
        readable, _, _ = select.select([fd_a, fd_b], [], [], timeout_s)
        now = time.monotonic()
        for fd in readable:
            while True:
                try:
                    frame = os.read(fd, _MAX_FRAME_BYTES)
                except BlockingIOError:
                    break
                pending[fd].append((now + delay_s, frame))
        for fd, queue in pending.items():
            while queue and queue[0][0] <= now:
                # a frame the device refuses (e.g. while it is down) is a lost packet
                with contextlib.suppress(OSError):
                    os.write(other[fd], queue.popleft()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host-if", required=True)
    parser.add_argument("--switch-if", required=True)
    parser.add_argument("--delay-ms", type=float, required=True)
    args = parser.parse_args()
    fd_host, fd_switch = open_tap(args.host_if), open_tap(args.switch_if)
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    relay(fd_host, fd_switch, args.delay_ms / 1000)


if __name__ == "__main__":
    main()
