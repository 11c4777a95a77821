"""Per-peer metrics as JSON lines: one record per round, plus start and final records.

The one place metrics are produced; `local`, the benches and the tests read these files.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO, Any

from p2p_trainer.train.trainer import RoundMetrics


def round_record(peer_id: str, m: RoundMetrics, started: float) -> dict[str, Any]:
    ex = m.report.exchanges
    return {
        "kind": "round",
        "peer": peer_id,
        "time_s": time.monotonic() - started,
        "unix_time": time.time(),
        "round": m.round,
        "step": m.step,
        "tokens": m.tokens,
        "train_loss": m.train_loss,
        "val_loss": m.val_loss,
        "compute_s": m.compute_s,
        "blocked_s": m.blocked_s,
        "wall_s": m.wall_s,
        **m.extra,
        "bytes_sent": sum(e.bytes_sent for e in ex),
        "bytes_received": sum(e.bytes_received for e in ex),
        "exchanges": [
            {
                "tag": e.tag,
                "ok": e.ok,
                "group_size": e.group_size,
                "elapsed_s": round(e.elapsed_s, 4),
                "blocked_s": round(e.blocked_s, 4),
                "reason": e.reason,
                "left_out": list(e.left_out),
                "own_parts": e.own_parts,
                "late_parts": e.late_parts,
                "started_unix": round(e.started_unix, 4),
                "group": e.group,
            }
            for e in ex
        ],
    }


class MetricsWriter:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = open(path, "a", buffering=1)  # line-buffered: readers see whole lines

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self._file.close()


def read_records(path: Path) -> list[dict[str, Any]]:
    """All complete records of a metrics file (a partially written last line is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
