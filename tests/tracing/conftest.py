"""The tracing tests' fixture: a real OTLP/HTTP receiver (``tests.otlp_receiver``)."""

from __future__ import annotations

from tests.otlp_receiver import otlp

__all__ = ["otlp"]
