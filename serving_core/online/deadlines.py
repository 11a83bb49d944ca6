"""A request's deadline, and what a client is told when its own cannot be met.

The deadline is the client's (``X-Request-Timeout``, a gRPC deadline), capped by
SERVING_REQUEST_TIMEOUT_S. When the client's own deadline is what fails (it
passed before the request reached the app, or it is shorter than one batch on
an idle model), the answer says so, a 504, rather than blaming a proxy or
promising a retry that cannot succeed (finding F6 of issue 42).
"""

from __future__ import annotations

import time

from serving_core.errors import DeadlineExceeded, Overloaded


def due(arrival: float | None, timeout_s: float | None, limit_s: float) -> float:
    """When a request that arrived at ``arrival`` is due: ``timeout_s``, capped by
    ``limit_s`` (SERVING_REQUEST_TIMEOUT_S)."""
    start = time.monotonic() if arrival is None else arrival
    return start + (limit_s if timeout_s is None else min(timeout_s, limit_s))


def _own(timeout_s: float | None, limit_s: float) -> bool:
    """Whether the deadline is the client's, not the server's cap."""
    return timeout_s is not None and timeout_s < limit_s


def passed(arrival: float, timeout_s: float | None, limit_s: float, now: float) -> DeadlineExceeded:
    """The refusal of a request already past its deadline when it reached the app."""
    if _own(timeout_s, limit_s):
        return DeadlineExceeded(
            f"this request's own deadline ({timeout_s:.4g} s, its X-Request-Timeout or gRPC "
            f"deadline) passed before reaching the app: it waited {now - arrival:.4f} s in "
            "front of it (a proxy or the server's connection queue); give it a longer one"
        )
    return DeadlineExceeded(
        f"the request waited {now - arrival:.3f} s before reaching the app (in a proxy "
        "or the server's connection queue), past its deadline; retry later"
    )


def as_heard(
    refusal: Overloaded, timeout_s: float | None, limit_s: float
) -> Overloaded | DeadlineExceeded:
    """Admission's refusal as the client should hear it: a 504 when its own deadline is
    shorter than one batch takes with nothing queued (no retry meets it), else the 503
    with its Retry-After."""
    if not (refusal.idle_late and _own(timeout_s, limit_s)):
        return refusal
    return DeadlineExceeded(
        f"this request's own deadline ({timeout_s:.4g} s, its X-Request-Timeout or gRPC "
        "deadline) is shorter than one batch of this model takes with nothing queued; "
        "give it a longer one"
    )
