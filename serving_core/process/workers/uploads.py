"""Slow clients in a gevent worker: a total deadline on each request body, and room
kept for new connections.

A gevent worker holds at most ``SERVING_WORKER_CONNECTIONS`` connections, and
gunicorn puts no clock on reading a request body: ~1,000 clients that send
their headers and then dribble or stall the body would hold every connection
of a worker, which would then accept nobody else. Two rules here:

- Every read of a request's body runs under what is left of
  ``SERVING_BODY_TIMEOUT_S``, counted from when gunicorn handed the request
  to the app (its headers had arrived). Past it, the request is a 408 and the
  connection is closed.
- Near the limit (over nine tenths of it open), each new connection cuts the
  one that has waited longest on its client: reading a body, or between
  requests (keep-alive, or headers still coming, which gunicorn bounds only by
  the keep-alive timeout). A request the app is working on is never cut. A cut
  body is answered 408 too; the others are just closed. So a normal request
  finds a free connection however many slow ones arrive.

nginx in front reads whole bodies before passing them on (with its own
timeouts and a per-address connection limit), so behind it none of this
fires; it is what protects a worker that runs alone.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from dataclasses import dataclass
from typing import Any

import gevent

from serving_core.errors import RequestTimeout

log = logging.getLogger("serving_core.process.workers.uploads")

FREE_SHARE = 10  # keep a tenth of the connections free (at least one)
_CUT_LOG_EVERY_S = 10.0


@dataclass(eq=False)
class Connection:
    """One client connection: waiting on its client (``waiting``) since ``since``."""

    sock: Any
    since: float
    waiting: bool = True  # for headers, keep-alive or a body; False while the app works
    reading_body: bool = False
    cut: bool = False


class Connections:
    """A worker's open client connections, the longest waiting first."""

    def __init__(self, worker_connections: int) -> None:
        self.limit = worker_connections - max(1, worker_connections // FREE_SHARE)
        # Insertion order is the order of ``since``: a connection that starts to
        # wait (again) is moved to the end.
        self._open: dict[object, Connection] = {}
        self._cutting = 0  # cut, not yet closed
        self._cuts = 0  # cut since the last log line
        self._logged_at = 0.0

    def __len__(self) -> int:
        return len(self._open)

    def opened(self, sock: Any) -> Connection:
        """Called in the connection's greenlet when it starts."""
        conn = Connection(sock, time.monotonic())
        self._open[gevent.getcurrent()] = conn
        return conn

    def closed(self) -> None:
        conn = self._open.pop(gevent.getcurrent(), None)
        if conn is not None and conn.cut:
            self._cutting -= 1

    def current(self) -> Connection | None:
        return self._open.get(gevent.getcurrent())

    def working(self, conn: Connection) -> None:
        """The app has the connection's request: not cut from now on, except in a body read."""
        self._move_to_end(conn)
        conn.waiting = False

    def idle(self, conn: Connection) -> None:
        """The response is out: the connection waits for the client's next request."""
        self._move_to_end(conn)
        conn.waiting = True

    def _move_to_end(self, conn: Connection) -> None:
        key = gevent.getcurrent()
        if self._open.pop(key, None) is conn:
            self._open[key] = conn
        conn.since = time.monotonic()

    def make_room(self, open_connections: int) -> None:
        """After an accept: over the limit, cut the connection that waited longest."""
        if open_connections - self._cutting <= self.limit:
            return
        for conn in self._open.values():
            if conn.waiting and not conn.cut:
                self.cut(conn)
                return

    def cut(self, conn: Connection) -> None:
        conn.cut = True
        self._cutting += 1
        # A body read sees the end of its input and answers 408; the response can
        # still be written. Otherwise nothing is left to send. The real socket's
        # shutdown: gevent's own would wake the waiting greenlet with an EBADF
        # error, which gunicorn logs as a traceback, instead of an end of input.
        how = socket.SHUT_RD if conn.reading_body else socket.SHUT_RDWR
        with contextlib.suppress(OSError):  # gone already
            getattr(conn.sock, "_sock", conn.sock).shutdown(how)
        self._cuts += 1
        now = time.monotonic()
        if now - self._logged_at >= _CUT_LOG_EVERY_S:
            log.warning(
                "%d connection(s) cut: this worker held over %d connections (nine tenths of "
                "SERVING_WORKER_CONNECTIONS); the ones waiting longest on slow or idle "
                "clients go first",
                self._cuts,
                self.limit,
            )
            self._cuts, self._logged_at = 0, now


class _Expired(Exception):
    """Thrown into a greenlet whose body read ran past its deadline (``TimedBody``)."""


class TimedBody:
    """A request's ``wsgi.input``, every read under what is left of the body's deadline."""

    def __init__(
        self,
        body: Any,
        *,
        deadline: float,
        timeout_s: float,
        conn: Connection | None,
        on_fail: Any,
    ) -> None:
        self._body = body
        self._deadline = deadline
        self._timeout_s = timeout_s
        self._conn = conn
        self._on_fail = on_fail  # called before a 408: the connection must close

    def read(self, size: int | None = None) -> bytes:
        return self._timed(self._body.read, size)  # type: ignore[no-any-return]

    def readline(self, size: int | None = None) -> bytes:
        return self._timed(self._body.readline, size)  # type: ignore[no-any-return]

    def readlines(self, size: int | None = None) -> list[bytes]:
        return self._timed(self._body.readlines, size)  # type: ignore[no-any-return]

    def __iter__(self) -> TimedBody:
        return self

    def __next__(self) -> bytes:
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def _timed(self, read: Any, size: int | None) -> Any:
        conn = self._conn
        left = self._deadline - time.monotonic()
        if left <= 0 or (conn is not None and conn.cut):
            raise self._fail()
        # What gevent.Timeout does (a hub timer that throws into this greenlet),
        # without making a Timeout, an exception object, for every read.
        timer = gevent.get_hub().loop.timer(left, priority=-1)
        if conn is not None:
            conn.waiting = conn.reading_body = True
        timer.start(gevent.getcurrent().throw, _Expired, update=True)
        try:
            data = read(size)
        except _Expired:
            raise self._fail() from None
        except OSError:
            if conn is not None and conn.cut:
                raise self._fail() from None  # gunicorn's NoMoreData: the end of a cut body
            raise
        finally:
            timer.close()
            if conn is not None:
                conn.waiting = conn.reading_body = False
        if conn is not None and conn.cut:
            raise self._fail()
        return data

    def _fail(self) -> RequestTimeout:
        self._on_fail()
        if self._conn is not None and self._conn.cut:
            return RequestTimeout(
                "the request body was still arriving while this server needed the connection "
                "for others; send the whole body promptly"
            )
        return RequestTimeout(
            f"the request body did not arrive within SERVING_BODY_TIMEOUT_S={self._timeout_s:g} s "
            "of its headers; send the whole body promptly"
        )
