"""Peak resident memory of processes over a stretch of a benchmark, sampled from /proc.

`getrusage`'s maxrss never goes down, so it cannot say what one arm of a benchmark used after an
earlier, larger one; sampling the current RSS can. Linux only: elsewhere the peaks read None.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes(pid: int) -> int | None:
    """Resident memory of `pid` now (None once it is gone, or without /proc)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return None


class PeakRss:
    """Context manager: the largest RSS of each process `pids()` names, sampled every `period_s`
    while the block runs (default: this process alone)."""

    def __init__(self, pids: Callable[[], list[int]] | None = None, period_s: float = 0.05) -> None:
        self.pids = pids or (lambda: [os.getpid()])
        self.period_s = period_s
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="peak-rss")

    def _sample(self) -> None:
        for pid in self.pids():
            now = rss_bytes(pid)
            if now is not None:
                self.peaks[pid] = max(now, self.peaks.get(pid, 0))

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    @property
    def peak_gib(self) -> float | None:
        """The largest peak of one process, in GiB (None if nothing was sampled)."""
        return round(max(self.peaks.values()) / 2**30, 3) if self.peaks else None

    def __enter__(self) -> PeakRss:
        self._sample()
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
