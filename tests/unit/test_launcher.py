"""Reading a starting bootstrap node's address: the line, or an error that says why and where."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from p2p_trainer.run.launcher import BootstrapStartError, read_initial_peers

LINE = "--initial-peers /ip4/127.0.0.1/tcp/4001/p2p/12D3KooWQnzt8fuWAkZdLjt9HiEYGPEP1oSy6yFy4TSk4nRr1ZUr"


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:  # a silent one is still running: stop and reap it
        proc.kill()
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()


def _python(started: list[subprocess.Popen[bytes]], code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    started.append(proc)
    return proc


def test_the_address_line_is_returned(started: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    proc = _python(started, f"import time; print({LINE!r}, flush=True); time.sleep(30)")
    assert read_initial_peers(proc, tmp_path / "boot.log", timeout_s=30) == LINE


# the wait ends at the first line or the pipe's end, so the first two cases return at once; their
# long timeout only keeps a slow interpreter start from reading as silence
@pytest.mark.parametrize(
    ("code", "timeout_s", "why"),
    [
        ("import sys; sys.exit(3)", 60.0, "it exited with code 3"),
        (
            "import time; print('listening soon', flush=True); time.sleep(30)",
            60.0,
            "printed 'listening soon' instead",
        ),
        ("import time; time.sleep(30)", 1.0, "printed no address within 1 s"),
    ],
)
def test_a_node_that_does_not_start_is_named_with_its_log(
    started: list[subprocess.Popen[bytes]], tmp_path: Path, code: str, timeout_s: float, why: str
) -> None:
    log = tmp_path / "boot.log"
    log.write_text("first line\nERROR the port is taken\n")
    with pytest.raises(BootstrapStartError) as err:
        read_initial_peers(_python(started, code), log, timeout_s=timeout_s)
    assert why in str(err.value) and str(log) in str(err.value)
    assert "ERROR the port is taken" in str(err.value)  # the log's tail, to act on at once
