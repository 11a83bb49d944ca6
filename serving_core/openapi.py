"""The OpenAPI 3.1 document of a service, built from its handler's input schema.

Written by hand rather than with apispec: the API is five fixed routes, and
the only variable part, the request body, is the handler's JSON Schema, which
OpenAPI 3.1 takes as it is.
"""

from __future__ import annotations

from typing import Any

ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {
                "type": {"type": "string"},
                "message": {"type": "string"},
                "details": {"type": "array", "items": {"type": "object"}},
            },
        }
    },
}


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _json(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": schema or {"type": "object"}}},
    }


def document(name: str, version: str, input_schema: dict[str, Any] | None) -> dict[str, Any]:
    params = input_schema or {"type": "object"}
    predict = {
        "summary": f"Run {name} on one request",
        "description": (
            "The body's fields, merged with the query parameters (the body wins), "
            "are the handler's parameters."
        ),
        "parameters": [
            {"name": "X-Request-ID", "in": "header", "schema": {"type": "string"}},
            {
                "name": "X-Request-Timeout",
                "in": "header",
                "description": "seconds; can only shorten the server's deadline",
                "schema": {"type": "number", "exclusiveMinimum": 0},
            },
        ],
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": params},
                "application/x-www-form-urlencoded": {"schema": params},
                "multipart/form-data": {"schema": params},
            },
        },
        "responses": {
            "200": _json("the handler's output"),
            "400": _error("malformed body or invalid parameters"),
            "413": _error("body over SERVING_MAX_BODY_BYTES"),
            "415": _error("a body that is neither JSON nor a form"),
            "500": _error("the handler failed"),
            "503": _error("overloaded (see Retry-After) or not ready"),
            "504": _error("no answer before the deadline"),
        },
    }
    get = {"responses": {"200": _json("ok"), "503": _json("not ready")}}
    return {
        "openapi": "3.1.0",
        "info": {"title": name, "version": version},
        "paths": {
            "/predict": {"post": predict},
            "/healthz": {"get": {"summary": "alive", "responses": {"200": _json("alive")}}},
            "/readyz": {"get": {"summary": "ready to serve", **get}},
            "/metadata": {"get": {"summary": "handler and batching", **get}},
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "responses": {
                        "200": {
                            "description": "text exposition format",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
        },
        "components": {"schemas": {"Error": ERROR}},
    }
