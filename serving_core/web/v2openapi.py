"""The OpenAPI paths of the Open Inference Protocol (V2) routes (``v2routes``), added
to the service's document (``openapi``)."""

from __future__ import annotations

from typing import Any

from serving_core.v2.datatypes import DATATYPES
from serving_core.v2.model import Model
from serving_core.v2.request import MAX_TENSORS
from serving_core.v2.tensors import MAX_RANK
from serving_core.web.openapi import REQUEST_HEADERS, UNBOUNDED, Bounds, too_large
from serving_core.web.openapirules import bounded

ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
PARAMETERS = {"type": "object", "description": "key/value parameters"}
TENSOR: dict[str, Any] = {
    "type": "object",
    "required": ["name", "datatype", "shape"],
    "properties": {
        "name": {"type": "string"},
        "datatype": {"enum": list(DATATYPES)},
        "shape": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0},
            "description": "the first dimension is the batch: one row per handler request",
        },
        "parameters": {
            **PARAMETERS,
            "description": "binary_data_size: the tensor's bytes follow the JSON "
            "(Inference-Header-Content-Length), instead of data",
        },
        "data": {"type": "array", "description": "the elements, row-major, nested or flat"},
    },
}
METADATA_TENSOR = {
    "type": "object",
    "required": ["name", "datatype", "shape"],
    "properties": {
        "name": {"type": "string"},
        "datatype": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer"}},
    },
}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def json_of(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def error_of(description: str) -> dict[str, Any]:
    return json_of(description, ref("V2Error"))


def _get(summary: str, schema: dict[str, Any], *, not_found: bool = False) -> dict[str, Any]:
    responses = {"200": json_of("ok", schema)}
    if not_found:
        responses["404"] = error_of("no such model or version")
    return {"get": {"summary": summary, "responses": responses}}


def _ready(summary: str, *, not_found: bool = False) -> dict[str, Any]:
    operation = _get(summary, {"type": "object"}, not_found=not_found)
    operation["get"]["responses"]["503"] = json_of("not ready", {"type": "object"})
    return operation


def _input_tensor(max_rows: int | None) -> dict[str, Any]:
    """An input tensor as the server takes it: 1 to ``MAX_RANK`` dimensions, the first
    (the rows) at least 1 and at most ``max_rows`` (SERVING_MAX_QUEUE)."""
    rows: dict[str, Any] = {"type": "integer", "minimum": 1}
    if max_rows is not None:
        rows["maximum"] = max_rows
    shape = {
        **TENSOR["properties"]["shape"],
        "minItems": 1,
        "maxItems": MAX_RANK,
        "prefixItems": [rows],
    }
    size = {"type": "integer", "minimum": 0}
    binary = {"type": "object", "required": ["binary_data_size"]}
    return {
        **TENSOR,
        "properties": {
            **TENSOR["properties"],
            "shape": shape,
            "parameters": {
                **TENSOR["properties"]["parameters"],
                "properties": {"binary_data_size": size},
            },
        },
        # Its elements come as JSON data, or after the JSON with binary_data_size.
        "oneOf": [
            {"required": ["data"], "properties": {"parameters": {"not": binary}}},
            {
                "required": ["parameters"],
                "properties": {"parameters": binary},
                "not": {"required": ["data"]},
            },
        ],
    }


def _flags(*names: str) -> dict[str, Any]:
    """Parameters whose ``names`` are true or false (the binary extension's)."""
    return {**PARAMETERS, "properties": {name: {"type": "boolean"} for name in names}}


def _infer(model: Model, example: dict[str, Any] | None, bounds: Bounds) -> dict[str, Any]:
    body: dict[str, Any] = {"schema": ref("V2InferenceRequest")}
    inputs = _example_inputs(model, example)
    if inputs:
        body["example"] = {"inputs": inputs}
    output = {
        **TENSOR,
        "required": ["name", "datatype", "shape"],
        "description": "data, or with binary_data asked for, parameters.binary_data_size",
    }
    response = {
        "type": "object",
        "required": ["model_name", "outputs"],
        "properties": {
            "model_name": {"type": "string"},
            "model_version": {"type": "string"},
            "id": {"type": "string"},
            "outputs": {"type": "array", "items": output},
        },
    }
    return {
        "post": {
            "summary": f"Run {model.name} on a batch of tensors, one request per row",
            "description": "The Open Inference Protocol's inference, through the same "
            "batching, cache and admission as /predict. With the binary tensor extension, "
            "the body is Inference-Header-Content-Length bytes of JSON, then the binary inputs.",
            "parameters": REQUEST_HEADERS,
            "requestBody": {"required": True, "content": {"application/json": body}},
            "responses": {
                "200": {
                    **json_of("the output tensors", response),
                    "headers": {
                        "Inference-Header-Content-Length": {
                            "description": "with binary outputs: the JSON's length, the "
                            "outputs' bytes after it (application/octet-stream)",
                            "schema": {"type": "integer"},
                        }
                    },
                },
                "400": error_of("a bad tensor (named), or malformed JSON"),
                "404": error_of("no such model or version"),
                "413": error_of(too_large(bounds)),
                "500": error_of("the handler failed"),
                "503": error_of("overloaded (see Retry-After) or not ready"),
                "504": error_of("no answer before the deadline"),
            },
        }
    }


def _example_inputs(model: Model, example: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The handler's sample as tensors of one row, where the map carries its fields."""
    inputs = []
    for spec in model.tensors.inputs.values():
        value = (example or {}).get(spec.tensor.key)
        if value is None or spec.tensor.shape not in ((), (-1,)):
            continue
        shape = [1] if spec.tensor.shape == () else [1, len(value)]
        data = [value] if spec.tensor.shape == () else value
        inputs.append(
            {
                "name": spec.tensor.name,
                "datatype": spec.tensor.datatype,
                "shape": shape,
                "data": data,
            }
        )
    return inputs


def path_params(model: Model) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``{name}`` and ``{version}`` path parameters: this model's only."""
    name = {"name": "name", "in": "path", "required": True, "schema": {"enum": [model.name]}}
    version = {
        "name": "version",
        "in": "path",
        "required": True,
        "schema": {"enum": [model.version]},
    }
    return name, version


def extend(
    document: dict[str, Any],
    model: Model,
    example: dict[str, Any] | None,
    bounds: Bounds = UNBOUNDED,
    max_rows: int | None = None,
) -> None:
    """Add the V2 routes to ``document`` (``openapi.document``'s); ``bounds`` and
    ``max_rows`` (SERVING_MAX_QUEUE) are the server's limits on a request."""
    name, version = path_params(model)
    paths = document["paths"]
    paths["/v2"] = _get("V2 server metadata", ref("V2ServerMetadata"))
    paths["/v2/health/live"] = _get("V2: alive", {"type": "object"})
    paths["/v2/health/ready"] = _ready("V2: ready to serve")
    for path, parameters in (
        ("/v2/models/{name}", [name]),
        ("/v2/models/{name}/versions/{version}", [name, version]),
    ):
        paths[path] = _get("V2 model metadata", ref("V2ModelMetadata"), not_found=True)
        paths[f"{path}/ready"] = _ready("V2: the model is ready", not_found=True)
        paths[f"{path}/infer"] = _infer(model, example, bounds)
        for suffix in ("", "/ready", "/infer"):
            paths[path + suffix]["parameters"] = parameters
    document["components"]["schemas"].update(
        {
            "V2Error": ERROR,
            "V2ServerMetadata": {
                "type": "object",
                "required": ["name", "version", "extensions"],
                "properties": {
                    "name": {"type": "string"},
                    "version": {"type": "string"},
                    "extensions": {"type": "array", "items": {"type": "string"}},
                },
            },
            "V2ModelMetadata": {
                "type": "object",
                "required": ["name", "platform", "inputs", "outputs"],
                "properties": {
                    "name": {"type": "string"},
                    "versions": {"type": "array", "items": {"type": "string"}},
                    "platform": {"type": "string"},
                    "inputs": {"type": "array", "items": METADATA_TENSOR},
                    "outputs": {"type": "array", "items": METADATA_TENSOR},
                },
            },
            "V2InferenceRequest": bounded(
                {
                    "type": "object",
                    "required": ["inputs"],
                    "properties": {
                        "id": {"type": "string"},
                        "parameters": _flags("binary_data_output"),
                        "inputs": {
                            "type": "array",
                            "minItems": 1,
                            "maxItems": MAX_TENSORS,
                            "items": _input_tensor(max_rows),
                        },
                        "outputs": {
                            "type": "array",
                            "maxItems": MAX_TENSORS,
                            "items": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {
                                    "name": {"type": "string"},
                                    "parameters": _flags("binary_data"),
                                },
                            },
                        },
                    },
                },
                bounds.max_string_chars,
            ),
        }
    )
