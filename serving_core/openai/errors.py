"""OpenAI's error object, ``{"error": {"message", "type", "param", "code"}}``, which the
``openai`` client reads into its exceptions (their ``body``, ``code`` and ``param``)."""

from __future__ import annotations

from typing import Any

from serving_core.errors import BadRequest, NotFound


class BadField(BadRequest):
    """A request field OpenAI's API would refuse; ``param`` names it."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.param = param


class ModelNotFound(NotFound):
    type = "model_not_found"


def body(status: int, message: str, code: str, param: str | None = None) -> dict[str, Any]:
    """The error object of a response of ``status``; ``code``: our error's stable type."""
    return {"error": {"message": message, "type": kind(status), "param": param, "code": code}}


def kind(status: int) -> str:
    """OpenAI's ``type`` for a status."""
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    if status < 500:
        return "invalid_request_error"
    return "server_error"
