"""A request as it comes in: when it arrived and its id, set before any route runs.

The id is the client's ``X-Request-ID`` when it is short and printable, else a
new one; it goes into the logs and back on the response.
"""

from __future__ import annotations

import io
import time

from flask import Request, Response, g, request
from werkzeug.exceptions import ClientDisconnected, RequestEntityTooLarge

from serving_core.context import request_id_of
from serving_core.errors import QUOTE_CHARS, BadRequest, ServingError, shorten
from serving_core.web import arrival

REQUEST_ID = "X-Request-ID"
READ_STEP = 64 * 1024  # a chunked body is read in steps of this much


def this_request() -> Request:
    """The request object itself: every attribute read through ``flask.request``
    looks the request context up again, and ``/predict`` reads a dozen."""
    return request._get_current_object()  # type: ignore[attr-defined,no-any-return]


def start(proxies: arrival.TrustedProxies) -> None:
    """``before_request``: ``g.arrival`` (monotonic seconds) and ``g.request_id``."""
    req = this_request()
    headers = req.headers
    # A stamp from anyone else is ignored: the deadline counts from now.
    stamp = headers.get("X-Request-Start") if proxies.trusts(req.remote_addr) else None
    glob = g._get_current_object()
    glob.arrival = arrival.arrival(stamp, now=time.monotonic(), wall_now=time.time())
    sent = headers.get(REQUEST_ID, "")
    glob.request_id = request_id_of(sent)


def tag(response: Response) -> Response:
    """``after_request``: the request's id on its response."""
    request_id = g.get("request_id")
    if request_id:
        response.headers[REQUEST_ID] = request_id
    return response


def bound_chunked(limit: int) -> None:
    """``before_request``: a chunked body (its length unknown until its end) read whole,
    and a 413 once it passes ``limit``, as a Content-Length over it gets.

    werkzeug's limit on such a stream stops reading at the limit and returns what it
    read: a 2 MB JSON body becomes a 400 "malformed JSON at column 1048577", a
    form a shorter form that is served. A server must never act on a cut body.
    Read, it goes on as a body of known length, so every reader of it (JSON, forms,
    multipart) sees exactly what was sent. After the keys check: a caller without
    a key never has its body read.
    """
    environ = this_request().environ
    chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
    if not chunked or "wsgi.input_terminated" not in environ:
        return  # a Content-Length body is refused on its header, before it is read
    stream = environ["wsgi.input"]
    parts: list[bytes] = []
    size = 0
    while True:
        try:
            # One byte past the limit is enough to know; never more is read.
            part = stream.read(min(READ_STEP, limit + 1 - size))
        except (OSError, ValueError):
            raise ClientDisconnected() from None  # as werkzeug's stream says it
        except ServingError:
            raise  # the gevent worker's 408 for a body that came too slowly
        except Exception as exc:
            # gunicorn's parser meets a bad chunk (a size that is not hex, a chunk without
            # its CRLF) only when the body is read, here: the client's error, not ours.
            raise BadRequest(
                f"the chunked request body is malformed ({shorten(str(exc), QUOTE_CHARS)}); "
                "send each chunk as its size in hex, CRLF, the data, CRLF, and end with "
                "0 CRLF CRLF, or send a Content-Length body"
            ) from None
        if not part:
            break
        size += len(part)
        if size > limit:
            raise RequestEntityTooLarge()
        parts.append(part)
    body = b"".join(parts)
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    # werkzeug ignores a Content-Length beside Transfer-Encoding: chunked.
    del environ["HTTP_TRANSFER_ENCODING"]
