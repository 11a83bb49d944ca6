"""A V2 inference request, from its JSON object and the binary data after it.

An input's ``parameters.binary_data_size`` (the binary tensor extension, what
tritonclient sends for ``binary_data=True``) takes that many bytes of the
binary part, in the inputs' order, instead of a JSON ``data``. An output
asks for binary data with ``parameters.binary_data``, or every output does
with the request's ``parameters.binary_data_output``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from serving_core.errors import BadRequest, quote
from serving_core.v2.tensors import Array, check_datatype, check_shape, from_json, from_raw

MAX_TENSORS = 256  # a request's inputs or outputs: more is a client bug, not a model


@dataclass(frozen=True)
class InferRequest:
    """What a front (REST, gRPC) decoded: the input tensors by name (datatype, array)."""

    inputs: dict[str, tuple[str, Array]]
    id: str | None = None
    # The outputs asked for, in order (None: all); and which go back as raw bytes.
    outputs: tuple[str, ...] | None = None
    binary_outputs: frozenset[str] = field(default_factory=frozenset)
    all_binary: bool = False
    # gRPC: the inputs came in typed ``contents``, not raw, and so go the outputs
    # (KServe's clients read an output's ``contents``; tritonclient sends and reads raw).
    typed: bool = False


def parse(body: Any, binary: bytes = b"") -> InferRequest:
    """The request of a decoded JSON ``body`` and the ``binary`` part after it."""
    if not isinstance(body, Mapping):
        raise BadRequest('the inference request must be a JSON object with "inputs"')
    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest(f'"id" must be a string, not {quote(request_id)}')
    parameters = _parameters("the request", body.get("parameters"))
    inputs = _list("inputs", body.get("inputs"), required=True)
    decoded: dict[str, tuple[str, Array]] = {}
    offset = 0
    for index, item in enumerate(inputs):
        name, datatype, shape, size = _header(index, item)
        if name in decoded:
            raise BadRequest(f"input {quote(name)} is given twice; send each input once")
        if size is None:
            array = from_json(name, datatype, shape, item.get("data"))
        else:
            if offset + size > len(binary):
                raise BadRequest(
                    f"input {quote(name)}: binary_data_size {size} runs past the "
                    f"{len(binary)} bytes after the JSON (Inference-Header-Content-Length)"
                )
            array = from_raw(name, datatype, shape, binary[offset : offset + size])
            offset += size
        decoded[name] = (datatype, array)
    if offset != len(binary):
        raise BadRequest(
            f"{len(binary) - offset} bytes after the JSON belong to no input; give each "
            "binary input its parameters.binary_data_size"
        )
    names, binary_names = None, set()
    if "outputs" in body:
        names = []
        for index, item in enumerate(_list("outputs", body["outputs"], required=False)):
            if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
                raise BadRequest(f'outputs[{index}] must be an object with a "name" string')
            names.append(item["name"])
            wanted = _parameters(f"output {quote(item['name'])}", item.get("parameters"))
            if _flag(wanted, "binary_data"):
                binary_names.add(item["name"])
    return InferRequest(
        decoded,
        request_id,
        None if names is None else tuple(names),
        frozenset(binary_names),
        _flag(parameters, "binary_data_output"),
    )


def _header(index: int, item: Any) -> tuple[str, str, tuple[int, ...], int | None]:
    if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
        raise BadRequest(
            f'inputs[{index}] must be an object with "name", "datatype", "shape" and "data"'
        )
    name = item["name"]
    datatype = check_datatype(name, item.get("datatype"))
    shape = check_shape(name, item.get("shape"))
    parameters = _parameters(f"input {quote(name)}", item.get("parameters"))
    size = parameters.get("binary_data_size")
    if size is None:
        if "data" not in item:
            raise BadRequest(
                f'input {quote(name)} has no "data" and no parameters.binary_data_size'
            )
        return name, datatype, shape, None
    if type(size) is not int or size < 0:
        raise BadRequest(f"input {quote(name)}: binary_data_size must be a byte count >= 0")
    if "data" in item:
        raise BadRequest(f'input {quote(name)} has both "data" and binary_data_size; send one')
    return name, datatype, shape, size


def _list(what: str, value: Any, *, required: bool) -> list[Any]:
    if not isinstance(value, list) or (required and not value) or len(value) > MAX_TENSORS:
        least = 1 if required else 0
        raise BadRequest(f'"{what}" must be an array of {least} to {MAX_TENSORS} tensors')
    return value


def _parameters(where: str, value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadRequest(f"{where}: parameters must be an object, not {quote(value)}")
    return value


def _flag(parameters: Mapping[str, Any], name: str) -> bool:
    value = parameters.get(name, False)
    if not isinstance(value, bool):
        raise BadRequest(f"parameter {name} must be true or false, not {quote(value)}")
    return value
