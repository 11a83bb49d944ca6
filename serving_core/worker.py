"""gunicorn's gthread worker, telling the app what only the worker knows.

- When each request started to wait for a thread: with every thread busy, a
  readable connection waits in the worker's thread-pool queue where the app
  cannot see it; the stamp lets the deadline (and admission) count that wait.
- How many client connections are open: the adaptive batcher's bound on who
  may still send.

It also makes gunicorn's own protocol errors JSON, like every other error.

Selected by ``serving-core serve``; nothing else changes.
"""

from __future__ import annotations

import time
from typing import Any

from gunicorn import util
from gunicorn.workers.gthread import ThreadWorker

from . import arrival, encoding


def write_json_error(sock: Any, status_int: int, reason: str, mesg: str) -> None:
    """gunicorn's own errors (a malformed request line, headers too large) in our JSON shape.

    gunicorn writes these itself, as HTML, before any app runs; this replaces
    its ``util.write_error``, which its worker calls by module attribute.
    """
    body = encoding.dumps(
        {"error": {"type": reason.lower().replace(" ", "_"), "message": mesg or reason}}
    )
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    util.write_nonblock(sock, head.encode("latin-1") + body)


util.write_error = write_json_error


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
