"""The tracer every layer calls, and the span it hands back.

``Tracer`` is tracing off: each method returns at once (a shared ``Span``
that does nothing), so a request with traces off pays a few attribute
lookups. ``otel.OtelTracer`` is the same surface over OpenTelemetry's SDK.

A span's parent is given as a ``traceparent`` string (``parent=``): another
process's span (a client's header, a job's record, a message's headers, a
request's ``Context``). Without one, the span is a child of the span current
in this context (``span`` makes a span current while its block runs), or a
new trace's root. Times are ``time.monotonic()`` seconds, as the rest of
serving-core keeps them (``at=``), for the spans drawn after the fact: the
queue wait, known once the batch has run.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Literal

from serving_core.tracing import traceparent

AttributeValue = str | bool | int | float
Attributes = Mapping[str, AttributeValue]
Kind = Literal["internal", "server", "client", "producer", "consumer"]


class Span:
    """A span that records nothing: what ``Tracer`` hands out with tracing off."""

    __slots__ = ()

    @property
    def traceparent(self) -> str | None:
        """This span as a ``traceparent``: for a child in another process, or a link."""
        return None

    @property
    def trace_id(self) -> str | None:
        return None

    def set(self, key: str, value: AttributeValue) -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        """The span ends in ``exc``: an error unless it is the client's (a 4xx)."""

    def answered(self, status: int) -> None:
        """The request's HTTP status: a 5xx is the server's error, by OTel's rules."""

    def rename(self, name: str) -> None:
        """Its name once known (a route, matched after the span began)."""

    def end(self, at: float | None = None) -> None:
        pass


NO_SPAN = Span()
_NO_SPAN_BLOCK: AbstractContextManager[Span] = nullcontext(NO_SPAN)


class Tracer:
    """Tracing off. ``tracer()`` returns this until ``setup.start`` installs another."""

    enabled = False

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
        """A span begun at ``at`` (now by default), not current: ``end`` it."""
        return NO_SPAN

    def span(
        self,
        name: str,
        *,
        parent: str | None = None,
        kind: Kind = "internal",
        links: Sequence[str | None] = (),
        attributes: Attributes | None = None,
        at: float | None = None,
    ) -> AbstractContextManager[Span]:
        """``start``, current while the block runs, ended (failed by what it raises) after."""
        if not self.enabled:
            return _NO_SPAN_BLOCK
        started = self.start(
            name, parent=parent, kind=kind, links=links, attributes=attributes, at=at
        )
        return self.current_in(started)

    def batch_span(
        self, name: str, members: Iterable[str | None], attributes: Attributes | None = None
    ) -> AbstractContextManager[Span]:
        """A span for work done for several spans at once (a batch of requests), linked to
        each of ``members`` once. Its parent is the first sampled member, so the sampler
        keeps it whenever it keeps one of them, and a viewer draws it in that trace; none
        sampled (or none traced: a warm-up), no span, since nobody would keep it.
        ``members`` is read only with traces on."""
        if not self.enabled:
            return _NO_SPAN_BLOCK
        linked = list(dict.fromkeys(members))  # a chunk's records share their chunk's span
        parent = next((member for member in linked if traceparent.sampled(member)), None)
        if parent is None:
            return _NO_SPAN_BLOCK
        return self.span(name, parent=parent, links=linked, attributes=attributes)

    def current_in(self, span: Span, *, end: bool = True) -> AbstractContextManager[Span]:
        """``span`` current for a block, failed by what it raises, then ended unless not
        ``end`` (a span that outlives the block). A tracer that records overrides it."""
        return nullcontext(span)

    def current(self) -> str | None:
        """The current span as a ``traceparent``: what to send to the next process."""
        return None

    def inject(self, carrier: MutableMapping[str, str]) -> None:
        """Add the current span's ``traceparent`` (and ``tracestate``) to outgoing headers."""

    def shutdown(self) -> None:
        """Export what is left (a process that exits)."""


_tracer: list[Tracer] = [Tracer()]


def tracer() -> Tracer:
    """This process's tracer: off until ``setup.start``."""
    return _tracer[0]


def install(chosen: Tracer) -> Tracer:
    """Make ``chosen`` this process's tracer; returns the one it replaces."""
    previous, _tracer[0] = _tracer[0], chosen
    return previous


@contextmanager
def installed(chosen: Tracer) -> Iterator[Tracer]:
    """``chosen`` for the block (tests, a pool's child), then the previous one again."""
    previous = install(chosen)
    try:
        yield chosen
    finally:
        install(previous)


def log_fields() -> dict[str, str]:
    """The current span's ids for a JSON log line (``logs.configure``'s ``context``):
    a line logged while a request runs names its trace. Empty with traces off."""
    current = _tracer[0].current()
    if current is None:
        return {}
    return {"trace_id": current[3:35], "span_id": current[36:52]}
