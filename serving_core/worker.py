"""gunicorn's gthread worker, stamping when each request started to wait for a thread.

With every thread busy, a readable connection waits in the worker's thread-pool
queue where the app cannot see it; the stamp lets the deadline (and admission)
count that wait. Selected by ``serving-core serve``; nothing else changes.
"""

from __future__ import annotations

import time
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

from . import arrival


class StampingThreadWorker(ThreadWorker):  # type: ignore[misc]
    def enqueue_req(self, conn: Any) -> None:
        conn.serving_queued_at = time.monotonic()
        super().enqueue_req(conn)

    def handle(self, conn: Any) -> Any:
        arrival.set_queued_at(getattr(conn, "serving_queued_at", None))
        try:
            return super().handle(conn)
        finally:
            arrival.set_queued_at(None)
