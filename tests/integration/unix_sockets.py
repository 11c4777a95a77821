"""The most Unix-socket connections bound to one path at once, sampled by a process of its own.

Every connection p2pd hands a process through its stream gate (`net/stream_gate.py`) is a socket
bound to the gate's path in the kernel's table (/proc/net/unix), so counting them there does not
rely on the gate's own bookkeeping, and a separate process sees bursts that this one's event loops
and GIL could hide.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

SAMPLER = """
import sys, time
path, out = sys.argv[1], sys.argv[2]
peak = {"02": 0, "03": 0}
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    counts = {"02": 0, "03": 0}
    with open("/proc/net/unix") as table:
        for line in table:
            fields = line.split()
            if len(fields) >= 8 and fields[7] == path and fields[5] in counts:
                counts[fields[5]] += 1
    peak = {k: max(v, counts[k]) for k, v in peak.items()}
    with open(out + ".tmp", "w") as f:
        f.write(f"{peak['02']} {peak['03']}")
    __import__("os").replace(out + ".tmp", out)
"""
"""Samples, from a process of its own (so this one's event loops and GIL cannot hide a burst),
the most Unix sockets bound to a path in the kernel's table at once: St 03, connected (accepted
by the victim); St 02, connecting (queued, not accepted yet)."""


@contextlib.contextmanager
def sampling(path: Path, out: Path, seconds: float) -> Iterator[Callable[[], tuple[int, int]]]:
    sampler = subprocess.Popen([sys.executable, "-c", SAMPLER, str(path), str(out), str(seconds)])

    def peaks() -> tuple[int, int]:
        queued, held = out.read_text().split() if out.exists() else ("0", "0")
        return int(queued), int(held)

    try:
        yield peaks
    finally:
        sampler.kill()
        sampler.wait(timeout=10)
