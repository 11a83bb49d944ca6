"""gunicorn's gthread worker, telling the app what only the worker knows.

- When each request started to wait for a thread: with every thread busy, a
  readable connection waits in the worker's thread-pool queue where the app
  cannot see it; the stamp lets the deadline (and admission) count that wait.
- How many client connections are open: the adaptive batcher's bound on who
  may still send.

``serving-core serve`` installs ``wire`` for it (one send per response, and
gunicorn's own protocol errors as JSON) and hands ``open_connections`` to the
service in ``post_fork``. Its requests wait on native threads: ``THREADS``.
"""

from __future__ import annotations

import time
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

from serving_core.process.drain import DrainingWorker
from serving_core.web import arrival


class StampingThreadWorker(DrainingWorker, ThreadWorker):  # type: ignore[misc]
    def open_connections(self) -> int:
        """Client connections open, each of which may still send one request
        (HTTP/1.1 carries one at a time): the adaptive batcher stops waiting
        once every connection's request is queued."""
        return int(self.nr_conns)

    def enqueue_req(self, conn: Any) -> None:
        conn.serving_queued_at = time.monotonic()
        super().enqueue_req(conn)

    def handle_request(self, req: Any, conn: Any) -> Any:
        if self.draining:
            req.must_close = True  # a keep-alive client reconnects, elsewhere by now
        return super().handle_request(req, conn)

    def handle(self, conn: Any) -> Any:
        arrival.set_queued_at(getattr(conn, "serving_queued_at", None))
        try:
            return super().handle(conn)
        finally:
            arrival.set_queued_at(None)
