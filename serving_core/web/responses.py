"""Every response is JSON; every error a request can end in goes through one funnel."""

from __future__ import annotations

import logging
import math
from typing import Any

from flask import Response, current_app, g, request
from flask_restful import Api
from werkzeug.exceptions import HTTPException

from serving_core import encoding
from serving_core.errors import QUOTE_CHARS, ServingError, shorten, too_large
from serving_core.openai import errors as openai_errors
from serving_core.web.incoming import REQUEST_ID

log = logging.getLogger("serving_core.web.responses")

JSON = "application/json"
# The app's config key for what a 404 adds: where the API is described, if it is.
ROUTES_HINT = "SERVING_ROUTES_HINT"
# The app's config key that says it serves OpenAI's API under /v1 (``openairoutes``).
OPENAI_ROUTES = "SERVING_OPENAI_ROUTES"
_HTTP_TYPES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
}


def is_v2(path: str) -> bool:
    """Whether ``path`` is the Open Inference Protocol's (``web/v2routes``)."""
    return path == "/v2" or path.startswith("/v2/")


def is_openai(path: str) -> bool:
    """Whether ``path`` is OpenAI's API (``web/openairoutes``), where the app serves it."""
    served = current_app.config.get(OPENAI_ROUTES, False)
    return bool(served) and (path == "/v1" or path.startswith("/v1/"))


class ErrorFunnelApi(Api):  # type: ignore[misc]
    def handle_error(self, e: Exception) -> Response:
        return error_response(e)


def json_response(data: Any, code: int, headers: Any = None) -> Response:
    """Flask-RESTful's representation of JSON, and ``/predict``'s response."""
    try:
        body = encoding.dumps(data)
    except TypeError as exc:
        request_id = g.get("request_id")
        log.error(
            "request %s: the handler's output is not JSON-serialisable: %s",
            request_id,
            exc,
            extra={"fields": {"request_id": request_id}},
        )
        return error_response(exc)
    # content_type, not mimetype: the same header (JSON takes no charset), without
    # werkzeug working it out again for every response.
    response = Response(body, status=code, content_type=JSON)
    if headers:
        if type(headers) is dict:
            # One add per header: ``extend`` walks any mapping through a generic
            # multi-item iterator, which costs more than one add per header.
            add = response.headers.add
            for name, value in headers.items():
                add(name, value)
        else:
            response.headers.extend(headers)
    return response


def error_response(exc: Exception) -> Response:
    """Every error a request can end in, as ``{"error": {"type", "message"}}``, or as
    ``{"error": "message"}`` under ``/v2``, or as OpenAI's ``{"error": {"message", "type",
    "param", "code"}}`` under ``/v1`` where the app serves OpenAI's API."""
    request_id = g.get("request_id", "-")
    headers: dict[str, str] = {}
    if isinstance(exc, ServingError):
        status, body = exc.status, exc.body()
        headers.update(exc.headers)
        if exc.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    elif isinstance(exc, HTTPException):
        status = exc.code or 500
        body = {
            "error": {
                "type": _HTTP_TYPES.get(status, "http_error"),
                "message": _http_message(exc, status),
            }
        }
        allow = exc.get_response().headers.get("Allow") if status == 405 else None
        if allow:
            headers["Allow"] = allow
    else:
        log.exception(
            "request %s failed with an unexpected error",
            request_id,
            extra={"fields": {"request_id": request_id}},
        )
        status = 500
        body = {
            "error": {
                "type": "internal_error",
                "message": f"internal error; the server log has the details under "
                f"request id {request_id}",
            }
        }
    if is_v2(request.path):
        body = {"error": body["error"]["message"]}  # the Open Inference Protocol's shape
    elif is_openai(request.path):
        param = exc.param if isinstance(exc, openai_errors.BadField) else None
        error = body["error"]
        body = openai_errors.body(status, error["message"], error["type"], param)
    response = Response(encoding.dumps(body), status=status, content_type=JSON)
    response.headers.update(headers)
    if request_id != "-":
        response.headers[REQUEST_ID] = request_id
    return response


def _http_message(exc: HTTPException, status: int) -> str:
    if status == 404:
        path = shorten(request.path, QUOTE_CHARS)
        return f"no route {path}{current_app.config.get(ROUTES_HINT, '')}"
    if status == 405:
        method, path = shorten(request.method, 16), shorten(request.path, QUOTE_CHARS)
        return f"{method} is not allowed on {path}"
    if status == 413:
        return too_large(current_app.config["MAX_CONTENT_LENGTH"])
    return exc.description or exc.name
