"""The masters' ``/healthz`` and ``/metrics`` on SERVING_BIND (``serving-core worker``
and ``serving-core stream``): a small HTTP server in one thread of the master.

Bounded, since anyone who reaches the port can open connections: each
connection has ``TIMEOUT_S`` to send its request and take its answer, and at
most ``MAX_CONNECTIONS`` are served at once (one thread each); a connection
beyond them is closed unanswered, and a probe tries again. Without the bounds,
idle connections would each hold a thread of the master for ever.
"""

from __future__ import annotations

import contextlib
import errno
import http.server
import json
import threading
from typing import Any, Protocol

from serving_core.metrics.directory import exposition
from serving_core.metrics.metrics import CONTENT_TYPE

TIMEOUT_S = 5.0  # a connection's time to send its request, and to take its answer
MAX_CONNECTIONS = 16  # served at once; probes and a scraper need a few


class Watched(Protocol):
    """What ``/healthz`` reports: the master's consumers."""

    children: dict[int, int]
    stopping: bool


class BindError(Exception):
    """SERVING_BIND cannot be listened on; the message names the address, the setting
    and what to do."""


class _Health(http.server.BaseHTTPRequestHandler):
    master: Watched
    timeout = TIMEOUT_S  # StreamRequestHandler: the socket's timeout

    def do_GET(self) -> None:
        if self.path == "/healthz":
            alive = len(self.master.children)
            status = 200 if alive and not self.master.stopping else 503
            body = json.dumps(
                {
                    "consumers": alive,
                    "pids": sorted(self.master.children),
                    "stopping": self.master.stopping,
                }
            ).encode()
            self._send(status, "application/json", body)
        elif self.path == "/metrics":
            self._send(200, CONTENT_TYPE, exposition())
        else:
            self._send(404, "application/json", b'{"error": {"type": "not_found"}}')

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # the probes would be most of the log


class HealthServer(http.server.ThreadingHTTPServer):
    """A thread per connection, at most ``MAX_CONNECTIONS`` of them."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], handler: type[_Health]) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # full: closed at once, the client tries again
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def serve(self) -> None:
        """Serve in a thread of its own (after the master's first forks)."""
        threading.Thread(target=self.serve_forever, name="serving-health", daemon=True).start()


def bind(master: Watched, bind: str, command: str) -> HealthServer:
    """The server of ``/healthz`` (200 while consumers run) and ``/metrics``, listening on
    SERVING_BIND but not yet serving; ``BindError`` saying what to fix."""
    host, _, port = bind.rpartition(":")
    handler = type("Health", (_Health,), {"master": master})
    try:
        return HealthServer((host.strip("[]"), int(port)), handler)
    except (OSError, ValueError, OverflowError) as error:
        taken = isinstance(error, OSError) and error.errno == errno.EADDRINUSE
        why = "the port is taken" if taken else f"cannot listen there ({error})"
        default = " (the default is serve's own port)" if bind == "127.0.0.1:8000" else ""
        raise BindError(
            f"SERVING_BIND={bind}: {why}{default}; {command} serves /healthz and /metrics "
            "there: set SERVING_BIND to a free address, e.g. SERVING_BIND=0.0.0.0:9090"
        ) from None


def close_inherited(server: HealthServer) -> None:
    """In a forked consumer: the master's listening socket is not the consumer's to hold
    (the port would stay taken after the master exits)."""
    with contextlib.suppress(OSError):
        server.socket.close()
