"""gunicorn's logger with a cheaper access line.

gunicorn builds its access line from an "atoms" dict holding every request
header, every response header and every WSGI environ entry, for each request,
whatever the format uses. This logger writes the one line we use from the few
values it needs, for a fraction of that CPU per request:

    127.0.0.1 "POST /predict HTTP/1.1" 200 412 9ms request_id=3f2a...

Everything else (the error log, files, syslog, ``--log-config``, reopening on
``USR1``) is gunicorn's, unchanged; the line still goes through the
``gunicorn.access`` logger, so a logging config may route or silence it.

``JsonAccessLogger`` (``SERVING_LOG_FORMAT=json``) writes gunicorn's error log
and the access line as JSON objects (``serving_core.logs.JsonFormatter``); the
access line's fields are the same few values, plus the route the app matched
and the size of the batch the model ran the request in (the app leaves them in
the WSGI environ under ``web.logfields``' keys).

Neither line holds a job's id in full (``/jobs/3f2a9c1e...``, in ASCII
whatever the log's encoding): the id is the key to a job's result, and a log
is read by more people than the API's callers. Eight hex digits still tell one
job's lines from another's.
"""

from __future__ import annotations

import logging
import traceback
from datetime import timedelta
from typing import Any

from gunicorn.glogging import Logger

from serving_core.logs import JsonFormatter
from serving_core.web.logfields import BATCH_SIZE_KEY, ROUTE_KEY, TRACE_ID_KEY

_FORMAT = '%s "%s %s %s" %s %s %dms request_id=%s'
_FORMAT_REVISION = _FORMAT + " model_revision=%s"
_JOBS = "/jobs/"
JOB_ID_LOGGED = 8  # characters of a job id an access line keeps


def logged_path(uri: str) -> str:
    """``uri`` with a job id after ``/jobs/`` cut to ``JOB_ID_LOGGED`` characters."""
    at = uri.find(_JOBS)
    if at < 0:
        return uri
    start = at + len(_JOBS)
    end = start
    while end < len(uri) and uri[end] not in "/?#":
        end += 1
    if end - start <= JOB_ID_LOGGED:
        return uri
    return uri[: start + JOB_ID_LOGGED] + "..." + uri[end:]


_JSON_MESSAGE = "%s %s %s"


class _JobIdsCut(Logger):  # type: ignore[misc]
    """gunicorn's logger, whose debug line of each request ("GET /jobs/ID") cuts job ids
    as the access line does."""

    def debug(self, msg: str, *args: Any, **kwargs: Any) -> None:
        cut = tuple(logged_path(arg) if isinstance(arg, str) else arg for arg in args)
        super().debug(msg, *cut, **kwargs)


class AccessLogger(_JobIdsCut):
    #: The model as served (``handler.model_revision``), so that a canary's lines and
    #: the stable release's tell apart; set by ``logger_class``.
    model_revision: str = ""

    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: timedelta) -> None:
        if not self.access_log_enabled:
            return
        request_id = _request_id(resp)
        status = resp.status
        if isinstance(status, str):
            status = status.split(None, 1)[0]
        sent = resp.sent if getattr(resp, "sent", None) is not None else "-"
        trace_id = environ.get(TRACE_ID_KEY)
        try:
            _log(
                self.access_log,
                (_FORMAT_REVISION if self.model_revision else _FORMAT)
                + (" trace_id=%s" if trace_id else ""),
                (
                    environ.get("REMOTE_ADDR", "-"),
                    environ["REQUEST_METHOD"],
                    logged_path(environ["RAW_URI"]),
                    environ["SERVER_PROTOCOL"],
                    status,
                    sent,
                    request_time.seconds * 1000 + request_time.microseconds // 1000,
                    request_id,
                    *((self.model_revision,) if self.model_revision else ()),
                    *((trace_id,) if trace_id else ()),
                ),
            )
        except Exception:
            self.error(traceback.format_exc())


def _log(logger: logging.Logger, message: str, args: tuple[Any, ...], **extra: Any) -> None:
    """``logger.info(message, *args)`` without looking up the caller's file and line,
    which ``Logger.info`` does on every call (a walk up the stack) and no format here
    uses; levels, filters and handlers apply as usual."""
    if logger.isEnabledFor(logging.INFO):
        record = logger.makeRecord(
            logger.name, logging.INFO, "(unknown file)", 0, message, args, None, extra=extra
        )
        logger.handle(record)


def _request_id(resp: Any) -> str:
    for name, value in resp.headers:
        if len(name) == 12 and name.lower() == "x-request-id":
            return str(value)
    return "-"


class JsonAccessLogger(_JobIdsCut):
    model_revision: str = ""  # as AccessLogger's

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        formatter = JsonFormatter()
        for log in (self.error_log, self.access_log):
            for handler in log.handlers:
                if getattr(handler, "_gunicorn", False):
                    handler.setFormatter(formatter)

    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: timedelta) -> None:
        if not self.access_log_enabled:
            return
        status = resp.status
        if isinstance(status, str):
            status = status.split(None, 1)[0]
        method = environ["REQUEST_METHOD"]
        path = logged_path(environ["RAW_URI"])
        try:
            status = int(status)
            fields = {
                "request_id": _request_id(resp),
                "method": method,
                "path": path,
                "route": environ.get(ROUTE_KEY),
                "batch_size": environ.get(BATCH_SIZE_KEY),
                "status": status,
                "duration_ms": round(request_time.total_seconds() * 1000, 3),
                "bytes": getattr(resp, "sent", None),
                "remote_addr": environ.get("REMOTE_ADDR"),
                "model_revision": self.model_revision or None,
                "trace_id": environ.get(TRACE_ID_KEY),
            }
            _log(self.access_log, _JSON_MESSAGE, (method, path, status), fields=fields)
        except Exception:
            self.error(traceback.format_exc())


def logger_class(log_format: str, revision: str) -> type[Logger]:
    """gunicorn's ``logger_class`` for SERVING_LOG_FORMAT, writing ``revision`` in each
    access line (gunicorn builds its logger from the class alone, so it rides on one)."""
    base: type[Logger] = JsonAccessLogger if log_format == "json" else AccessLogger
    return type(base.__name__, (base,), {"model_revision": revision})
