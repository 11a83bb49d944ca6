"""The HTTP front's span of each request: the WSGI app run inside a server span.

One place for every HTTP route (``/predict``, V2, OpenAI's, ``/jobs``, a
``404``): its parent is the client's ``traceparent`` (nginx forwards it), it
is named for the route the app matched (``POST /predict``), and the answer
carries a ``traceresponse`` header (W3C Trace Context level 2), so a client,
or nginx's access line, learns the trace id of a request that came without
one. The door's spans (admission, read, queue, the batch) are its children,
and ``respond``: from the app's answer to its last byte sent, when the span
ends.
The probes and ``/metrics`` are not traced. With traces off it adds one
attribute lookup to a request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from serving_core.tracing import traceparent
from serving_core.tracing.tracer import NO_SPAN, tracer
from serving_core.web.logfields import ROUTE_KEY, TRACE_ID_KEY

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
TRACE_RESPONSE = "traceresponse"
# The probes and the scrape: a kubelet and Prometheus ask every few seconds, and a
# trace of each would bury the requests' (as OTel's own instrumentations let one
# exclude URLs). V2's health routes are probes too.
UNTRACED = frozenset(("/healthz", "/readyz", "/metrics", "/v2/health/live", "/v2/health/ready"))


class Traced:
    def __init__(self, app: WSGIApp) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        traces = tracer()
        if not traces.enabled or environ.get("PATH_INFO") in UNTRACED:
            return self.app(environ, start_response)
        method = environ.get("REQUEST_METHOD", "GET")
        attributes = {"http.request.method": method, "url.path": environ.get("PATH_INFO", "")}
        parent = environ.get("HTTP_TRACEPARENT")
        request = traces.start(method, parent=parent, kind="server", attributes=attributes)
        environ[TRACE_ID_KEY] = request.trace_id

        def start(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
            request.answered(int(status.split(" ", 1)[0]))
            for name, value in headers:
                if name.lower() == "x-request-id":
                    request.set("serving.request_id", value)
            headers.append((TRACE_RESPONSE, request.traceparent or ""))
            return start_response(status, headers, *exc_info)

        try:
            with traces.current_in(request, end=False):
                body = self.app(environ, start)
        except BaseException:
            request.end()  # failed by ``current_in``; Flask's funnel leaves this to bugs
            raise
        route = environ.get(ROUTE_KEY)
        if route:
            request.rename(f"{method} {route}")
            request.set("http.route", route)
        # The response: from the app's answer to its last byte on the wire (a stream's
        # events too); the request's span ends with it.
        respond = NO_SPAN
        if traceparent.sampled(request.traceparent):
            respond = traces.start("respond", parent=request.traceparent)

        def sent() -> None:
            respond.end()
            request.end()

        return Sending(body, sent)


class Sending:
    """The app's body, as gunicorn sends it; ``sent`` once it has closed it."""

    def __init__(self, body: Iterable[bytes], sent: Callable[[], None]) -> None:
        self.body = body
        self.sent = sent

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.body)

    def close(self) -> None:
        try:
            close = getattr(self.body, "close", None)
            if close is not None:
                close()
        finally:
            self.sent()
