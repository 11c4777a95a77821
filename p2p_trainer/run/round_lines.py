"""A peer's records as they are written: to metrics.jsonl, to its log, and to any other observer.

`ObservedWriter` is the one place where a record of `run/join.py` (start, resume, round,
rejoin, final) reaches the metrics file, the log line of `log_record` (one per round, with the
round's loss, throughput and exchange outcomes) and the Prometheus endpoint
(`run/peer_metrics.py`), so none of them can tell a different story about a round.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from p2p_trainer.logs import CONTEXT
from p2p_trainer.round_log import (
    EXCHANGE_OUTCOMES,
    ExchangeRecord,
    FinalRecord,
    LogRecord,
    RejoinRecord,
    ResumeRecord,
    RoundRecord,
    StartRecord,
)
from p2p_trainer.train.metrics import MetricsWriter

logger = logging.getLogger("p2p_trainer.round")

RecordObserver = Callable[[LogRecord], None]


class ObservedWriter(MetricsWriter):
    """Writes each record to the metrics file, then hands it to every observer in turn."""

    def __init__(self, path: Path, observers: Sequence[RecordObserver]) -> None:
        super().__init__(path)
        self._observers = tuple(observers)

    def write(self, record: LogRecord) -> None:
        super().write(record)
        for observe in self._observers:
            try:
                observe(record)
            except Exception:  # a broken observer must not stop the training it reports on
                logger.exception("an observer of the %s records failed", record.KIND)


def exchange_outcome(e: ExchangeRecord) -> str:
    """`ok`: merged with its whole group; `partial`: merged, but members or parts were left out
    (late, dead, dropped); `alone`: finished without anyone else's values; `failed`: no result.
    A group size of 0 (an exchange that does not count its members) is the whole group."""
    if not e.ok:
        return "failed"
    if e.group_size == 1 and not e.merged:
        return "alone"
    if e.own_parts or e.late_parts or e.left_out:
        return "partial"
    return "ok"


def round_outcome(exchanges: Sequence[ExchangeRecord]) -> str:
    """The worst outcome among a round's exchanges ("" for a round without any, e.g. `independent`):
    one line of a status table has room for one word, and the worst is the one to act on."""
    outcomes = [exchange_outcome(e) for e in exchanges]
    return max(outcomes, key=EXCHANGE_OUTCOMES.index, default="")


def tokens_per_s(r: RoundRecord) -> float:
    return r.round_tokens / r.wall_s if r.wall_s > 0 else 0.0


def utilisation(r: RoundRecord) -> float:
    """The share of the round's wall time spent in inner steps (exchange waits excluded)."""
    return r.compute_s / r.wall_s if r.wall_s > 0 else 0.0


def _exchange_text(e: ExchangeRecord) -> str:
    text = f"{e.tag} {exchange_outcome(e)}({e.group_size}) {e.elapsed_s:.2f}s"
    return f"{text} [{e.reason}]" if e.reason else text


def round_fields(r: RoundRecord) -> dict[str, Any]:
    """The round line's JSON fields (`--log-format json`)."""
    return {
        "event": "round",
        "loss": r.train_loss,
        "val_loss": r.val_loss,
        "tokens": r.tokens,
        "round_tokens": r.round_tokens,
        "tokens_per_s": tokens_per_s(r),
        "wall_s": r.wall_s,
        "utilisation": utilisation(r),
        "bytes_sent": r.bytes_sent,
        "bytes_received": r.bytes_received,
        "exchanges": [
            {
                "tag": e.tag,
                "outcome": exchange_outcome(e),
                "group_size": e.group_size,
                "elapsed_s": e.elapsed_s,
                "reason": e.reason,
            }
            for e in r.exchanges
        ],
    }


def _loss(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def log_record(record: LogRecord) -> None:
    """One log line per record; a round's line names its round and step (also in the line's prefix)."""
    if isinstance(record, RoundRecord):
        CONTEXT.round, CONTEXT.step = record.round, record.step
        logger.info(
            "round %d done: step %d, loss %.3f, %.0f tokens/s, exchanges: %s",
            record.round,
            record.step,
            record.train_loss,
            tokens_per_s(record),
            ", ".join(_exchange_text(e) for e in record.exchanges) or "none",
            extra={"fields": round_fields(record)},
        )
    elif isinstance(record, StartRecord):
        logger.info(
            "peer %s training, method %s, run %s",
            record.peer,
            record.method,
            record.run_id[:12],
            extra={"fields": {"event": "start", "peer_id": record.peer, "method": record.method}},
        )
    elif isinstance(record, ResumeRecord):
        CONTEXT.round = record.round
        logger.info("resumed at round %d", record.round, extra={"fields": {"event": "resume"}})
    elif isinstance(record, RejoinRecord):
        CONTEXT.round = record.to_round
        logger.info(
            "adopted the swarm's round %d (was at %d)",
            record.to_round,
            record.from_round,
            extra={"fields": {"event": "rejoin", "from_round": record.from_round}},
        )
    elif isinstance(record, FinalRecord):
        CONTEXT.round, CONTEXT.step = record.round, record.step
        logger.info(
            "finished at round %d, step %d: val loss %s%s",
            record.round,
            record.step,
            _loss(record.val_loss),
            " (stopped)" if record.stopped else "",
            extra={"fields": {"event": "final", "val_loss": record.val_loss, "stopped": record.stopped}},
        )
