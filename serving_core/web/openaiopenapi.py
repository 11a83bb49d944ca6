"""The OpenAPI paths of OpenAI's API (``openairoutes``), added to the service's document
(``openapi``) for a text generator."""

from __future__ import annotations

from typing import Any

from serving_core.web.openapi import REQUEST_HEADERS, UNBOUNDED, Bounds, too_large
from serving_core.web.openapirules import bounded

ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_SAMPLING: dict[str, dict[str, Any]] = {
    "max_tokens": {"type": ["integer", "null"], "minimum": 1},
    "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1},
    "temperature": {"type": ["number", "null"]},
    "top_p": {"type": ["number", "null"]},
    "stop": {"type": ["string", "array", "null"]},
    "seed": {"type": ["integer", "null"]},
    # One choice a request; null is the default's.
    "n": {"type": ["integer", "null"], "minimum": 1, "maximum": 1},
    "stream": {"type": ["boolean", "null"]},
    "stream_options": {
        "type": ["object", "null"],
        "properties": {"include_usage": {"type": "boolean"}},
    },
}
# Each event's data: a chunk or, after the first, an error, both JSON; then [DONE].
_STREAM = {
    "type": "object",
    "required": ["data"],
    "description": "with stream: true, server-sent events: `data: {chunk}` per chunk, the last "
    "with finish_reason, then `data: [DONE]`; an error after the first chunk is a last "
    '`data: {"error": {...}}`',
    "properties": {
        "data": {
            "type": "string",
            "anyOf": [
                {"const": "[DONE]"},
                {"contentMediaType": "application/json", "contentSchema": {"type": "object"}},
            ],
        }
    },
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": _ref("OpenAIError")}},
    }


def _create(summary: str, request: str, example: dict[str, Any], bounds: Bounds) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "parameters": REQUEST_HEADERS,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref(request), "example": example}},
            },
            "responses": {
                "200": {
                    "description": "the completion, or with stream: true its chunks",
                    "content": {
                        "application/json": {"schema": {"type": "object"}},
                        "text/event-stream": {"schema": _STREAM},
                    },
                },
                "400": _error("a field the API or the handler refuses (param names it)"),
                "404": _error("no such model (GET /v1/models lists it)"),
                "413": _error(too_large(bounds)),
                "503": _error("overloaded (see Retry-After) or not ready"),
                "504": _error("no answer before the deadline"),
            },
        }
    }


def extend(document: dict[str, Any], model: str, bounds: Bounds = UNBOUNDED) -> None:
    """Add OpenAI's routes to ``document`` (``openapi.document``'s); ``bounds``: the
    server's limits on a request."""
    listed = {
        "description": "the served model",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
    paths = document["paths"]
    paths["/v1/models"] = {"get": {"summary": "OpenAI: the models", "responses": {"200": listed}}}
    paths["/v1/models/{model}"] = {
        "parameters": [
            {"name": "model", "in": "path", "required": True, "schema": {"enum": [model]}}
        ],
        "get": {
            "summary": "OpenAI: one model",
            "responses": {"200": listed, "404": _error("no such model")},
        },
    }
    paths["/v1/completions"] = _create(
        f"OpenAI: complete a prompt with {model}",
        "OpenAICompletionRequest",
        {"model": model, "prompt": "Once upon a time", "max_tokens": 16},
        bounds,
    )
    paths["/v1/chat/completions"] = _create(
        f"OpenAI: answer a chat with {model}",
        "OpenAIChatRequest",
        {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16},
        bounds,
    )
    messages = {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "required": ["role"],
            "properties": {
                "role": {"type": "string"},
                # Text only: a string, or parts each {"type": "text", "text": ...}.
                "content": {
                    "type": ["string", "array", "null"],
                    "items": {
                        "type": "object",
                        "required": ["type", "text"],
                        "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                    },
                },
            },
        },
    }
    sampling = _SAMPLING
    if bounds.max_tokens is not None:
        # Either name is the generation's max_tokens (SERVING_MAX_TOKENS at most).
        most = {"maximum": bounds.max_tokens}
        sampling = {
            **_SAMPLING,
            "max_tokens": {**_SAMPLING["max_tokens"], **most},
            "max_completion_tokens": {**_SAMPLING["max_completion_tokens"], **most},
        }
    document["components"]["schemas"].update(
        {
            "OpenAIError": ERROR,
            "OpenAICompletionRequest": bounded(
                {
                    "type": "object",
                    "required": ["model", "prompt"],
                    "properties": {
                        "model": {"enum": [model]},
                        # One prompt, a string: token arrays and several prompts are refused.
                        "prompt": {"type": "string"},
                        **sampling,
                    },
                },
                bounds.max_string_chars,
            ),
            "OpenAIChatRequest": bounded(
                {
                    "type": "object",
                    "required": ["model", "messages"],
                    "properties": {"model": {"enum": [model]}, "messages": messages, **sampling},
                },
                bounds.max_string_chars,
            ),
        }
    )
