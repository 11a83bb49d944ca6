"""Turning traces on in one process: after fork, since the exporter's thread and
socket belong to the process that made them.

SERVING_TRACES chooses (``off``, the default, imports nothing); everything
else is OpenTelemetry's own variables, read by its SDK as every OTel user
expects: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) and
``..._HEADERS``, ``OTEL_TRACES_SAMPLER`` and its ``_ARG``,
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from serving_core.handler import Handler, handler_name, model_revision
from serving_core.settings import Settings
from serving_core.tracing.tracer import Tracer, install, tracer

DEFAULT_SERVICE = "serving-core"


def start_for(settings: Settings, handler: Handler) -> Tracer:
    """``start`` for a process that serves ``handler``: its spans say which model, and which
    revision of it (a canary's from the stable's)."""
    if settings.traces == "off":
        return tracer()
    resource = {
        "serving.model.name": handler_name(handler),
        "serving.model.version": handler.version,
        "serving.model.revision": model_revision(handler, settings.model_revision),
    }
    return start(settings.traces, {key: value for key, value in resource.items() if value})


def start(exporter: str, resource: Mapping[str, str]) -> Tracer:
    """Install this process's tracer for SERVING_TRACES=``exporter``; ``resource`` adds
    to OTEL_RESOURCE_ATTRIBUTES what serving-core knows (the model, its revision), which
    the variables override. ``off`` leaves tracing off."""
    if exporter == "off":
        return tracer()
    # Imported here only: a process with traces off never loads opentelemetry.
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )

    from serving_core.tracing.otel import OtelTracer

    ours = Resource({"service.name": DEFAULT_SERVICE, "process.pid": os.getpid(), **resource})
    # The variables' attributes win over ours: a chart's release name, a user's service.
    chosen = ours.merge(OTELResourceDetector().detect())
    provider = TracerProvider(resource=chosen)
    span_exporter: SpanExporter
    if exporter == "console":
        span_exporter = ConsoleSpanExporter(out=sys.stderr)  # beside the logs, as documented
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        span_exporter = OTLPSpanExporter()
    # Batched and bounded (OTEL_BSP_MAX_QUEUE_SIZE): a slow collector drops spans, it
    # never holds a request.
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    otel = OtelTracer(provider)
    install(otel)
    return otel


def stop() -> None:
    """Export what is queued and turn tracing off (a process's exit)."""
    install(Tracer()).shutdown()
