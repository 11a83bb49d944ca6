"""The request a handler is working for: its id and deadline, readable from any hook.

``current()`` in ``preprocess`` and ``postprocess`` (where the request runs);
``batch()`` in ``predict_batch`` (one context per item, in order). A handler
passes them downstream (a pipeline stage forwards ``X-Request-ID``, what
is left of the deadline and the ``traceparent``) or logs with them. Context variables, not
thread-locals: each greenlet of a gevent worker has its own.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from random import getrandbits

# A request id a client may choose (HTTP's X-Request-ID, a gRPC request's ``id``): one
# that cannot break a log line or a header. Any other is replaced by a new one.
REQUEST_ID_OK = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")


def new_request_id() -> str:
    """128 random bits as 32 hex digits, like ``uuid4().hex``.

    From ``random``'s generator, not ``os.urandom`` (a system call per
    request): an id names a request in logs and headers and guards nothing
    (job ids are ``uuid4``). ``random`` reseeds itself in every forked worker,
    so workers do not repeat each other's ids.
    """
    return f"{getrandbits(128):032x}"


def request_id_of(sent: str) -> str:
    """The id a client sent when ``REQUEST_ID_OK`` takes it, else a new one."""
    return sent if REQUEST_ID_OK.fullmatch(sent) else new_request_id()


@dataclass(frozen=True)
class Context:
    """One request: ``deadline`` is in ``time.monotonic()`` seconds, None for no deadline."""

    request_id: str
    deadline: float | None = None
    # The request's span as a W3C ``traceparent`` (None with traces off): a handler
    # sends it on to a service it calls, and the batch's span links to it.
    traceparent: str | None = None

    def remaining_s(self) -> float | None:
        """Seconds left before the deadline (never negative), None without one."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())


_current: ContextVar[Context | None] = ContextVar("serving_context", default=None)
_batch: ContextVar[Sequence[Context]] = ContextVar("serving_batch", default=())


def current() -> Context | None:
    """The request being pre- or post-processed; None outside a request."""
    return _current.get()


def batch() -> Sequence[Context]:
    """In ``predict_batch``: the items' requests, in the order of the items."""
    return _batch.get()


@contextmanager
def serving(context: Context) -> Iterator[None]:
    token = enter(context)
    try:
        yield
    finally:
        leave(token)


def enter(context: Context) -> Token[Context | None]:
    """``serving(context)`` without a context manager, for the per-request path:
    ``leave`` the token in a ``finally``."""
    return _current.set(context)


def leave(token: Token[Context | None]) -> None:
    _current.reset(token)


@contextmanager
def serving_batch(contexts: Sequence[Context]) -> Iterator[None]:
    token = _batch.set(contexts)
    try:
        yield
    finally:
        _batch.reset(token)
