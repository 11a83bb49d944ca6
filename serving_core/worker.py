"""gunicorn's gthread worker, telling the app what only the worker knows.

- When each request started to wait for a thread: with every thread busy, a
  readable connection waits in the worker's thread-pool queue where the app
  cannot see it; the stamp lets the deadline (and admission) count that wait.
- How many client connections are open: the adaptive batcher's bound on who
  may still send.

Like the gevent worker, it installs ``wire`` (one send per response, and
gunicorn's own protocol errors as JSON).

Selected by ``serving-core serve``; nothing else changes.
"""

from __future__ import annotations

import time
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

from . import arrival, wire

wire.install()


class StampingThreadWorker(ThreadWorker):  # type: ignore[misc]
    def init_process(self) -> None:
        arrival.count_connections_with(lambda: int(self.nr_conns))
        super().init_process()

    def enqueue_req(self, conn: Any) -> None:
        conn.serving_queued_at = time.monotonic()
        super().enqueue_req(conn)

    def handle(self, conn: Any) -> Any:
        arrival.set_queued_at(getattr(conn, "serving_queued_at", None))
        try:
            return super().handle(conn)
        finally:
            arrival.set_queued_at(None)
