"""nginx and W3C Trace Context: it hands the client's traceparent and tracestate to the
app unchanged, and its access line carries the request's trace id, from the client's
traceparent when the app would take it, else from the app's traceresponse.

The nginx the image's entrypoint starts, in front of a small real HTTP server on
127.0.0.1 that does what the app does with traces on: it continues a valid
traceparent (by serving-core's own parser) or starts a trace, and answers with a
traceresponse. Under /untraced it sends none, as the app with traces off.
"""

from __future__ import annotations

import http.server
import itertools
import json
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests

from serving_core.tracing import traceparent
from tests.nginx_server import Nginx, nginx_server

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
TRACESTATE = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"


@dataclass
class Upstream:
    """What the stand-in app saw: each request's headers, by its X-Request-ID."""

    url: str
    seen: dict[str, dict[str, str]] = field(default_factory=dict)
    # The traceresponse it sent for each request, if any.
    answered: dict[str, str] = field(default_factory=dict)


def upstream_handler(upstream: Upstream) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            self.rfile.read(length)
            request_id = self.headers["X-Request-ID"]
            upstream.seen[request_id] = {k.lower(): v for k, v in self.headers.items()}
            body = b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if not self.path.startswith("/untraced"):
                # As the app: the client's trace when it sent a valid traceparent
                # (serving-core's parser decides), else a new one; a new server span.
                ids = traceparent.parse(self.headers.get("traceparent"))
                trace_id = ids[0] if ids else int(secrets.token_hex(16), 16) | 1
                answer = traceparent.form(trace_id, int(secrets.token_hex(8), 16) | 1, 1)
                upstream.answered[request_id] = answer
                self.send_header("traceresponse", answer)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the test reads what it recorded, not stderr

    return Handler


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    host, port = server.server_address[:2]
    recorded = Upstream(f"{host}:{port}")
    server.RequestHandlerClass = upstream_handler(recorded)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorded
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="module")
def proxy(upstream: Upstream) -> Iterator[Nginx]:
    with nginx_server(upstream.url) as started:
        yield started


IDS = itertools.count()


def post(proxy: Nginx, path: str = "/predict", **headers: str) -> tuple[str, requests.Response]:
    request_id = f"trace-test-{next(IDS)}"
    response = requests.post(
        proxy.url + path, json={}, headers={"X-Request-ID": request_id, **headers}, timeout=10
    )
    assert response.status_code == 200
    return request_id, response


@pytest.mark.e2e
def test_a_clients_traceparent_reaches_the_app_unchanged_and_its_trace_id_is_logged(
    proxy: Nginx, upstream: Upstream
) -> None:
    request_id, response = post(proxy, traceparent=TRACEPARENT, tracestate=TRACESTATE)
    seen = upstream.seen[request_id]
    assert (seen["traceparent"], seen["tracestate"]) == (TRACEPARENT, TRACESTATE)
    assert proxy.access_entry(request_id)["trace_id"] == TRACE_ID
    # The app's traceresponse comes back to the client, in the client's trace.
    assert traceparent.trace_id_of(response.headers["traceresponse"]) == TRACE_ID


@pytest.mark.e2e
def test_without_a_traceparent_the_apps_traceresponse_gives_the_trace_id(
    proxy: Nginx, upstream: Upstream
) -> None:
    request_id, _ = post(proxy)
    assert "traceparent" not in upstream.seen[request_id]
    started = traceparent.trace_id_of(upstream.answered[request_id])
    assert started is not None
    assert proxy.access_entry(request_id)["trace_id"] == started


INVALID = {
    "garbage": "not-a-traceparent",
    "zero-trace-id": f"00-{'0' * 32}-00f067aa0ba902b7-01",
    "zero-span-id": f"00-{TRACE_ID}-{'0' * 16}-01",
    "version-ff": f"ff-{TRACE_ID}-00f067aa0ba902b7-01",
    "version-00-with-more": f"{TRACEPARENT}-extra",
    "short-trace-id": f"00-{TRACE_ID[:31]}-00f067aa0ba902b7-01",
}


@pytest.mark.e2e
@pytest.mark.parametrize("sent", INVALID.values(), ids=INVALID.keys())
def test_an_invalid_traceparent_is_forwarded_and_logs_no_trace_id(
    proxy: Nginx, upstream: Upstream, sent: str
) -> None:
    assert traceparent.parse(sent) is None  # the app would not take it either
    request_id, _ = post(proxy, "/untraced", traceparent=sent)
    assert upstream.seen[request_id]["traceparent"] == sent
    assert proxy.access_entry(request_id)["trace_id"] == ""


@pytest.mark.e2e
@pytest.mark.parametrize("sent", INVALID.values(), ids=INVALID.keys())
def test_an_invalid_traceparent_logs_the_trace_the_app_started(
    proxy: Nginx, upstream: Upstream, sent: str
) -> None:
    request_id, _ = post(proxy, traceparent=sent)
    started = traceparent.trace_id_of(upstream.answered[request_id])
    assert started is not None
    assert started not in sent
    assert proxy.access_entry(request_id)["trace_id"] == started


@pytest.mark.e2e
def test_a_later_versions_traceparent_with_more_fields_is_taken(
    proxy: Nginx, upstream: Upstream
) -> None:
    sent = f"01-{TRACE_ID}-00f067aa0ba902b7-01-future"
    assert traceparent.trace_id_of(sent) == TRACE_ID
    request_id, _ = post(proxy, "/untraced", traceparent=sent)
    assert upstream.seen[request_id]["traceparent"] == sent
    assert proxy.access_entry(request_id)["trace_id"] == TRACE_ID


@pytest.mark.e2e
def test_an_upper_case_traceparent_logs_the_lower_case_id_the_app_uses(
    proxy: Nginx, upstream: Upstream
) -> None:
    # The app lowercases it (and logs that); nginx cannot, so it takes the app's answer.
    request_id, _ = post(proxy, traceparent=TRACEPARENT.upper())
    assert upstream.seen[request_id]["traceparent"] == TRACEPARENT.upper()
    assert proxy.access_entry(request_id)["trace_id"] == TRACE_ID


@pytest.mark.e2e
def test_the_access_line_with_a_trace_id_is_still_one_json_object(proxy: Nginx) -> None:
    request_id, _ = post(proxy, traceparent=TRACEPARENT)
    proxy.access_entry(request_id)  # waits for the line
    lines = [
        line
        for line in proxy.access_log.read_text().splitlines()
        if f'"request_id":"{request_id}"' in line
    ]
    assert len(lines) == 1
    assert json.loads(lines[0])["trace_id"] == TRACE_ID
