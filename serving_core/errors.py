"""Errors a request can end in, each with its HTTP status and a stable ``type``.

The HTTP layer turns any of these into ``{"error": {"type", "message"}}``;
nothing here imports Flask, so the batcher and the service raise them too.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import Any, ClassVar

QUOTE_CHARS = 80
# A bounded repr: a 1 MiB string or a deep structure costs no more than a short one.
_QUOTE = reprlib.Repr()
_QUOTE.maxstring = _QUOTE.maxother = QUOTE_CHARS
_QUOTE.maxlevel = 3


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters with an ellipsis: how an error
    message names a client's value without echoing all of it back."""
    text = _QUOTE.repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def too_large(max_body_bytes: int) -> str:
    """A body over the limit, whoever refuses it: the front door from its Content-Length,
    werkzeug while it reads one of unknown length."""
    return (
        f"the request body is larger than SERVING_MAX_BODY_BYTES={max_body_bytes} bytes "
        "allows; send less, or raise the setting"
    )


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


class ServingError(Exception):
    status: ClassVar[int] = 500
    type: ClassVar[str] = "internal_error"
    # Sent with the error response (the HTTP layer adds them).
    headers: ClassVar[Mapping[str, str]] = {}

    def __init__(
        self,
        message: str,
        *,
        details: Any = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"type": self.type, "message": self.message}
        if self.details is not None:
            error["details"] = self.details
        return {"error": error}

    def __reduce__(self) -> tuple[Any, ...]:
        # An exception pickles as ``type(self)(*self.args)`` by default, which drops
        # the keyword-only fields and cannot call an ``__init__`` that takes others
        # (Overloaded's reason, a handler's own subclass). Rebuilt as pickle rebuilds
        # any object instead: a bare instance, then every attribute, so an error
        # crosses the shared model process's socket as it was raised.
        return (_bare, (type(self), self.args), self.__dict__)


def _bare(cls: type[ServingError], args: tuple[Any, ...]) -> ServingError:
    return cls.__new__(cls, *args)


class BadRequest(ServingError):
    status = 400
    type = "bad_request"


class InvalidParams(BadRequest):
    type = "invalid_input"


class Unauthorized(ServingError):
    """No API key, or not one of SERVING_API_KEYS; the message never repeats what was sent."""

    status = 401
    type = "unauthorized"
    headers: ClassVar[Mapping[str, str]] = {"WWW-Authenticate": 'Bearer realm="serving-core"'}


class RequestTimeout(ServingError):
    """The request's body did not arrive in time (``SERVING_BODY_TIMEOUT_S``)."""

    status = 408
    type = "request_timeout"


class PayloadTooLarge(ServingError):
    """A body over SERVING_MAX_BODY_BYTES, refused from its Content-Length, unread."""

    status = 413
    type = "payload_too_large"


class UnsupportedMediaType(ServingError):
    status = 415
    type = "unsupported_media_type"


class Overloaded(ServingError):
    """Refused at admission: the queue is full or the deadline cannot be met."""

    status = 503
    type = "overloaded"

    def __init__(
        self, message: str, *, reason: str, retry_after_s: float, idle_late: bool = False
    ) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.reason = reason
        # Predicted late even with nothing queued: the deadline is shorter than a batch.
        self.idle_late = idle_late


class NotReady(ServingError):
    status = 503
    type = "not_ready"


class DeadlineExceeded(ServingError):
    status = 504
    type = "deadline_exceeded"


class BadGateway(ServingError):
    """A pipeline's required stage failed; the message names the stage."""

    status = 502
    type = "bad_gateway"


class ModelError(ServingError):
    """The handler failed; the message is generic, the log has the traceback."""

    status = 500
    type = "model_error"


class NotFound(ServingError):
    status = 404
    type = "not_found"


class Conflict(ServingError):
    status = 409
    type = "conflict"


class Unprocessable(ServingError):
    """Well-formed, but not acceptable as it stands (an idempotency key reused with
    other parameters)."""

    status = 422
    type = "unprocessable"


class TooManyRequests(ServingError):
    """The caller is over its own quota; Retry-After says when to try again."""

    status = 429
    type = "too_many_requests"


class HandlerError(Exception):
    """The handler cannot be served; the message says why and how to fix it.

    Not a ``ServingError``: it stops ``serve``, ``check``, ``batch`` and
    ``worker`` before anything is served. Here, below ``loading`` and
    ``pipeline``, so that both raise it without importing each other.
    """
