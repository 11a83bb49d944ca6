"""A request as it comes in: when it arrived and its id, set before any route runs.

The id is the client's ``X-Request-ID`` when it is short and printable, else a
new one; it goes into the logs and back on the response.
"""

from __future__ import annotations

import re
import time
from random import getrandbits

from flask import Request, Response, g, request

from serving_core.web import arrival

REQUEST_ID = "X-Request-ID"
# A client-sent id is echoed into logs and headers: keep it short and printable.
REQUEST_ID_OK = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")


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
    glob.request_id = sent if REQUEST_ID_OK.fullmatch(sent) else new_request_id()


def new_request_id() -> str:
    """128 random bits as 32 hex digits, like ``uuid4().hex``.

    From ``random``'s generator, not ``os.urandom`` (a system call per
    request): an id names a request in logs and headers and guards nothing
    (job ids are ``uuid4``). ``random`` reseeds itself in every forked worker,
    so workers do not repeat each other's ids.
    """
    return f"{getrandbits(128):032x}"


def tag(response: Response) -> Response:
    """``after_request``: the request's id on its response."""
    request_id = g.get("request_id")
    if request_id:
        response.headers[REQUEST_ID] = request_id
    return response
