"""Logging set-up, done once by the CLI: every line carries the peer's short id, round and step.

Two formats: `text` for people, `json` (one object per line) for log shippers. A record logged
with `extra={"fields": {...}}` carries those fields as keys of its JSON object, so a shipper
reads a round's loss or exchange outcomes without parsing the message.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

LOG_FORMATS = ("text", "json")


@dataclass
class LogContext:
    peer: str = "-"
    round: int = 0
    step: int = 0


CONTEXT = LogContext()


class ContextFilter(logging.Filter):
    """Stamps each record with the peer's short id, round and step (`CONTEXT`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.peer, record.round, record.step = CONTEXT.peer[-8:], CONTEXT.round, CONTEXT.step
        return True


_TEXT = logging.Formatter(
    "%(asctime)s %(levelname).1s [%(peer)s r%(round)d s%(step)d] %(name)s: %(message)s", "%H:%M:%S"
)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, peer, round, step, logger, message, and the
    record's `fields`, if any (they never replace the context keys)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "peer": getattr(record, "peer", CONTEXT.peer[-8:]),
            "round": getattr(record, "round", CONTEXT.round),
            "step": getattr(record, "step", CONTEXT.step),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update({k: v for k, v in fields.items() if k not in out})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def formatter(log_format: str) -> logging.Formatter:
    if log_format not in LOG_FORMATS:
        raise ValueError(f"unknown log format {log_format!r}; use one of {', '.join(LOG_FORMATS)}")
    return JsonFormatter() if log_format == "json" else _TEXT


_HANDLER = logging.StreamHandler(sys.stderr)
_HANDLER.addFilter(ContextFilter())


def setup_logging(level: str = "INFO", log_format: str = "text") -> None:
    _HANDLER.setStream(sys.stderr)  # the stream of now (tests swap sys.stderr between runs)
    root = logging.getLogger()
    root.handlers[:] = [_HANDLER]
    root.setLevel(level)
    use_log_format(log_format)


def use_log_format(log_format: str) -> None:
    """Switch every line to `log_format` ("text" or "json").

    In json, hivemind's own records go through our handler too: its import installs a handler
    of its own on the `hivemind` logger, whose lines no JSON reader could parse. Call this after
    hivemind is loaded (the commands that use it import it first), or its import undoes that.
    """
    _HANDLER.setFormatter(formatter(log_format))
    library = logging.getLogger("hivemind")
    if log_format == "json":
        library.handlers.clear()
        library.propagate = True
    library.setLevel(logging.WARNING)
