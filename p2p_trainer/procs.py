"""Child processes tracked by PID: started in their own process group, always reaped."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)


class Child:
    def __init__(
        self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=self._log,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, sig: int) -> None:
        """Signal the child itself; it owns the shutdown of its DHT process and p2pd."""
        if self.alive():
            self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 20.0, sig: int = signal.SIGINT) -> int:
        """Ask politely, wait, then kill the whole group; always reaps."""
        self.send(sig)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("%s (pid %d) did not stop in %.0f s; killing it", self.name, self.pid, timeout_s)
            self._cleanup_group()
            return self.proc.wait(timeout=10)
        finally:
            self._cleanup_group()
            self._log.close()

    def _cleanup_group(self) -> None:
        # Anything left in the child's process group (e.g. an orphaned p2pd) goes with it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def wait_all(children: Sequence[Child], timeout_s: float, poll_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(c.alive() for c in children):
            return True
        time.sleep(poll_s)
    return False
