"""W3C Trace Context's ``traceparent`` header: a span's ids as one string.

What crosses a process: a request's ``Context``, a job's record, a broker
message's headers and a model process's frames carry a span as this string,
so they know nothing of OpenTelemetry.
"""

from __future__ import annotations

import re

HEADER = "traceparent"
# version 00 (a later version's first four fields parse alike); an all-zero id is invalid.
_FORM = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


def parse(value: str | None) -> tuple[int, int, int] | None:
    """(trace id, span id, flags) of a valid ``traceparent``; None for anything else, which
    a receiver ignores (a new trace starts) rather than refuses."""
    if not value or len(value) > 512:
        return None
    match = _FORM.match(value.strip().lower())
    if match is None or match.group(1) == "ff" or (match.group(1) == "00" and match.group(5)):
        return None
    trace_id, span_id = int(match.group(2), 16), int(match.group(3), 16)
    if trace_id == 0 or span_id == 0:
        return None
    return trace_id, span_id, int(match.group(4), 16)


def form(trace_id: int, span_id: int, flags: int) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"


def trace_id_of(value: str | None) -> str | None:
    """The trace id's 32 hex digits, for a log line; None without a valid one."""
    ids = parse(value)
    return None if ids is None else f"{ids[0]:032x}"


def sampled(value: str | None) -> bool:
    ids = parse(value)
    return ids is not None and bool(ids[2] & 1)
