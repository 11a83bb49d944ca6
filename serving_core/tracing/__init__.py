"""Traces: OpenTelemetry spans across every hop, off by default at no cost.

``tracer()`` is this process's ``Tracer``: ``Tracer`` itself (off: every call
returns at once and imports nothing) until ``start`` installs an
``otel.OtelTracer`` after fork. The only package that imports opentelemetry.
"""
