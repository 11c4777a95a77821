"""TensorBoard scalars of a peer (`[log] tensorboard_dir`, `join --tensorboard-dir`).

An observer of `round_lines.ObservedWriter`, like the Prometheus endpoint: it writes what each
round record says, so TensorBoard, metrics.jsonl and the log tell the same story. The x axis is
the peer's inner step (`RoundRecord.step`), which only grows within one peer's run, so curves of
peers with different round lengths line up. The `tensorboard` package is optional (an extra):
`require_tensorboard` fails with what to install before a peer starts anything.

Tags: `loss/train`, `loss/val`, `throughput/tokens_per_s`, `throughput/utilisation`,
`tokens/total`, `bytes/sent`, `bytes/received` (that round's), `exchange/blocked_s` (time the
round's training waited for exchanges), `exchange/<outcome>` (how many of the round's exchanges
ended ok, partial, alone, failed) and `exchange/<tag>/seconds` (each exchange's time), and
`round`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from p2p_trainer.round_log import EXCHANGE_OUTCOMES, FinalRecord, LogRecord, RoundRecord
from p2p_trainer.run.round_lines import exchange_outcome, tokens_per_s, utilisation

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

logger = logging.getLogger(__name__)


class TensorBoardMissing(RuntimeError):
    """A TensorBoard directory is set, but the `tensorboard` package is not installed."""


def require_tensorboard(directory: str) -> None:
    """Raise `TensorBoardMissing`, naming the setting and the fix, unless tensorboard imports."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise TensorBoardMissing(
            f"--tensorboard-dir / [log] tensorboard_dir = {directory!r} needs the tensorboard package, "
            "which is not installed: pip install 'p2p-trainer[tensorboard]' (or pip install tensorboard), "
            "or leave the setting unset"
        ) from None


class TensorBoardScalars:
    """Writes each record's scalars under `directory` (created); `observe` every record, `close` once."""

    def __init__(self, directory: Path) -> None:
        require_tensorboard(str(directory))
        from torch.utils.tensorboard import SummaryWriter

        self.directory = directory
        self._writer: SummaryWriter = SummaryWriter(log_dir=str(directory))

    def observe(self, record: LogRecord) -> None:
        if isinstance(record, RoundRecord):
            self._round(record)
        elif isinstance(record, FinalRecord) and record.val_loss is not None:
            self._writer.add_scalar("loss/val", record.val_loss, record.step)
            self._writer.flush()

    def _round(self, r: RoundRecord) -> None:
        add, step = self._writer.add_scalar, r.step
        add("loss/train", r.train_loss, step)
        if r.val_loss is not None:
            add("loss/val", r.val_loss, step)
        add("throughput/tokens_per_s", tokens_per_s(r), step)
        add("throughput/utilisation", utilisation(r), step)
        add("tokens/total", r.tokens, step)
        add("bytes/sent", r.bytes_sent, step)
        add("bytes/received", r.bytes_received, step)
        add("exchange/blocked_s", r.blocked_s, step)
        outcomes = [exchange_outcome(e) for e in r.exchanges]
        for outcome in EXCHANGE_OUTCOMES:  # zeros too: a chart of failures is flat, not missing
            add(f"exchange/{outcome}", outcomes.count(outcome), step)
        for e in r.exchanges:
            add(f"exchange/{e.tag}/seconds", e.elapsed_s, step)
        add("round", r.round, step)
        # a round is seconds to minutes apart: flushing each lets TensorBoard (and a peer that is
        # killed) see it at once, at next to no cost
        self._writer.flush()

    def close(self) -> None:
        try:  # a run that ended well must not end in a traceback because its last flush failed
            self._writer.close()
        except Exception:
            logger.exception("closing the TensorBoard writer in %s failed", self.directory)
