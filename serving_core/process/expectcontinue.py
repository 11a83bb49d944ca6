"""``Expect: 100-continue`` answered when the app first reads the body, not before.

gunicorn sends ``100 Continue`` as soon as it has parsed the headers, before
any app code runs, so a client that asked to wait uploads its whole body even
for a request the app refuses on its headers alone (a ``Content-Length`` over
SERVING_MAX_BODY_BYTES, a missing API key, a full queue): the point of asking
is lost. Here the interim response goes out on the body's first read; a
request refused without reading gets its final status instead, and its
connection is closed, since the client may or may not send the body then
(RFC 9110, 10.1.1), and what it sends would be read as the next request.
"""

from __future__ import annotations

from typing import Any

from gunicorn import util

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class ContinueOnRead:
    """A request body that sends ``100 Continue`` before its first read."""

    def __init__(self, body: Any, sock: Any) -> None:
        self._body = body
        self._sock = sock
        self.sent = False

    def _go_on(self) -> None:
        if not self.sent:
            self.sent = True
            util.write(self._sock, CONTINUE)

    def read(self, size: int | None = None) -> bytes:
        self._go_on()
        return self._body.read(size)  # type: ignore[no-any-return]

    def readline(self, size: int | None = None) -> bytes:
        self._go_on()
        return self._body.readline(size)  # type: ignore[no-any-return]

    def readlines(self, size: int | None = None) -> list[bytes]:
        self._go_on()
        return self._body.readlines(size)  # type: ignore[no-any-return]

    def __iter__(self) -> ContinueOnRead:
        return self

    def __next__(self) -> bytes:
        line = self.readline()
        if not line:
            raise StopIteration
        return line


def defer(req: Any, sock: Any) -> ContinueOnRead | None:
    """Take the ``100 Continue`` that gunicorn would send now off ``req``, to send on
    the body's first read; None when the request did not ask for one."""
    if not getattr(req, "_expected_100_continue", False) or req.body is None:
        return None
    req._expected_100_continue = False
    body = ContinueOnRead(req.body, sock)
    req.body = body
    return body
