"""The payload tests' fixture: a real OTLP/HTTP receiver, for a traced request's event."""

from __future__ import annotations

from tests.otlp_receiver import otlp

__all__ = ["otlp"]
