"""Signal handling owned by our process: SIGINT/SIGTERM ask for a clean stop, they never unwind."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType


def install_stop_handlers(stop_event: threading.Event) -> Callable[[], int | None]:
    """SIGINT/SIGTERM set `stop_event` in this process; forked children (hivemind's DHT) keep the default.

    Call it from the main thread, before starting any node. The main loop then waits on
    `stop_event` and shuts its hivemind objects down explicitly. Returns a function that gives the
    first stop signal received (None if none), so the command can exit with 128 + its number.
    """
    owner_pid = os.getpid()
    received: list[int] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != owner_pid:  # a forked child inherited this handler: behave as if it had none
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        received.append(signum)
        stop_event.set()

    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)
    return lambda: received[0] if received else None
