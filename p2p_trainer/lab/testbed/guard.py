"""Run a cleanup on SIGINT/SIGTERM and at interpreter exit, while something needs cleaning up."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)

_HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class CleanupGuard:
    """While installed: SIGINT/SIGTERM first run `cleanup`, then whatever handled them before
    (pytest's or Python's KeyboardInterrupt, or the default action, which ends the process);
    an atexit hook runs `cleanup` too. `cleanup` must be idempotent."""

    def __init__(self, label: str, cleanup: Callable[[], None], handle_signals: bool = True) -> None:
        self.label = label
        self._cleanup = cleanup
        self._handle_signals = handle_signals
        self._prev_handlers: dict[int, Any] = {}

    def install(self) -> None:
        atexit.register(self._cleanup)
        if not self._handle_signals:
            return
        if threading.current_thread() is not threading.main_thread():
            logger.warning("%s: not in the main thread, so no cleanup on SIGINT/SIGTERM", self.label)
            return
        for sig in _HANDLED_SIGNALS:
            # an ignored signal stays ignored (nohup, a shell's background job): catching it would
            # tear the testbed down and then carry on without it
            if signal.getsignal(sig) != signal.SIG_IGN:
                self._prev_handlers[sig] = signal.signal(sig, self._on_signal)

    def uninstall(self) -> None:
        atexit.unregister(self._cleanup)
        for sig, prev in self._prev_handlers.items():
            # only undo our own handler; one installed after ours stays
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, prev)
        self._prev_handlers.clear()

    @staticmethod
    @contextlib.contextmanager
    def signals_deferred() -> Iterator[None]:
        """Hold SIGINT/SIGTERM back while the block runs (a second Ctrl-C must not cut a cleanup
        short); they are delivered, to whatever handles them then, when it ends."""
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED_SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        prev = self._prev_handlers.get(signum, signal.SIG_DFL)
        logger.warning("%s: signal %d, cleaning up", self.label, signum)
        self._cleanup()  # uninstalls this guard
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
