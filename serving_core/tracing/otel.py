"""``OtelTracer``: the tracer's surface over OpenTelemetry's SDK.

Imported only by ``setup.start``, so a process with traces off never loads
opentelemetry. The W3C propagator reads and writes ``traceparent`` and
``tracestate``; a ``Span`` wraps the SDK's span and converts
``time.monotonic()`` seconds to the wall-clock nanoseconds OTLP carries.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, MutableMapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from serving_core.tracing import traceparent
from serving_core.tracing.tracer import NO_SPAN, Attributes, AttributeValue, Kind, Span, Tracer

_KINDS = {
    "internal": SpanKind.INTERNAL,
    "server": SpanKind.SERVER,
    "client": SpanKind.CLIENT,
    "producer": SpanKind.PRODUCER,
    "consumer": SpanKind.CONSUMER,
}
_PROPAGATOR = TraceContextTextMapPropagator()


def _wall_ns(at: float | None) -> int | None:
    """Monotonic seconds as the epoch nanoseconds a span's times are in."""
    if at is None:
        return None
    return time.time_ns() - int((time.monotonic() - at) * 1e9)


def _span_context(value: str | None) -> trace.SpanContext | None:
    ids = traceparent.parse(value)
    if ids is None:
        return None
    return trace.SpanContext(ids[0], ids[1], is_remote=True, trace_flags=trace.TraceFlags(ids[2]))


def _recording(span: trace.Span) -> bool:
    """Whether children of ``span`` are kept: it is recorded, or there is none (a root)."""
    return span.is_recording() or not span.get_span_context().is_valid


class OtelSpan(Span):
    __slots__ = ("inner", "status")

    def __init__(self, inner: trace.Span) -> None:
        self.inner = inner
        self.status: int | None = None  # the request's outcome, once ``answered``

    @property
    def traceparent(self) -> str | None:
        ids = self.inner.get_span_context()
        return traceparent.form(ids.trace_id, ids.span_id, ids.trace_flags)

    @property
    def trace_id(self) -> str | None:
        return f"{self.inner.get_span_context().trace_id:032x}"

    def set(self, key: str, value: AttributeValue) -> None:
        self.inner.set_attribute(key, value)

    def fail(self, exc: BaseException) -> None:
        # An outcome already answered decides (a gRPC abort raises for a 400 too).
        status = self.status if self.status is not None else getattr(exc, "status", 500)
        self.inner.set_attribute("error.type", type(exc).__name__)
        if isinstance(status, int) and status < 500:
            return  # the client's fault (a 4xx): not the server's error, by OTel's rules
        self.inner.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
        self.inner.record_exception(exc)

    def answered(self, status: int) -> None:
        self.status = status
        self.inner.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.inner.set_status(Status(StatusCode.ERROR))

    def rename(self, name: str) -> None:
        self.inner.update_name(name)

    def end(self, at: float | None = None) -> None:
        self.inner.end(end_time=_wall_ns(at))


class OtelTracer(Tracer):
    enabled = True

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("serving_core")

    def start(
        self,
        name: str,
        *,
        parent: str | None = None,
        kind: Kind = "internal",
        links: Sequence[str | None] = (),
        attributes: Attributes | None = None,
        at: float | None = None,
    ) -> Span:
        context = None
        if parent is not None and (remote := _span_context(parent)) is not None:
            context = trace.set_span_in_context(trace.NonRecordingSpan(remote))
        elif kind != "server" and not _recording(trace.get_current_span()):
            # Under a span the sampler dropped: a child would be dropped too, and making
            # it costs as much as a kept one's start. A server span is still made, so
            # that its ids (and the drop) reach the services it calls.
            return NO_SPAN
        linked = [Link(found) for value in links if (found := _span_context(value)) is not None]
        inner = self._tracer.start_span(
            name,
            context=context,
            kind=_KINDS[kind],
            attributes=attributes,
            links=linked,
            start_time=_wall_ns(at),
        )
        return OtelSpan(inner)

    def current_in(self, span: Span, *, end: bool = True) -> AbstractContextManager[Span]:
        if not isinstance(span, OtelSpan):
            return nullcontext(span)  # a dropped span: its parent stays current
        return self._attached(span, end)

    @contextmanager
    def _attached(self, span: OtelSpan, end: bool) -> Iterator[Span]:
        token = otel_context.attach(trace.set_span_in_context(span.inner))
        try:
            yield span
        except BaseException as exc:
            span.fail(exc)
            raise
        finally:
            otel_context.detach(token)
            if end:
                span.end()

    def current(self) -> str | None:
        ids = trace.get_current_span().get_span_context()
        if not ids.is_valid:
            return None
        return traceparent.form(ids.trace_id, ids.span_id, ids.trace_flags)

    def inject(self, carrier: MutableMapping[str, str]) -> None:
        _PROPAGATOR.inject(carrier)

    def shutdown(self) -> None:
        self.provider.shutdown()
