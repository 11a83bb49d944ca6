"""The OpenAPI 3.1 document of a service, built from its handler's input schema.

Written by hand rather than with apispec: the API is a few fixed routes, and
the only variable part, the request body, is the handler's JSON Schema, which
OpenAPI 3.1 takes as it is.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from serving_core.context import REQUEST_ID_OK
from serving_core.web.openapirules import bounded, tokens_bounded


class Bounds(NamedTuple):
    """What the server refuses past, as the document states it: a body's bytes
    (SERVING_MAX_BODY_BYTES, a 413), a JSON string's or key's characters
    (SERVING_MAX_STRING_CHARS, a 400, as ``maxLength``) and a JSON body's depth
    (SERVING_MAX_JSON_DEPTH, a 400, which JSON Schema cannot bound: in words);
    ``None``: not stated."""

    max_body_bytes: int | None = None
    max_string_chars: int | None = None
    max_json_depth: int | None = None
    # A generating handler's SERVING_MAX_TOKENS, on its max_tokens parameter.
    max_tokens: int | None = None


UNBOUNDED = Bounds()

# The request headers every inference route takes (/predict, V2's infer).
REQUEST_HEADERS: list[dict[str, Any]] = [
    {"name": "X-Request-ID", "in": "header", "schema": {"type": "string"}},
    {
        "name": "X-Request-Timeout",
        "in": "header",
        "description": "seconds; can only shorten the server's deadline",
        "schema": {"type": "number", "exclusiveMinimum": 0},
    },
]

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


JOB = {
    "type": "object",
    "required": ["job_id", "status", "attempts", "created_at"],
    "properties": {
        "job_id": {"type": "string"},
        "status": {"enum": ["queued", "running", "done", "failed", "cancelled"]},
        "result": {"type": "object", "description": "the handler's output, once done"},
        "error": {"type": "object", "description": "the last error, once failed"},
        "attempts": {"type": "integer"},
        "created_at": {"type": "string", "format": "date-time", "description": "ISO 8601, UTC"},
        "started_at": {"type": ["string", "null"], "format": "date-time"},
        "finished_at": {"type": ["string", "null"], "format": "date-time"},
        "hint": {
            "type": "string",
            "description": "while queued: no `serving-core worker` has taken from its queue "
            "within SERVING_JOBS_LEASE_S, and which one to start",
        },
    },
}


def too_large(bounds: Bounds) -> str:
    """The ``413``'s description, with the limit where it is known."""
    limit = f" ({bounds.max_body_bytes} bytes here)" if bounds.max_body_bytes else ""
    return f"body over SERVING_MAX_BODY_BYTES{limit}"


def too_deep(bounds: Bounds) -> str:
    """A JSON body's depth limit, for a body's description."""
    if bounds.max_json_depth is None:
        return ""
    return (
        f" A JSON body nested deeper than {bounds.max_json_depth} levels "
        "(SERVING_MAX_JSON_DEPTH) is a 400."
    )


def _jobs(name: str, body: dict[str, Any], bounds: Bounds) -> dict[str, Any]:
    job_id = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
    job = {"$ref": "#/components/schemas/Job"}
    return {
        "/jobs": {
            "post": {
                "summary": f"Queue a request for {name}; poll its status_url for the result",
                "parameters": [
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "description": "a repeated submission with the same key returns "
                        "the same job",
                        "schema": {
                            "type": "string",
                            "pattern": f"^{REQUEST_ID_OK.pattern}$",
                        },
                    }
                ],
                "requestBody": body,
                "responses": {
                    "202": _json(
                        "queued; Location is the status URL",
                        {
                            "type": "object",
                            "required": ["job_id", "status_url"],
                            "properties": {
                                "job_id": {"type": "string"},
                                "status_url": {"type": "string"},
                            },
                        },
                    ),
                    "400": _error("malformed body or invalid parameters"),
                    "413": _error(too_large(bounds)),
                    "415": _error("a body that is neither JSON nor a form"),
                    "422": _error("Idempotency-Key reused with other parameters"),
                    "429": _error("this API key's unfinished jobs are at its quota"),
                    "503": _error("the job queue is full (see Retry-After)"),
                },
            }
        },
        "/jobs/{job_id}": {
            "get": {
                "summary": "A job's status, and its result once done",
                "parameters": [job_id],
                "responses": {
                    "200": _json("the job", job),
                    "404": _error("unknown, another API key's, or its result expired"),
                },
            },
            "delete": {
                "summary": "Cancel a queued job; it will never run",
                "parameters": [job_id],
                "responses": {
                    "200": _json("the cancelled job", job),
                    "404": _error("unknown, another API key's, or its result expired"),
                    "409": _error("already running or finished"),
                },
            },
        },
    }


def document(
    name: str,
    version: str,
    input_schema: dict[str, Any] | None,
    *,
    jobs: bool = False,
    example: dict[str, Any] | None = None,
    bounds: Bounds = UNBOUNDED,
) -> dict[str, Any]:
    """``example`` (the handler's ``sample.json``) becomes the JSON body's example,
    the body the docs page's "Try it out" starts from. ``bounds``: the server's
    limits, stated on the request bodies."""
    params = input_schema or {"type": "object"}
    schema = bounded(params, bounds.max_string_chars)
    json_body: dict[str, Any] = {"schema": schema}
    if example is not None:
        json_body["example"] = example
    body = {
        # No body is a request of the query string's parameters alone: one the
        # handler takes when its schema requires nothing.
        "required": bool(params.get("required")),
        "description": (
            "the handler's parameters, merged over the query string's. They may also come "
            "as a form (application/x-www-form-urlencoded or multipart/form-data), each "
            "field a string and each file its bytes; the handler's schema then applies to "
            "those, which is why only JSON is described here." + too_deep(bounds)
        ),
        "content": {"application/json": json_body},
    }
    # /predict refuses a max_tokens past SERVING_MAX_TOKENS before it runs.
    predict_json = {**json_body, "schema": tokens_bounded(schema, bounds.max_tokens)}
    predict_body = {**body, "content": {"application/json": predict_json}}
    predict = {
        "summary": f"Run {name} on one request",
        "description": (
            "The body's fields, merged with the query parameters (the body wins), "
            "are the handler's parameters."
        ),
        "parameters": REQUEST_HEADERS,
        "requestBody": predict_body,
        "responses": {
            "200": {
                **_json("the handler's output"),
                "headers": {
                    "X-Cache": {
                        "description": (
                            "how the inference cache served it: hit, miss or coalesced (an "
                            "identical request's model call); sent only with "
                            "SERVING_CACHE_HEADER=true. Without SERVING_CACHE_URL the "
                            "cache is each worker's own, so a repeated request misses once "
                            "per worker"
                        ),
                        "schema": {"enum": ["hit", "miss", "coalesced"]},
                    }
                },
            },
            "400": _error("malformed body or invalid parameters"),
            "413": _error(too_large(bounds)),
            "415": _error("a body that is neither JSON nor a form"),
            "500": _error("the handler failed"),
            "503": _error("overloaded (see Retry-After) or not ready"),
            "504": _error("no answer before the deadline"),
        },
    }
    get = {"responses": {"200": _json("ok"), "503": _json("not ready")}}
    document: dict[str, Any] = {
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
    if jobs:
        # A job's max_tokens is checked when it runs (a failed job), not when it is queued.
        document["paths"].update(_jobs(name, body, bounds))
        document["components"]["schemas"]["Job"] = JOB
    return document
