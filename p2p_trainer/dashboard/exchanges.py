"""Each peer's exchange outcomes, from the metrics files of a run directory (`--run-dir`).

Heartbeats carry only the worst outcome of a peer's last round, so the counts, tags and times
come from the peers' own records where the dashboard can read them: a `local` run's directory (one `peer*/` folder per peer) or a `join`
peer's `--run-dir`. Files are followed with `LogTail`, which parses only the lines added since
the last read, so polling every few seconds costs the peers next to nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2p_trainer.round_log import EXCHANGE_OUTCOMES, LogTail
from p2p_trainer.run.round_lines import exchange_outcome

RECENT = 200
"""Exchanges kept for the page's exchange chart and list, newest last."""


@dataclass(frozen=True)
class ExchangeView:
    source: str
    """The run directory read."""
    per_peer: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Peer id -> counts by outcome (`ok`, `partial`, `alone`, `failed`) and its `last` exchange."""
    recent: list[dict[str, Any]] = field(default_factory=list)
    """The latest exchanges of every peer, oldest first."""


def metrics_files(run_dir: Path) -> list[Path]:
    """A peer's own metrics.jsonl and those one folder down (`local`'s peer0/, peer1/, ...)."""
    found = [run_dir / "metrics.jsonl", *sorted(run_dir.glob("*/metrics.jsonl"))]
    return [p for p in found if p.is_file()]


class RunDirExchanges:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._tails: dict[Path, LogTail] = {}

    def read(self) -> ExchangeView:
        per_peer: dict[str, dict[str, Any]] = {}
        recent: list[dict[str, Any]] = []
        for path in metrics_files(self.run_dir):
            log = self._tails.setdefault(path, LogTail(path)).read()
            for r in log.rounds:
                counts = per_peer.setdefault(r.peer, {o: 0 for o in EXCHANGE_OUTCOMES} | {"last": None})
                for e in r.exchanges:
                    outcome = exchange_outcome(e)
                    counts[outcome] += 1
                    entry = {
                        "peer_id": r.peer,
                        "round": r.round,
                        "tag": e.tag,
                        "outcome": outcome,
                        "group_size": e.group_size,
                        "elapsed_s": round(e.elapsed_s, 3),
                        "reason": e.reason,
                        "unix_time": e.started_unix or r.unix_time,
                    }
                    counts["last"] = entry
                    recent.append(entry)
        recent.sort(key=lambda e: e["unix_time"])
        return ExchangeView(str(self.run_dir), per_peer, recent[-RECENT:])
