"""Errors a request can end in, each with its HTTP status and a stable ``type``.

The HTTP layer turns any of these into ``{"error": {"type", "message"}}``;
nothing here imports Flask, so the batcher and the service raise them too.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ServingError(Exception):
    status: ClassVar[int] = 500
    type: ClassVar[str] = "internal_error"

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


class BadRequest(ServingError):
    status = 400
    type = "bad_request"


class InvalidParams(BadRequest):
    type = "invalid_input"


class UnsupportedMediaType(ServingError):
    status = 415
    type = "unsupported_media_type"


class Overloaded(ServingError):
    """Refused at admission: the queue is full or the deadline cannot be met."""

    status = 503
    type = "overloaded"

    def __init__(self, message: str, *, reason: str, retry_after_s: float) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.reason = reason


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
