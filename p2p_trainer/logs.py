"""Logging set-up, done once by the CLI: every line carries the peer's short id, round and step."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass


@dataclass
class LogContext:
    peer: str = "-"
    round: int = 0
    step: int = 0


CONTEXT = LogContext()


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.peer, record.round, record.step = CONTEXT.peer[-8:], CONTEXT.round, CONTEXT.step
        return True


def setup_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ContextFilter())
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s %(levelname).1s [%(peer)s r%(round)d s%(step)d] %(name)s: %(message)s", "%H:%M:%S"
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("hivemind").setLevel(logging.WARNING)
