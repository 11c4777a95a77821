"""A watchdog process that stops our p2pd and DHT process if the node's own process dies abruptly.

hivemind's DHT process does not watch its parent: after `kill -9` (or an OOM kill) of the trainer,
the DHT process and its p2pd keep running indefinitely. A
`NetNode` therefore starts this small process (`python -m p2p_trainer.net.reaper`, its own session,
no torch import) and tells it, on stdin, the (pid, start time) of each process to stop and the socket
files to remove. When the owner exits (stdin closes, or the owner's PID is gone) it stops those
processes that still exist with the same start time, removes the files and exits.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

from p2p_trainer import processes

_POLL_S = 1.0


def spawn(owner_pid: int, pids: list[int], files: list[Path]) -> subprocess.Popen[bytes]:
    """Start a reaper for `pids` and `files` that acts when `owner_pid` exits or closes its stdin."""
    package_root = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
    }
    reaper = subprocess.Popen(
        [sys.executable, "-m", "p2p_trainer.net.reaper"],
        stdin=subprocess.PIPE,
        env=env,
        start_new_session=True,  # a Ctrl-C to our process group must not stop the watchdog first
    )
    owned = [(pid, processes.start_time(pid)) for pid in [owner_pid, *pids]]
    assert reaper.stdin is not None
    reaper.stdin.write(
        json.dumps({"owner": owned[0], "pids": owned[1:], "files": [str(f) for f in files]}).encode()
    )
    reaper.stdin.write(b"\n")
    reaper.stdin.flush()
    return reaper


def _wait_for_owner(owner: tuple[int, int | None]) -> None:
    while processes.same_process(*owner):
        readable, _, _ = select.select([sys.stdin.fileno()], [], [], _POLL_S)
        if readable and not os.read(sys.stdin.fileno(), 4096):
            return  # EOF: the owner closed the pipe (clean shutdown) or died


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    order = json.loads(sys.stdin.buffer.readline())
    _wait_for_owner(tuple(order["owner"]))
    for pid, start_time in order["pids"]:
        if processes.same_process(pid, start_time):
            processes.stop_pid(pid, grace_s=3.0)
    processes.remove_files([Path(f) for f in order["files"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
