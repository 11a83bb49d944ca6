"""The OpenAPI paths of V2's generate extension (``generateroutes``), added to the
service's document (``openapi``) for a text generator."""

from __future__ import annotations

from typing import Any

from serving_core.v2.model import Model
from serving_core.web.openapi import REQUEST_HEADERS, UNBOUNDED, Bounds, too_large
from serving_core.web.openapirules import bounded, sse_events, tokens_bounded
from serving_core.web.v2openapi import PARAMETERS, error_of, json_of, path_params, ref


def extend(document: dict[str, Any], model: Model, bounds: Bounds = UNBOUNDED) -> None:
    """Add the generate extension's routes to ``document`` (``openapi.document``'s)."""
    name, version = path_params(model)
    body = {
        "required": True,
        "content": {
            "application/json": {
                "schema": ref("V2GenerateRequest"),
                "example": {"text_input": "Once upon a time", "parameters": {"max_tokens": 16}},
            }
        },
    }
    errors = {
        "400": error_of("no text_input, or parameters the handler refuses"),
        "404": error_of("no such model or version"),
        "413": error_of(too_large(bounds)),
        "503": error_of("overloaded (see Retry-After) or not ready"),
        "504": error_of("no answer before the deadline"),
    }
    events = sse_events(
        {"anyOf": [ref("V2GenerateResponse"), ref("V2Error")]},
        "server-sent events: `data: {V2GenerateResponse}` per chunk, then one with "
        'finish_reason (stop or length); an error after the first chunk is a last `data: {"error": '
        '"..."}`',
    )
    paths = document["paths"]
    for path, parameters in (
        ("/v2/models/{name}", [name]),
        ("/v2/models/{name}/versions/{version}", [name, version]),
    ):
        paths[f"{path}/generate"] = {
            "parameters": parameters,
            "post": {
                "summary": f"Generate text with {model.name}: the whole output at once",
                "parameters": REQUEST_HEADERS,
                "requestBody": body,
                "responses": {
                    "200": json_of("the generated text", ref("V2GenerateResponse")),
                    **errors,
                },
            },
        }
        paths[f"{path}/generate_stream"] = {
            "parameters": parameters,
            "post": {
                "summary": f"Generate text with {model.name}, each chunk as it comes",
                "parameters": REQUEST_HEADERS,
                "requestBody": body,
                "responses": {
                    "200": {
                        "description": "one event per chunk",
                        "content": {"text/event-stream": {"schema": events}},
                    },
                    **errors,
                },
            },
        }
    document["components"]["schemas"].update(
        {
            "V2GenerateRequest": bounded(
                {
                    "type": "object",
                    "required": ["text_input"],
                    "properties": {
                        "text_input": {"type": "string", "description": "the prompt"},
                        "parameters": tokens_bounded(
                            {
                                **PARAMETERS,
                                "description": "the handler's parameters (max_tokens, "
                                "temperature...)",
                                "properties": {"max_tokens": {"type": "integer"}},
                            },
                            bounds.max_tokens,
                        ),
                    },
                },
                bounds.max_string_chars,
            ),
            "V2GenerateResponse": {
                "type": "object",
                "required": ["model_name", "model_version", "text_output"],
                "properties": {
                    "model_name": {"type": "string"},
                    "model_version": {"type": "string"},
                    "text_output": {"type": "string"},
                    "finish_reason": {"enum": ["stop", "length"]},
                },
            },
        }
    )
