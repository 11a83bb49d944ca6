"""What the server enforces, stated in its OpenAPI document (``openapi``): the API keys
as security schemes with a ``401`` on every operation that needs one, and the
characters a JSON string may hold as ``maxLength``.

A client generated from the document, or a fuzzer such as schemathesis, then
knows before it sends what the server would refuse.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from serving_core.web.guard import KEY_HEADER

# Every operation's key in a path item: its other keys are parameters and a summary.
METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})
SECURITY_SCHEMES = {
    "bearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "Authorization: Bearer <key>, a key of SERVING_API_KEYS or "
        "SERVING_API_KEYS_FILE",
    },
    "apiKey": {
        "type": "apiKey",
        "in": "header",
        "name": KEY_HEADER,
        "description": f"{KEY_HEADER}: <key>, the same keys as bearer's",
    },
}
# Either scheme passes: a list of alternatives, each one scheme.
SECURITY: list[dict[str, list[str]]] = [{"bearer": []}, {"apiKey": []}]

# The keywords whose values are schemas, a map of schemas, or a list of schemas.
_SCHEMA = (
    *("additionalProperties", "items", "contains", "propertyNames", "not"),
    *("if", "then", "else", "unevaluatedItems", "unevaluatedProperties"),
)
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")


def secure(document: dict[str, Any], open_paths: Iterable[str]) -> None:
    """Declare the API keys on ``document``: every operation needs one but those of
    ``open_paths`` (``web.guard``'s open and public paths), and answers ``401``
    without it, in its own protocol's error shape."""
    document["components"]["securitySchemes"] = SECURITY_SCHEMES
    document["security"] = SECURITY
    opened = frozenset(open_paths)
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method not in METHODS:
                continue
            if path in opened:
                operation["security"] = []
            else:
                operation["responses"]["401"] = _unauthorized(path)


def _unauthorized(path: str) -> dict[str, Any]:
    error = (
        "V2Error"
        if path.startswith("/v2")
        else "OpenAIError"
        if path.startswith("/v1")
        else "Error"
    )
    return {
        "description": "no API key, or not one this server accepts",
        "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}},
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{error}"}}},
    }


def bounded(schema: dict[str, Any], max_chars: int | None) -> dict[str, Any]:
    """A copy of ``schema`` whose every string, and every object's property names, is
    at most ``max_chars`` long (SERVING_MAX_STRING_CHARS refuses a longer one in a
    JSON body); ``schema`` itself when there is no limit."""
    if max_chars is None:
        return schema
    copied = copy.deepcopy(schema)
    _bound(copied, max_chars)
    return copied


def _bound(schema: Any, max_chars: int) -> None:
    if not isinstance(schema, dict):
        return
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "string" in kinds:
        schema["maxLength"] = min(schema.get("maxLength", max_chars), max_chars)
    if "object" in kinds:
        schema.setdefault("propertyNames", {})
    for keyword in _SCHEMA:
        _bound(schema.get(keyword), max_chars)
    if isinstance(schema.get("propertyNames"), dict):
        names = schema["propertyNames"]
        names["maxLength"] = min(names.get("maxLength", max_chars), max_chars)
    for keyword in _SCHEMA_MAPS:
        for sub in (schema.get(keyword) or {}).values():
            _bound(sub, max_chars)
    for keyword in _SCHEMA_LISTS:
        for sub in schema.get(keyword) or []:
            _bound(sub, max_chars)


def sse_events(data: dict[str, Any], description: str) -> dict[str, Any]:
    """The schema of one server-sent event whose ``data`` is JSON of the schema ``data``:
    what a client, or schemathesis, checks each event of a ``text/event-stream`` by."""
    return {
        "type": "object",
        "required": ["data"],
        "description": description,
        "properties": {
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": data,
            }
        },
    }


def tokens_bounded(schema: dict[str, Any], max_tokens: int | None) -> dict[str, Any]:
    """``schema`` with its ``max_tokens`` property, where it has one, from 1 to
    ``max_tokens`` (SERVING_MAX_TOKENS: a generating handler refuses more)."""
    asked = (schema.get("properties") or {}).get("max_tokens")
    if max_tokens is None or not isinstance(asked, dict):
        return schema
    least = max(asked.get("minimum", 1), 1)
    most = min(asked.get("maximum", max_tokens), max_tokens)
    properties = {
        **schema["properties"],
        "max_tokens": {**asked, "minimum": least, "maximum": most},
    }
    return {**schema, "properties": properties}
