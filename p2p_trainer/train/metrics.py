"""Per-peer metrics as JSON lines: one record per round, plus start, resume, rejoin and final records.

The one place metrics are written; the record types and the reader are in `p2p_trainer/round_log.py`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import IO

from p2p_trainer.round_log import DropCount, LogRecord, RoundRecord
from p2p_trainer.train.trainer import RoundMetrics


def round_record(
    peer_id: str, m: RoundMetrics, started: float, dropped: tuple[DropCount, ...] = ()
) -> RoundRecord:
    """The round's line; `started` is the peer's start (time.monotonic()), the origin of `time_s`;
    `dropped`: the records the peer refused during the round."""
    ex = tuple(m.report.exchanges)
    return RoundRecord(
        peer=peer_id,
        time_s=time.monotonic() - started,
        unix_time=time.time(),
        round=m.round,
        step=m.step,
        tokens=m.tokens,
        train_loss=m.train_loss,
        val_loss=m.val_loss,
        compute_s=m.compute_s,
        blocked_s=m.blocked_s,
        wall_s=m.wall_s,
        round_tokens=m.round_tokens,
        live_peers=m.live_peers,
        skipped_steps=m.skipped_steps,
        landed_at_step=m.landed_at_step,
        bytes_sent=sum(e.bytes_sent for e in ex),
        bytes_received=sum(e.bytes_received for e in ex),
        exchanges=ex,
        dropped=dropped,
    )


class MetricsWriter:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = open(path, "a", buffering=1)  # line-buffered: readers see whole lines

    def write(self, record: LogRecord) -> None:
        self._file.write(record.to_json() + "\n")

    def close(self) -> None:
        self._file.close()
