"""Log lines as text (the default) or as one JSON object per line (``SERVING_LOG_FORMAT=json``).

A JSON line holds ``time`` (UTC, ISO 8601), ``level``, ``logger``,
``message`` and ``pid``, then the record's ``fields``: what a caller passed as
``extra={"fields": {...}}`` (the access line passes the request's id, method,
path, route, status and duration). A line logged inside a traced request has its ``trace_id`` and
``span_id``. A traceback goes under ``exception``, as
one string, so a line is always one object a log shipper can parse.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from serving_core.settings import LogFormat

TEXT_FORMAT = "%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s"


Context = Callable[[], Mapping[str, Any]]


class JsonFormatter(logging.Formatter):
    """One JSON object per record, encoded with orjson; ``context`` adds the fields of
    where it was logged (the trace's ids, handed in by the commands: this row imports
    no tracing)."""

    def __init__(self, context: Context | None = None) -> None:
        super().__init__()
        self.context = context

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        if self.context is not None:
            entry.update(self.context())
        fields = getattr(record, "fields", None)
        if fields:
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # default=str: a handler may log any object; the line must still be written.
        return orjson.dumps(entry, default=str).decode()


def formatter(log_format: LogFormat, context: Context | None = None) -> logging.Formatter:
    return JsonFormatter(context) if log_format == "json" else logging.Formatter(TEXT_FORMAT)


def configure(level: str, log_format: LogFormat, context: Context | None = None) -> None:
    """The root logger: every ``serving_core.*`` logger and the handler's own write here."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format, context))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    # warnings.warn() would print bare text to stderr; as log records they are JSON too.
    logging.captureWarnings(log_format == "json")
