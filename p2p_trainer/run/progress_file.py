"""A peer's phase and progress within its round, in run_dir/progress.json, for `local`'s live table.

metrics.jsonl says what a peer finished (rounds, its end); it says nothing while the peer starts
its DHT node, waits for the others, or is half-way through a round. So `join` also keeps this
small file: the phase it is in (`PHASES`), and while training its round and inner step, rewritten
atomically (`atomic_write_text`), so the table never reads half a file. Phase changes are
written at once; progress within a round at most once per `period_s`, from a thread of its own,
so the inner steps never wait for a disk.

`peer_state` turns this file, the peer's final record and its process's exit status into the one
word (and the progress) the table shows.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2p_trainer.round_log import FinalRecord
from p2p_trainer.train.atomic_files import atomic_write_text

logger = logging.getLogger(__name__)

PROGRESS_FILE = "progress.json"
PHASES = ("starting", "waiting-for-peers", "training", "stopping", "done")
"""What `join` writes: its DHT node is starting; it is in the swarm and waits for the peers (or
downloads their state) before its first round; it trains; it saves, agrees and evaluates at the
end; it is finished."""


@dataclass(frozen=True)
class Progress:
    """Where a peer is within its run."""

    round: int = 0
    round_step: int = 0
    """Inner steps done in `round` (`round_steps` while it exchanges)."""
    round_steps: int = 0
    step: int = 0


class ProgressFile:
    """Writes run_dir/progress.json: `phase` at once, `follow`ed progress every `period_s`."""

    def __init__(self, path: Path, period_s: float = 1.0) -> None:
        self.path, self.period_s = path, period_s
        self._phase = "starting"
        self._sample: Callable[[], Progress] = Progress
        self._lock = threading.Lock()
        self._written: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures = 0
        """Failed writes in a row: only the first is logged, and the recovery."""

    def phase(self, phase: str) -> None:
        if phase not in PHASES:
            raise ValueError(f"phase {phase!r}: use one of {', '.join(PHASES)}")
        self._phase = phase
        self.write()

    def follow(self, sample: Callable[[], Progress]) -> None:
        """Write `sample()` every `period_s` (when it changed) until `close`."""
        self._sample = sample
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="progress-file", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.write()

    def write(self) -> None:
        """Write the phase and progress if either changed; a failed write is logged, never raised:
        the file only informs the table, and training must not stop for it."""
        try:
            # sampled under the lock: a state built before a phase change must not land after it
            with self._lock:  # the thread and a phase change may write at once
                state = {"phase": self._phase, **self._sample().__dict__}
                if state == self._written:
                    return
                atomic_write_text(self.path, json.dumps({**state, "unix_time": time.time()}))
                self._written = state
        except Exception:
            self._failures += 1
            if self._failures == 1:  # a full or failing disk fails every second: say it once
                logger.exception("writing %s failed (repeats are not logged until it works again)", self.path)
            return
        if self._failures:
            logger.warning("writing %s works again after %d failed writes", self.path, self._failures)
            self._failures = 0

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.period_s + 5)
            self._thread = None


def read_progress(path: Path) -> tuple[str, Progress] | None:
    """The phase and progress in `path`; None where there is no such file or it is not one (a
    peer of an older version writes none)."""
    try:
        data = json.loads(path.read_text())
        phase = data["phase"]
        progress = Progress(*(int(data[k]) for k in ("round", "round_step", "round_steps", "step")))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (phase, progress) if phase in PHASES else None


def peer_state(found: tuple[str, Progress] | None, final: FinalRecord | None, exit_code: int | None) -> str:
    """The table's word for a peer: from its progress file (`found`), its final record and its
    process's exit status (None: still running).

    A running peer is in the phase it wrote ("starting" before it wrote any; "training k/H", or
    "exchanging" once its round's inner steps are done). An exited one is "done" (its final
    record, or exit status 0), "stopped" (a final record that says a stop signal ended it, or the
    exit status of SIGINT or SIGTERM) or "failed" (any other exit: it crashed or was killed).
    """
    if exit_code is not None:
        if final is not None:
            return "stopped" if final.stopped else "done"
        if exit_code == 0:
            return "done"
        # a shell's 128 + SIGINT / SIGTERM, or Popen's -signal for one that came before the handlers
        return "stopped" if exit_code in (130, 143, -2, -15) else "failed"
    if found is None:
        return "starting"
    phase, p = found
    if phase != "training":
        return phase
    if p.round_steps and p.round_step >= p.round_steps:
        return "exchanging"
    return f"training {p.round_step}/{p.round_steps}" if p.round_steps else "training"
