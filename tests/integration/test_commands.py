"""Command-line behaviour across commands: announced addresses without a fixed port, exit status 130."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import Tracker, wait_until

pytestmark = pytest.mark.timeout(180)


def _first_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    box: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout_s)
    return box[0].strip() if box else ""


def test_announce_host_without_a_port_announces_the_bound_port_and_ctrl_c_exits_130(
    tmp_path: Path, tracked: Tracker
) -> None:
    argv = [sys.executable, "-m", "p2p_trainer", "bootstrap", "--host", "127.0.0.1", "--port", "0"]
    argv += ["--announce-host", "127.0.0.1", "--identity", str(tmp_path / "boot.key")]
    proc = tracked(
        subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
    )
    line = _first_line(proc, 90)
    assert line.startswith("--initial-peers /ip4/127.0.0.1/tcp/"), line
    port = int(line.split("/tcp/")[1].split("/")[0])
    assert port > 0
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass  # the announced port is the one the node listens on
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    # what it started (the DHT process, p2pd) is gone soon after it, not left running
    assert wait_until(lambda: not tracked.left(proc), 15), tracked.left(proc)
