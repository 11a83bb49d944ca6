"""A real OTLP/HTTP receiver on 127.0.0.1 for the tracing tests.

No OpenTelemetry Collector installs from PyPI, Debian or npm: it is a Go
program, which here could only be built from the Go module proxy, a build of
hundreds of modules added to every CI run. So the tests receive what the
SDK's exporter sends over HTTP themselves: ``POST /v1/traces`` with an
``ExportTraceServiceRequest``, decoded with ``opentelemetry-proto``, the
collector's own message types. The spans are kept as plain ``Received``
records for the tests to assert on.
"""

from __future__ import annotations

import contextlib
import gzip
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanMessage

from tests.servers import wait_for

KINDS = {
    SpanMessage.SPAN_KIND_INTERNAL: "internal",
    SpanMessage.SPAN_KIND_SERVER: "server",
    SpanMessage.SPAN_KIND_CLIENT: "client",
    SpanMessage.SPAN_KIND_PRODUCER: "producer",
    SpanMessage.SPAN_KIND_CONSUMER: "consumer",
}


@dataclass(frozen=True)
class Received:
    """One span as the receiver decoded it; ids in lowercase hex."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a trace's root
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]  # (trace id, span id) of each linked span
    status: int  # 0 unset, 1 ok, 2 error
    resource: dict[str, Any] = field(repr=False, default_factory=dict)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(items: Any) -> dict[str, Any]:
    return {item.key: _value(item.value) for item in items}


def decode(body: bytes) -> list[Received]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope in resource_spans.scope_spans:
            for span in scope.spans:
                spans.append(
                    Received(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        kind=KINDS.get(span.kind, "unspecified"),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=_attributes(span.attributes),
                        links=tuple(
                            (link.trace_id.hex(), link.span_id.hex()) for link in span.links
                        ),
                        status=span.status.code,
                        resource=resource,
                    )
                )
    return spans


class Receiver:
    """What the server received; ``endpoint`` goes in ``OTEL_EXPORTER_OTLP_ENDPOINT``."""

    def __init__(self, port: int) -> None:
        self.endpoint = f"http://127.0.0.1:{port}"
        self._spans: list[Received] = []
        self._lock = threading.Lock()
        self.requests = 0

    def add(self, spans: list[Received]) -> None:
        with self._lock:
            self._spans.extend(spans)
            self.requests += 1

    def spans(self) -> list[Received]:
        with self._lock:
            return list(self._spans)

    def wait_for(
        self, found: Callable[[list[Received]], Any], what: str, timeout_s: float = 20.0
    ) -> Any:
        """Until ``found(spans)`` is true (the exporter sends in batches, every few
        seconds at most): its value; fails naming ``what`` and the spans so far."""
        return wait_for(
            lambda: found(self.spans()),
            lambda: f"{what}; received: {[(s.name, s.trace_id[:8]) for s in self.spans()]}",
            timeout_s,
        )

    def trace(self, trace_id: str) -> list[Received]:
        return [span for span in self.spans() if span.trace_id == trace_id]

    def named(self, name: str) -> list[Received]:
        return [span for span in self.spans() if span.name == name]


def _handler_for(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            receiver.add(decode(body))
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def otlp() -> Iterator[Receiver]:
    with receiving() as receiver:
        yield receiver


@contextlib.contextmanager
def receiving() -> Iterator[Receiver]:
    """A receiver on a free port for the block (the fixture's, and ``bench/cpu_path.py``'s)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(Receiver(0)))
    receiver = Receiver(server.server_address[1])
    server.RequestHandlerClass = _handler_for(receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


def tracing_env(receiver: Receiver, **more: str) -> dict[str, str]:
    """The variables that send a server's spans to ``receiver`` at once: a short
    batch delay, so a test waits for its spans a moment, not five seconds."""
    return {
        "SERVING_TRACES": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        **more,
    }


def waterfall(spans: list[Received], width: int = 40) -> str:
    """One trace's spans as text, a line each, children under their parent, each with
    its service, a bar where it ran within the trace, and its duration: what
    docs/observability.md shows from a real run."""
    if not spans:
        return ""
    start = min(s.start_ns for s in spans)
    total = max(max(s.end_ns for s in spans) - start, 1)
    ids = {s.span_id for s in spans}
    children: dict[str, list[Received]] = {}
    for span in sorted(spans, key=lambda s: s.start_ns):
        parent = span.parent_id if span.parent_id in ids else ""
        children.setdefault(parent, []).append(span)
    lines: list[str] = []

    def draw(span: Received, depth: int) -> None:
        first = round((span.start_ns - start) / total * width)
        last = max(first + 1, round((span.end_ns - start) / total * width))
        bar = " " * first + "█" * (last - first) + " " * (width - last)
        service = span.resource.get("serving.model.name", "")
        label = ("  " * depth + span.name)[:50]
        links = f"  ({len(span.links)} link{'s' * (len(span.links) != 1)})" if span.links else ""
        ms = (span.end_ns - span.start_ns) / 1e6
        lines.append(f"{label:<50} {service[:26]:<26} |{bar}| {ms:8.2f} ms{links}")
        for kid in children.get(span.span_id, []):
            draw(kid, depth + 1)

    for root in children.get("", []):
        draw(root, 0)
    return "\n".join(lines)
