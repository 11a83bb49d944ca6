"""gunicorn's logger with a cheaper access line.

gunicorn builds its access line from an "atoms" dict holding every request
header, every response header and every WSGI environ entry, for each request,
whatever the format uses: 21.5 us per request in a micro-benchmark, against
6.5 us for this logger, which writes the one line we use from the few values
it needs:

    127.0.0.1 "POST /predict HTTP/1.1" 200 412 9ms request_id=3f2a...

Everything else (the error log, files, syslog, ``--log-config``, reopening on
``USR1``) is gunicorn's, unchanged; the line still goes through the
``gunicorn.access`` logger, so a logging config may route or silence it.
"""

from __future__ import annotations

import traceback
from datetime import timedelta
from typing import Any

from gunicorn.glogging import Logger

_FORMAT = '%s "%s %s %s" %s %s %dms request_id=%s'


class AccessLogger(Logger):  # type: ignore[misc]
    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: timedelta) -> None:
        if not self.access_log_enabled:
            return
        request_id = "-"
        for name, value in resp.headers:
            if len(name) == 12 and name.lower() == "x-request-id":
                request_id = value
                break
        status = resp.status
        if isinstance(status, str):
            status = status.split(None, 1)[0]
        sent = resp.sent if getattr(resp, "sent", None) is not None else "-"
        try:
            self.access_log.info(
                _FORMAT,
                environ.get("REMOTE_ADDR", "-"),
                environ["REQUEST_METHOD"],
                environ["RAW_URI"],
                environ["SERVER_PROTOCOL"],
                status,
                sent,
                request_time.seconds * 1000 + request_time.microseconds // 1000,
                request_id,
            )
        except Exception:
            self.error(traceback.format_exc())
