"""How gunicorn puts our responses on the wire; `serving-core serve` installs it before fork.

- One send per response: gunicorn sends the status line and headers in one
  ``send`` and the body in another, so each response is two syscalls, two
  TCP segments and two wake-ups of the reader (nginx, or the client). Here the
  headers wait for the first body bytes and leave with them.
- ``Expect: 100-continue`` is answered on the body's first read
  (``expectcontinue``): a request refused on its headers is never uploaded.
- gunicorn's own protocol errors (a malformed request line, headers too large)
  are written before any app runs, as HTML; here they are JSON like every
  other error.

Both are small changes to gunicorn objects that its workers look up by module
attribute (``gunicorn.http.wsgi.Response``, ``gunicorn.util.write_error``);
``install`` makes them once per process.
"""

from __future__ import annotations

from typing import Any

from gunicorn import util
from gunicorn.http import wsgi

from serving_core import encoding
from serving_core.process import expectcontinue


def write_json_error(sock: Any, status_int: int, reason: str, mesg: str) -> None:
    """gunicorn's own errors in our JSON shape; replaces its ``util.write_error``."""
    body = encoding.dumps(
        {"error": {"type": reason.lower().replace(" ", "_"), "message": mesg or reason}}
    )
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    util.write_nonblock(sock, head.encode("latin-1") + body)


class CoalescingResponse(wsgi.Response):  # type: ignore[misc]
    """gunicorn's HTTP/1 response, sending its headers with the first body bytes."""

    sock: Any
    _head = b""

    def __init__(self, req: Any, sock: Any, cfg: Any, *args: Any) -> None:
        super().__init__(req, sock, cfg, *args)
        # Made before gunicorn's wsgi.create would send the 100 Continue.
        self._continue = expectcontinue.defer(req, sock)

    def send_headers(self) -> None:
        if self.headers_sent:
            return
        if self._continue is not None and not self._continue.sent:
            # Answered unread: the client may still send the body, or not.
            self.must_close = True
        # Let gunicorn build the head exactly as it would, but keep it back.
        sock: Any = self.sock
        capture = _Capture()
        self.sock = capture
        try:
            super().send_headers()
            self._head = capture.captured
        finally:
            self.sock = sock

    def _emit_body(self, data: bytes) -> None:
        if self._head and not self.chunked:
            head, self._head = self._head, b""
            util.write(self.sock, head + data)
            return
        self._flush_head()
        super()._emit_body(data)

    def _flush_head(self) -> None:
        if self._head:
            head, self._head = self._head, b""
            util.write(self.sock, head)

    def close(self) -> None:
        # A response without body bytes (a HEAD, a 204, an empty body) still
        # needs its head, before any chunked terminator.
        if not self.headers_sent:
            self.send_headers()
        self._flush_head()
        super().close()

    def can_sendfile(self) -> bool:
        # sendfile would put the file on the wire before the kept-back head;
        # a JSON API sends no files, and gunicorn falls back to write().
        return False


class _Capture:
    """Stands in for the socket while gunicorn writes the head."""

    def __init__(self) -> None:
        self.captured = b""

    def sendall(self, data: bytes) -> None:
        self.captured += data


_installed = False


def install() -> None:
    global _installed  # noqa: PLW0603 - gunicorn's module attributes are process-wide
    if not _installed:
        util.write_error = write_json_error
        wsgi.Response = CoalescingResponse
        _installed = True
